"""The lock that serialises creating a SQLite database's tables between processes."""

from __future__ import annotations

import multiprocessing
import tempfile
import time
from pathlib import Path

from archsearch.storage import Storage
from archsearch.storage.core import _lock_file


def _hold(path: str, log: str, rounds: int) -> None:
    for _ in range(rounds):
        with _lock_file(Path(path)):
            with open(log, "a") as f:
                f.write("in\n")
            time.sleep(0.01)
            with open(log, "a") as f:
                f.write("out\n")


def test_the_lock_excludes_other_processes_and_leaves_no_file(tmp_path):
    # Each holder removes the file before letting go: a waiter on the removed file must notice and
    # take the lock afresh, or two processes would hold locks on two different files at once.
    lock, log = tmp_path / "x.lock", tmp_path / "log"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hold, args=(str(lock), str(log), 20)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert log.read_text() == "in\nout\n" * 80  # never two "in" in a row
    assert not lock.exists()


def test_opening_a_sqlite_database_leaves_no_lock_file_in_the_temp_folder(tmp_path, monkeypatch):
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    with Storage.open(f"sqlite:///{tmp_path / 'trials.db'}") as storage:
        storage.optuna_storage()
    assert list(temp.iterdir()) == []
