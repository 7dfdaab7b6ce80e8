"""A throwaway database on the local PostgreSQL for a test; the test skips, saying why, without one."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest

PG_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432"


def _postgres_admin():
    try:
        import psycopg
    except ImportError:
        return None, "psycopg is not installed"
    try:
        return psycopg.connect(
            "host=127.0.0.1 port=5432 user=postgres dbname=postgres", autocommit=True, connect_timeout=3
        ), None
    except psycopg.Error as exc:
        return None, f"no PostgreSQL at 127.0.0.1:5432 ({str(exc).strip().splitlines()[0]})"


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """The URL of a new, empty database, dropped afterwards; `pytest.skip` when PostgreSQL is absent."""
    admin, why = _postgres_admin()
    if admin is None:
        pytest.skip(f"PostgreSQL backend not tested: {why}")
    name = f"archsearch_test_{uuid.uuid4().hex[:12]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_SERVER}/{name}"
    finally:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.close()
