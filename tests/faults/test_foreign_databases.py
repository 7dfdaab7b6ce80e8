"""Databases that are not archsearch's, or not reachable as given: a symlink loop, another
application's SQLite file with an `archsearch_meta` table of its own, a URL that does not parse,
and a database another process keeps locked while a command opens it. Each ends in one line with
the right exit code, and a file that is refused is left byte for byte as it was."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.storage import Storage, StorageError
from archsearch.storage import db as db_module
from tests.faults.test_inputs import _one_line
from tests.faults.test_storage_failures import HOLDER
from tests.storage.test_query import fill_study


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_symlink_loop_as_the_database_is_one_line(tmp_path):
    (tmp_path / "a.db").symlink_to(tmp_path / "b.db")
    (tmp_path / "b.db").symlink_to(tmp_path / "a.db")
    with pytest.raises(StorageError, match="unable to open database file"):
        Storage.open(f"sqlite:///{tmp_path / 'a.db'}")


FOREIGN = {
    "other-columns": (
        "CREATE TABLE archsearch_meta (x INTEGER, y TEXT)",
        "INSERT INTO archsearch_meta VALUES (1, 'a')",
    ),
    "version-not-a-number": (
        "CREATE TABLE archsearch_meta (key TEXT PRIMARY KEY, value TEXT)",
        "INSERT INTO archsearch_meta VALUES ('schema_version', 'oops')",
    ),
}


@pytest.mark.parametrize("read_only", [False, True], ids=["writer", "reader"])
@pytest.mark.parametrize("statements", FOREIGN.values(), ids=FOREIGN.keys())
def test_another_application_s_database_is_refused_and_left_as_it_was(tmp_path, statements, read_only):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()
    before = _digest(path)
    with pytest.raises(StorageError, match=r"no archsearch database|no such column") as info:
        Storage.open(f"sqlite:///{path}", read_only=read_only)
    assert "\n" not in str(info.value)
    assert _digest(path) == before  # its journal mode too: a writer used to switch it to WAL first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def test_a_new_database_is_still_made_in_wal_mode(tmp_path):
    path = tmp_path / "trials.db"
    Storage.open(f"sqlite:///{path}").close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_a_url_whose_port_is_not_a_number_is_one_line_without_the_password():
    with pytest.raises(StorageError, match="not a database URL") as info:
        Storage.open("postgresql+psycopg://user:secret@127.0.0.1:notaport/db")
    assert "secret" not in str(info.value)


@pytest.mark.parametrize(
    "command", [["validate", "--study", "s"], ["ladder", "--study", "s", "--trial", "0"]]
)
def test_a_lock_held_past_the_bound_when_a_command_opens_the_database_is_exit_1(
    tmp_path, monkeypatch, command
):
    monkeypatch.setattr(db_module, "BUSY_TIMEOUT_S", 1)  # read when an engine connects
    path, release = tmp_path / "trials.db", tmp_path / "release"
    url = f"sqlite:///{path}"
    with Storage.open(url) as db:
        fill_study(db)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), str(release)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        result = CliRunner().invoke(app, [*command, "--storage", url])
    finally:
        release.touch()
        holder.wait(timeout=60)
    line = _one_line(result, 1, "database is locked")
    assert line.endswith("(another process held its lock for more than 1 s)"), line
