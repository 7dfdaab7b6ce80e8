"""A command that only reads never modifies the database file: every reading command, on a SQLite
study database as a search leaves it (WAL, closed), in the rollback-journal mode another tool may
have put it in (a read-write open used to switch it to WAL, rewriting its header), with a WAL a
stopped writer left beside it (a read-write connection closing last used to fold it into the
file), and at an older schema version (a reader used to upgrade it in place)."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.storage import Storage
from tests.storage.test_query import fill_study

READERS = {
    "studies": ["studies"],
    "trials": ["trials", "--study", "s"],
    "trials-csv": ["trials", "--study", "s", "--format", "csv"],
    "pareto": ["pareto", "--study", "s"],
    "pareto-json": ["pareto", "--study", "s", "--json"],
    "export": ["export", "--study", "s", "--trial", "0", "--format", "json", "-o", "{out}/export"],
    "report": ["report", "--study", "s", "-o", "{out}/report.html"],
    "cost": ["cost", "--study", "s", "--trial", "0"],
}


def _state(path: Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def _folder(folder: Path) -> dict[str, tuple[str, int]]:
    return {p.name: _state(p) for p in sorted(folder.iterdir())}


@pytest.fixture
def database(tmp_path) -> Path:
    """A study database as a search leaves it: WAL mode, every connection closed."""
    folder = tmp_path / "db"
    folder.mkdir()
    path = folder / "trials.db"
    with Storage.open(f"sqlite:///{path}") as db:
        fill_study(db)
    assert sorted(p.name for p in folder.iterdir()) == ["trials.db"]
    return path


def _read(path: Path, args: list[str], out: Path):
    out.mkdir(exist_ok=True)
    filled = [a.format(out=out) for a in args]
    return CliRunner().invoke(app, [*filled, "--storage", f"sqlite:///{path}"])


def _journal_mode(path: Path) -> str:
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        conn.close()


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_a_reading_command_leaves_the_database_file_as_it_was(database, tmp_path, reader, journal):
    if journal == "delete":  # as another tool (the sqlite3 shell, a backup) may leave it
        conn = sqlite3.connect(database)
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.close()
    before = _folder(database.parent)
    result = _read(database, READERS[reader], tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert _folder(database.parent) == before  # the file's bytes and mtime; no -wal or -shm left
    assert _journal_mode(database) == journal


WRITER_STOPS = """
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA wal_autocheckpoint = 0")
conn.execute("UPDATE archsearch_trials SET reason = 'written by a writer that then died'")
os._exit(0)  # no close: the WAL keeps the write, un-checkpointed, as after a SIGKILL
"""


@pytest.mark.parametrize("reader", ["studies", "trials-csv", "pareto"])
def test_a_wal_left_by_a_stopped_writer_is_read_and_not_folded_into_the_file(database, tmp_path, reader):
    subprocess.run([sys.executable, "-c", WRITER_STOPS, str(database)], check=True)
    wal = database.with_name("trials.db-wal")
    assert wal.stat().st_size > 0
    before, wal_before = _state(database), _state(wal)
    result = _read(database, READERS[reader], tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert _state(database) == before and _state(wal) == wal_before
    if reader == "trials-csv":  # the WAL's write was read
        assert "written by a writer that then died" in result.stdout


def test_an_older_schema_is_refused_by_a_reader_and_left_as_it_was(database, tmp_path):
    with Storage.open(f"sqlite:///{database}") as db, db._engine.begin() as conn:
        conn.execute(text("ALTER TABLE archsearch_trials DROP COLUMN decode_time_s"))  # version 4's
        conn.execute(text("UPDATE archsearch_meta SET value = '4'"))
    before = _folder(database.parent)
    result = _read(database, READERS["trials"], tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(
        f"error: sqlite:///{database} has archsearch schema version 4, written by an older archsearch; "
    ), result.stderr
    assert "this command, which only reads, does not do" in result.stderr
    assert _folder(database.parent) == before
    with Storage.open(f"sqlite:///{database}", create=False) as db:  # a writer still upgrades it
        assert [t.number for t in db.trials("s")][:3] == [0, 1, 2]
