"""Optuna's state, foreign or damaged: tables written by a newer Optuna, and Optuna pages of a
SQLite file that are corrupt. Each ends a search in one line before Ray starts and before anything
is written; no study is created (so none is left empty for a plain rerun to refuse).

(An Optuna study of the same name that archsearch did not create, or with another number of
objectives, is `test_storage_failures.test_a_foreign_optuna_study_of_the_same_name_is_never_adopted`.)
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
import sys
from pathlib import Path

import pytest
from ray import cloudpickle  # Ray vendors it
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.search.driver import SearchOptions, run_search
from archsearch.storage import Storage
from archsearch.trial import TrialOutcome
from tests.specs import tiny_spec, tiny_toml

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers need not import tests/
pytestmark = pytest.mark.usefixtures("ray_session")


def instant(request, known=None, board=None):
    loss = 2.0 + request.config.d_model / 1000 + request.config.n_layers / 100
    return TrialOutcome(status="complete", train={"val_loss": loss, "tokens": 64, "val_curve": [[64, loss]]})


def _searched(url: str, tmp_path: Path) -> Path:
    """Study "s" with 2 complete trials in `url`, and the space file it was made from."""
    space = tmp_path / "space.toml"
    space.write_text(tiny_toml())
    with Storage.open(url) as db:
        run_search(tiny_spec(), db, SearchOptions(study="s", trials=2), evaluate_fn=instant)
    return space


def _snapshot(url: str) -> object:
    """What a search could change: the SQLite file's bytes, else archsearch's studies and runs."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return hashlib.sha256(Path(parsed.database).read_bytes()).hexdigest()
    with Storage.open(url, read_only=True) as db:
        return db.study_names(), db.counts("s"), len(db.search_runs("s"))


def _one_line(result, code: int) -> str:
    assert result.exit_code == code, result.output
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output, result.output
    return result.stderr.strip()


def _search(space: Path, url: str, *args: str):
    return CliRunner().invoke(app, ["search", "--space", str(space), "--storage", url, *args])


def test_optuna_tables_from_a_newer_optuna_are_refused_before_anything_is_written(backend_url, tmp_path):
    import optuna

    space = _searched(backend_url, tmp_path)
    engine = create_engine(backend_url)
    with engine.begin() as conn:  # what a newer Optuna's migration leaves
        conn.execute(text("UPDATE alembic_version SET version_num = 'v99.0.0.a'"))
        conn.execute(text("UPDATE version_info SET library_version = '99.0.0'"))
    engine.dispose()
    before = _snapshot(backend_url)
    shown = re.escape(make_url(backend_url).render_as_string(hide_password=True))
    for args in (["--study", "s", "--resume"], ["--study", "new"]):
        line = _one_line(_search(space, backend_url, *args), 2)
        assert re.match(
            rf"^error: cannot open Optuna's tables in {shown}: The runtime optuna version "
            rf"{re.escape(optuna.__version__)} is no longer compatible with the table schema \(set up by "
            r"optuna 99\.0\.0\)",
            line,
        ), line
        assert _snapshot(backend_url) == before
    with Storage.open(backend_url, read_only=True) as db:
        assert db.study_names() == ["s"]


def _corrupt_table(path: Path, table: str) -> None:
    """Overwrite the root page of `table` with garbage, as a bad sector or a torn copy would."""
    conn = sqlite3.connect(path)
    try:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    finally:
        conn.close()
    with open(path, "r+b") as handle:
        handle.seek((root - 1) * page_size)
        handle.write(b"\xa5" * page_size)


def test_corrupt_optuna_pages_are_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "trials.db"
    url = f"sqlite:///{path}"
    space = _searched(url, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.toml", "trials.db"]  # no WAL left
    _corrupt_table(path, "trials")  # Optuna's
    before = _snapshot(url)
    for args in (["--study", "s", "--resume"], ["--study", "new"]):
        line = _one_line(_search(space, url, *args), 1)
        assert line.startswith(f"error: the database {url} is damaged (SQLite's quick_check: "), line
        assert line.endswith("): restore it from a copy, or give another --storage"), line
        assert "continue with" not in line  # no resume can continue on it
        assert _snapshot(url) == before
