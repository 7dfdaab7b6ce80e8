"""Suite-wide fixtures: no test writes to the home directory's cache; one local Ray shared by the
in-process searches."""

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


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for all in-process searches (a search joins it and leaves it running)."""
    import ray

    from archsearch.search.driver import start_local_ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    start_local_ray(2, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture
def two_threads():
    """The process at 2 torch threads for the test, its own count back after."""
    import torch

    own = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(own)
