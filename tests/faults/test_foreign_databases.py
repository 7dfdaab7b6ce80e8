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

import psycopg
import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.storage import Storage, StorageError
from archsearch.storage import engine as engine_module
from tests.faults.test_storage_failures import HOLDER
from tests.helpers import example_space, one_line
from tests.postgres import postgres_database
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
    monkeypatch.setattr(engine_module, "BUSY_TIMEOUT_S", 1)  # read when an engine connects
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
    line = one_line(result, 1, "database is locked")
    assert line.endswith("(another process held its lock for more than 1 s)"), line


# --- database URLs with options, truncated files, I/O errors and damaged columns ---------------------
@pytest.mark.parametrize(
    "command", [["studies"], ["search", "--space", "{space}", "--study", "s", "--resume"]]
)
def test_a_sqlite_url_with_options_is_refused_and_writes_nowhere(tmp_path, command):
    """`?mode=ro&uri=true` was honoured by some connections and not others: a search's trials went
    to a new file named `trials.db?mode=ro`, the database named left as it was."""
    from tests.specs import TINY_TOML

    path = tmp_path / "trials.db"
    with Storage.open(f"sqlite:///{path}") as db:
        fill_study(db)
    (tmp_path / "space.toml").write_text(TINY_TOML)
    before = _digest(path)
    url = f"sqlite:///{path}?mode=ro&uri=true"
    args = [a.format(space=tmp_path / "space.toml") for a in command]
    result = CliRunner().invoke(app, [*args, "--storage", url])
    assert one_line(result, 2) == f"error: {url}: a SQLite URL takes no options; give sqlite:///PATH"
    assert _digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.toml", "trials.db"]


@pytest.mark.parametrize("command", [["studies"], ["trials", "--study", "s"], ["validate", "--study", "s"]])
def test_a_database_truncated_half_way_is_damaged_exit_1(tmp_path, command):
    """It was 'cannot use the database ...: database disk image is malformed', exit 2 as for bad
    input, where a damaged page found by the search's quick_check is exit 1 with the remedy."""
    path = tmp_path / "trials.db"
    with Storage.open(f"sqlite:///{path}") as db:
        fill_study(db)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    before = _digest(path)
    result = CliRunner().invoke(app, [*command, "--storage", f"sqlite:///{path}"])
    assert one_line(result, 1) == (
        f"error: the database sqlite:///{path} is damaged (database disk image is malformed): restore it "
        "from a copy, or give another --storage"
    )
    assert _digest(path) == before


FILE_SIZE_LIMIT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))  # `ulimit -f 1`: the -shm file cannot grow
from archsearch.__main__ import main
sys.argv = ["archsearch", "studies", "--storage", sys.argv[1]]
main()
"""


def test_an_io_error_while_opening_the_database_is_exit_1(tmp_path):
    """Under `ulimit -f 1` SQLite cannot size the WAL index: 'disk I/O error' was exit 2, as for bad
    input; it is the environment's failure, exit 1, as the same error mid-search is."""
    path = tmp_path / "trials.db"
    with Storage.open(f"sqlite:///{path}") as db:
        fill_study(db)
    before = _digest(path)
    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", FILE_SIZE_LIMIT, f"sqlite:///{path}"], capture_output=True, text=True,
        timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr == f"error: the database sqlite:///{path} failed: OperationalError: disk I/O error\n"
    assert _digest(path) == before


@pytest.mark.parametrize(
    ("stored", "why"),
    [
        ("not json{", "Expecting value: line 1 column 1 (char 0)"),
        ("[1]", "the spec of study 's' is not a JSON object"),
    ],
    ids=["not-json", "a-list"],
)
@pytest.mark.parametrize("command", [["studies"], ["trials", "--study", "s"], ["pareto", "--study", "s"]])
def test_a_damaged_json_column_is_a_damaged_database_and_left_as_it_was(tmp_path, stored, why, command):
    """A study whose stored spec was overwritten (garbage, or JSON of another shape) was a
    JSONDecodeError or AttributeError traceback in every command that read it."""
    path = tmp_path / "trials.db"
    with Storage.open(f"sqlite:///{path}") as db:
        fill_study(db)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE archsearch_studies SET spec_json = ?", (stored,))
    conn.close()
    before = _digest(path)
    url = f"sqlite:///{path}"
    result = CliRunner().invoke(app, [*command, "--storage", url])
    assert one_line(result, 1) == (
        f"error: the database {url} is damaged (a stored value is damaged: {why}): restore it from a "
        "copy, or give another --storage"
    )
    assert _digest(path) == before


