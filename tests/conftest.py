"""Suite-wide fixtures: no test writes to the home directory's cache; one local Ray shared by the
in-process searches; both CPU precision paths on any host."""

from __future__ import annotations

import os

import pytest

# The CPU's bf16 support as every test sees it, whatever the host has: a declared value, so "auto"
# precision never measures bf16 against fp32 (a timing, which the load can flip between two runs
# of one test). The `cpu_bf16` fixture runs the precision-dependent tests under both values;
# `ARCHSEARCH_CPU_BF16=native bash .ci/run` runs the whole suite as an AVX512-BF16 host would.
os.environ.setdefault("ARCHSEARCH_CPU_BF16", "none")


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

    from archsearch.search.pool import start_local_ray

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


@pytest.fixture(params=["none", "native"], ids=["cpu-fp32", "cpu-bf16"])
def cpu_bf16(request, monkeypatch):
    """The test once with the CPU treated as lacking native bf16 ("auto" trains in fp32, as on an
    AVX2 host) and once as having it ("auto" trains in bf16, as on an AVX512-BF16 or AMX host),
    whatever this host has: the value of ARCHSEARCH_CPU_BF16, which subprocesses inherit. A test
    whose outcome depends on the precision takes this fixture, so the suite never depends on the
    CPU that runs it."""
    from archsearch.evaluators.profiler import CPU_BF16_ENV

    monkeypatch.setenv(CPU_BF16_ENV, request.param)
    return {"none": "fp32", "native": "bf16"}[request.param]
