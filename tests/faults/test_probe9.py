"""Probe 9's broken promises (issue 26): each now one line, the right exit code, nothing changed.

The signal before a search's first trial is `tests/search/test_driver.py`'s
`test_a_signal_before_the_first_trial_leaves_no_empty_study`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.storage import Storage
from tests.faults.test_inputs import _one_line
from tests.postgres import postgres_database
from tests.results.test_ladder import _study

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _space(tmp_path):
    space = tmp_path / "s.toml"
    space.write_text((Path(__file__).parents[2] / "examples" / "tiny-hf.toml").read_text())
    return space


def test_another_applications_studies_and_trials_tables_are_not_adopted(tmp_path):
    """A SQLite file whose tables are named `studies` and `trials` passed as Optuna's: the search
    created archsearch's and Optuna's tables beside them, then failed (exit 1) on a missing column."""
    import sqlite3

    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE studies (x)")
        conn.execute("CREATE TABLE trials (a, b)")
    conn.close()
    before = _sha(path)
    result = CliRunner().invoke(
        app,
        [
            "search",
            "--space",
            str(_space(tmp_path)),
            "--study",
            "s",
            "--trials",
            "1",
            "--storage",
            f"sqlite:///{path}",
        ],
    )
    assert _one_line(result, 2) == (
        f"error: sqlite:///{path} holds a table named 'studies' that is not Optuna's (it lacks Optuna's "
        "columns): another application's; give a new database as --storage"
    )
    assert _sha(path) == before


def test_a_postgresql_database_with_a_foreign_studies_table_is_left_as_it_was(tmp_path):
    """The same on PostgreSQL: refused (exit 2), but archsearch's 12 tables were created first."""
    with postgres_database() as url:
        with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute("CREATE TABLE studies (study_id int, name text)")
            conn.execute("CREATE TABLE trials (a int)")
        result = CliRunner().invoke(
            app,
            ["search", "--space", str(_space(tmp_path)), "--study", "s", "--trials", "1", "--storage", url],
        )
        assert _one_line(result, 2).endswith(
            "holds a table named 'studies' that is not Optuna's (it lacks Optuna's columns): another "
            "application's; give a new database as --storage"
        )
        with psycopg.connect(url.replace("+psycopg", "")) as conn:
            tables = {
                r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            }
        assert tables == {"studies", "trials"}


def test_an_unanswered_statement_under_a_short_bound_is_one_line(monkeypatch):
    """`$ARCHSEARCH_DB_STATEMENT_S` below the server's 30 s lock timeout: the watchdog shut the
    connection, the rollback met it invalidated, and `trials` ended in a 500-line traceback."""
    with postgres_database() as url:
        with Storage.open(url, create=True):
            pass
        locked, release = threading.Event(), threading.Event()

        def hold_lock():
            with psycopg.connect(url.replace("+psycopg", "")) as conn:
                conn.execute("LOCK TABLE archsearch_studies IN ACCESS EXCLUSIVE MODE")
                locked.set()
                release.wait(30)

        holder = threading.Thread(target=hold_lock)
        holder.start()
        try:
            assert locked.wait(10)
            monkeypatch.setenv("ARCHSEARCH_DB_STATEMENT_S", "2")
            result = CliRunner().invoke(app, ["studies", "--storage", url])
        finally:
            release.set()
            holder.join()
        assert _one_line(result, 1).endswith(
            "failed: OperationalError: the server did not answer within 2 s (stopped or unreachable; "
            "$ARCHSEARCH_DB_STATEMENT_S sets the bound)"
        )


FLOATS = "takes finite numbers separated by commas"
ADDRESS = "must be auto, HOST:PORT or ray://HOST:PORT"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["pareto", "--study", "tiny", "--reference", ""], f"error: --reference {FLOATS}, got ''"),
        (["export", "--study", "tiny", "--knee", "--format", "hf", "-o", "{out}", "--device", ""],
         "error: --device only go with --scale-to"),
        (["search", "--space", "{space}", "--trials", "1", "--address", ""],
         f"error: --address {ADDRESS}, got ''"),
        (["search", "--space", "{space}", "--trials", "1", "--address", "not a host"],
         f"error: --address {ADDRESS}, got 'not a host'"),
    ],
    ids=["pareto-reference", "export-device", "search-address", "search-address-malformed"],
)  # fmt: skip
def test_an_empty_or_malformed_value_is_not_taken_for_the_default(tmp_path, argv, line):
    """`--reference ''` used the default point, `export --device ''` wrote the folder, `--address ''`
    started a local Ray; `--address 'not a host'` failed after Ray's start-up as the environment's."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    _study(url)
    args = [a.format(out=tmp_path / "out", space=_space(tmp_path)) for a in argv]
    result = CliRunner().invoke(app, [*args, "--storage", url])
    assert _one_line(result, 2) == line
    assert not (tmp_path / "out").exists()


def test_a_sqlite_path_that_names_a_folder_is_refused(tmp_path):
    """`--storage sqlite:///new/` made a database file named `new`."""
    result = CliRunner().invoke(app, ["studies", "--storage", f"sqlite:///{tmp_path}/new/"])
    assert _one_line(result, 2) == (
        f"error: sqlite:///{tmp_path}/new/ names a folder: give the database file, e.g. "
        f"{tmp_path}/new/archsearch.db"
    )
    assert not (tmp_path / "new").exists()


def test_a_command_started_with_its_stdout_closed_says_so():
    """`archsearch presets >&-` exited 0 having printed nothing."""
    run = subprocess.run(
        [sys.executable, "-m", "archsearch", "presets"], stderr=subprocess.PIPE, text=True, timeout=120,
        preexec_fn=lambda: os.close(1), env={**os.environ, "COLUMNS": "100"},
    )  # fmt: skip
    assert run.returncode == 1
    assert run.stderr.strip() == "error: stdout is closed: nothing could be printed"
