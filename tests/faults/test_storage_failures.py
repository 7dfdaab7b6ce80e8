"""A database that fails under a search: while a trial's outcome is written (archsearch's writes
and Optuna's `tell`), while Optuna asks for a trial, with the SQLite write lock held by another
process past the timeout, and with a PostgreSQL database that stops taking connections.

Each ends the driver with one error naming the database, what was being done and the cause;
nothing is left half-written, and `--resume` reaches exactly N.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from ray import cloudpickle  # Ray vendors it
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from archsearch.search.driver import SearchError, SearchOptions, run_search
from archsearch.storage import Storage, StorageUnavailableError
from archsearch.storage import engine as engine_module
from tests import helpers
from tests.helpers import N, failure_message, instant, resume_search, settled
from tests.specs import tiny_spec

# Ray workers need not import tests/: this module's functions and the helpers' go by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(helpers)
pytestmark = pytest.mark.usefixtures("ray_session")


def _disk_full() -> OperationalError:
    """What SQLAlchemy raises when SQLite's disk fills under a statement."""
    return OperationalError(
        "UPDATE archsearch_trials ...", {}, sqlite3.OperationalError("database or disk is full")
    )


# --- injected errors, on both backends ---------------------------------------------------------------
def test_archsearch_s_write_of_an_outcome_fails_the_trial_is_re_queued(backend_url, monkeypatch):
    original, calls = Storage.finish_trial, []

    def finish_trial(self, trial_id, outcome):
        calls.append(trial_id)
        if len(calls) == 2:  # the second trained trial's outcome
            with self._session():  # the error inside archsearch's one session helper
                raise _disk_full()
        return original(self, trial_id, outcome)

    monkeypatch.setattr(Storage, "finish_trial", finish_trial)
    with Storage.open(backend_url) as db, pytest.raises(StorageUnavailableError) as info:
        run_search(tiny_spec(), db, SearchOptions(study="s", trials=N), evaluate_fn=instant)
    message = str(info.value)
    assert re.match(
        failure_message(backend_url, r"recording trial \d+", "OperationalError: database or disk is full"),
        message,
    )
    assert "\n" not in message and "left running" not in message  # the database took the re-queue
    with Storage.open(backend_url) as db:
        lost = [r for r in db.trials("s") if r.id == calls[1]]
        assert lost[0].status == "interrupted" and db.counts("s").get("complete") == 1
    monkeypatch.setattr(Storage, "finish_trial", original)
    resume_search(backend_url)
    with Storage.open(backend_url) as db:  # the re-queued point ran first
        after = [r for r in db.trials("s") if r.number is not None and r.number > lost[0].number]
        assert after[0].params == lost[0].params and after[0].status == "complete"


def _optuna_failure(method: str, monkeypatch, when) -> None:
    """Optuna's RDB storage raising as it does when the database fails under it."""
    original = getattr(optuna.storages.RDBStorage, method)

    def failing(self, *args, **kwargs):
        if when(*args, **kwargs):
            try:
                raise _disk_full()
            except OperationalError as exc:  # Optuna's own wrapping (`_create_scoped_session`)
                raise optuna.exceptions.StorageInternalError(
                    "An exception is raised during the commit."
                ) from exc
        return original(self, *args, **kwargs)

    monkeypatch.setattr(optuna.storages.RDBStorage, method, failing)


def test_optuna_s_tell_fails_after_the_outcome_landed_the_resume_tells_it(backend_url, monkeypatch):
    fired = []

    def when(trial_id, state, values=None):
        fired.extend([trial_id] if state == optuna.trial.TrialState.COMPLETE else [])
        return len(fired) == 2 and fired[-1] == trial_id  # the second complete trial, once

    _optuna_failure("set_trial_state_values", monkeypatch, when)
    with Storage.open(backend_url) as db, pytest.raises(StorageUnavailableError) as info:
        run_search(tiny_spec(), db, SearchOptions(study="s", trials=N), evaluate_fn=instant)
    assert re.match(
        failure_message(backend_url, r"recording trial \d+", "OperationalError: database or disk is full"),
        str(info.value),
    )
    with Storage.open(backend_url) as db:  # the outcome is in the database: nothing to re-run
        assert db.counts("s").get("complete") == 2 and "running" not in db.counts("s")
    monkeypatch.undo()
    resume_search(backend_url)
    study = optuna.load_study(study_name="s", storage=backend_url)
    assert sorted(t.state.name for t in study.trials if t.state.name != "PRUNED") == ["COMPLETE"] * N


