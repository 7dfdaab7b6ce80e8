"""Fault injection: each test breaks one thing a run depends on and checks the exit code (or the
error), the one line, and the database afterwards (nothing left running, a resume reaching
exactly N). Backends: SQLite files and a throwaway database on the local PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.postgres import postgres_database
from tests.storage.test_query import fill_study


@pytest.fixture(params=["sqlite", "postgresql"])
def backend_url(request, tmp_path) -> Iterator[str]:
    """A fresh, empty database URL on each backend; PostgreSQL skips visibly when absent."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'trials.db'}"
        return
    with postgres_database() as url:
        yield url


@pytest.fixture
def study_url(tmp_path) -> str:
    """A SQLite URL of `tmp_path / "trials.db"` holding the filled study "s" (`fill_study`)."""
    from archsearch.storage import Storage

    url = f"sqlite:///{tmp_path / 'trials.db'}"
    with Storage.open(url) as db:
        fill_study(db)
    return url
