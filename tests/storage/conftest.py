"""The storage contract suite runs against every backend: SQLite files and the local PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.postgres import postgres_database


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> Iterator[str]:
    """A fresh, empty database URL on each backend; PostgreSQL skips visibly when absent."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'trials.db'}"
        return
    with postgres_database() as url:
        yield url