def test_optuna_s_ask_fails_the_claimed_slot_is_closed(backend_url, monkeypatch):
    calls = []
    _optuna_failure("_create_new_trial", monkeypatch, lambda *a, **k: calls.append(a) or len(calls) == 2)
    with Storage.open(backend_url) as db, pytest.raises(StorageUnavailableError) as info:
        run_search(tiny_spec(), db, SearchOptions(study="s", trials=N), evaluate_fn=instant)
    assert re.match(
        failure_message(
            backend_url, "asking Optuna for a trial", "OperationalError: database or disk is full"
        ),
        str(info.value),
    )
    with Storage.open(backend_url) as db:
        assert [r.status for r in db.trials("s")] == ["complete", "interrupted"]
    monkeypatch.undo()
    resume_search(backend_url)


# --- real failures --------------------------------------------------------------------------------------
HOLDER = """
import os, sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")  # the write lock, until the release file appears
print("locked", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
conn.execute("ROLLBACK")
"""


def test_the_sqlite_write_lock_held_by_another_process_past_the_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_module, "BUSY_TIMEOUT_S", 1)  # read when an engine connects
    path, release, marker = tmp_path / "trials.db", tmp_path / "release", tmp_path / "locked-once"
    url = f"sqlite:///{path}"

    def lock_then_finish(request, known=None, board=None):
        if request.number >= 1 and not marker.exists():
            marker.touch()
            holder = subprocess.Popen(
                [sys.executable, "-c", HOLDER, str(path), str(release)], stdout=subprocess.PIPE, text=True
            )
            assert holder.stdout.readline().strip() == "locked"  # held before the outcome returns
        return instant(request)

    with Storage.open(url) as db, pytest.raises(StorageUnavailableError) as info:
        run_search(
            tiny_spec(), db, SearchOptions(study="s", trials=N, lease_s=2), evaluate_fn=lock_then_finish
        )
    message = str(info.value)
    doing = r"(recording trial \d+|renewing the running trials' leases)"  # whichever writes first
    assert re.match(failure_message(url, doing, "OperationalError: database is locked"), message), message
    assert re.search(
        r"; trial \d+ left running until the lease expires \(2 s\), then a resume re-queues them$", message
    )
    release.touch()
    _wait_for_write_lock(path)
    resume_search(url, lease_s=2)


def _wait_for_write_lock(path: Path, timeout: float = 60) -> None:
    """Until this process can take the SQLite write lock (the holder has let it go)."""
    deadline = time.monotonic() + timeout
    while True:
        conn = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
        finally:
            conn.close()


def test_a_postgresql_database_that_stops_taking_connections_mid_search(monkeypatch):
    from tests.postgres import postgres_database

    with postgres_database() as url:
        name = make_url(url).database
        marker = Path(f"/tmp/{name}.closed")  # the worker closes the database once

        def close_database_then_finish(request, known=None, board=None):
            if request.number >= 1 and not marker.exists():
                import psycopg

                marker.touch()
                with psycopg.connect(
                    "host=127.0.0.1 user=postgres dbname=postgres", autocommit=True
                ) as admin:
                    admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
                    admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
                    )
            return instant(request)

        try:
            with Storage.open(url) as db, pytest.raises(StorageUnavailableError) as info:
                options = SearchOptions(study="s", trials=N, lease_s=2)
                run_search(tiny_spec(), db, options, evaluate_fn=close_database_then_finish)
            message = str(info.value)
            assert re.match(
                failure_message(
                    url, r"[a-z0-9' ]+", "OperationalError: .*is not currently accepting connections"
                ),
                message,
            ), message
            assert "\n" not in message and "left running until the lease expires (2 s)" in message
        finally:
            import psycopg

            with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as admin:
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            marker.unlink(missing_ok=True)
        resume_search(url, lease_s=2)


# --- the study's own state ---------------------------------------------------------------------------
def test_a_failed_study_creation_leaves_no_study_and_a_plain_rerun_runs(backend_url, monkeypatch):
    _optuna_failure("create_new_study", monkeypatch, lambda *a, **k: True)  # a full disk, say
    with Storage.open(backend_url) as db, pytest.raises(StorageUnavailableError) as info:
        run_search(tiny_spec(), db, SearchOptions(study="s", trials=N), evaluate_fn=instant)
    assert re.match(
        failure_message(backend_url, "opening the study", "OperationalError: database or disk is full"),
        str(info.value),
    )
    monkeypatch.undo()
    with Storage.open(backend_url) as db:
        assert db.study_names() == [] and db.optuna_objectives("s") is None
        run_search(tiny_spec(), db, SearchOptions(study="s", trials=N), evaluate_fn=instant)  # no --resume
    settled(backend_url, N)


def test_a_foreign_optuna_study_of_the_same_name_is_never_adopted(backend_url):
    with Storage.open(backend_url) as db:
        optuna.create_study(study_name="s", storage=db.optuna_storage(), directions=["minimize"] * 3)
        with pytest.raises(SearchError, match=r"holds an Optuna study 's' that archsearch did not create"):
            run_search(tiny_spec(), db, SearchOptions(study="s", trials=N, resume=True), evaluate_fn=instant)
        assert db.study_names() == [] and db.optuna_objectives("s") == 3  # nothing created, nothing changed
