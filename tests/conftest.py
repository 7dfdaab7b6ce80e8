"""Suite-wide fixtures: no test writes to the home directory's cache."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory: pytest.TempPathFactory):
    """A session-wide ARCHSEARCH_CACHE (tests that need an empty one override it per test)."""
    old = os.environ.get("ARCHSEARCH_CACHE")
    os.environ["ARCHSEARCH_CACHE"] = str(tmp_path_factory.mktemp("archsearch-cache"))
    yield
    if old is None:
        os.environ.pop("ARCHSEARCH_CACHE", None)
    else:
        os.environ["ARCHSEARCH_CACHE"] = old