@pytest.mark.parametrize(
    ("column", "stored", "why"),
    [
        ("loss", "abc", "the loss of a trial is 'abc', not a number"),
        ("config_json", "not json{", "trial 0's config: invalid JSON at line 1 column 1: Expecting value"),
        ("params_total", -5, "the params_total of a trial is -5, not a positive number"),
    ],
    ids=["text-in-a-number-column", "config-not-json", "negative-size"],
)
@pytest.mark.parametrize(
    "command",
    [
        ["pareto", "--study", "s"],
        ["export", "--study", "s", "--trial", "0", "--format", "json", "-o", "{out}"],
    ],
    ids=["pareto", "export"],
)
def test_a_damaged_trial_value_is_a_damaged_database_and_left_as_it_was(
    tmp_path, column, stored, why, command
):
    """SQLite keeps text in a REAL column: `pareto` and `report` were a ValueError traceback; a
    damaged trial config blamed the input ('config: invalid JSON', exit 2)."""
    path = tmp_path / "trials.db"
    with Storage.open(f"sqlite:///{path}") as db:
        fill_study(db)
    with sqlite3.connect(path) as conn:
        conn.execute(f"UPDATE archsearch_trials SET {column} = ? WHERE number = 0", (stored,))
    conn.close()
    before = _digest(path)
    url = f"sqlite:///{path}"
    args = [a.format(out=tmp_path / "out") for a in command]
    result = CliRunner().invoke(app, [*args, "--storage", url])
    assert one_line(result, 1) == (
        f"error: the database {url} is damaged (a stored value is damaged: {why}): restore it from a "
        "copy, or give another --storage"
    )
    assert _digest(path) == before and not (tmp_path / "out").exists()


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _one_trial_search(tmp_path, url: str) -> list[str]:
    """The arguments of a one-trial search of examples/tiny-hf.toml into `url`."""
    space = str(example_space(tmp_path))
    return ["search", "--space", space, "--study", "s", "--trials", "1", "--storage", url]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
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
    result = CliRunner().invoke(app, _one_trial_search(tmp_path, f"sqlite:///{path}"))
    assert one_line(result, 2) == (
        f"error: sqlite:///{path} holds a table named 'studies' that is not Optuna's (it lacks Optuna's "
        "columns): another application's; give a new database as --storage"
    )
    assert _sha(path) == before


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_postgresql_database_with_a_foreign_studies_table_is_left_as_it_was(tmp_path):
    """The same on PostgreSQL: refused (exit 2), but archsearch's 12 tables were created first."""
    with postgres_database() as url:
        with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute("CREATE TABLE studies (study_id int, name text)")
            conn.execute("CREATE TABLE trials (a int)")
        result = CliRunner().invoke(app, _one_trial_search(tmp_path, url))
        assert one_line(result, 2).endswith(
            "holds a table named 'studies' that is not Optuna's (it lacks Optuna's columns): another "
            "application's; give a new database as --storage"
        )
        with psycopg.connect(url.replace("+psycopg", "")) as conn:
            tables = {
                r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            }
        assert tables == {"studies", "trials"}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_sqlite_path_that_names_a_folder_is_refused(tmp_path):
    """`--storage sqlite:///new/` made a database file named `new`."""
    result = CliRunner().invoke(app, ["studies", "--storage", f"sqlite:///{tmp_path}/new/"])
    assert one_line(result, 2) == (
        f"error: sqlite:///{tmp_path}/new/ names a folder: give the database file, e.g. "
        f"{tmp_path}/new/archsearch.db"
    )
    assert not (tmp_path / "new").exists()
