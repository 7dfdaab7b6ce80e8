"""Suite-wide fixtures: no test writes to the home directory's cache; one local Ray shared by the
in-process searches; both CPU precision paths on any host; the xdist groups of the tests that
share a costly resource."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator

import pytest

# The CPU's bf16 support as every test sees it, whatever the host has: a declared value, so "auto"
# precision never measures bf16 against fp32 (a timing, which the load can flip between two runs
# of one test). The `cpu_bf16` fixture runs the precision-dependent tests under both values;
# `ARCHSEARCH_CPU_BF16=native bash .ci/run` runs the whole suite as an AVX512-BF16 host would.
os.environ.setdefault("ARCHSEARCH_CPU_BF16", "none")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup` (README's test command), the tests on the in-process Ray run in
    two groups, so at most two Rays start for the run rather than one per worker (each is about a
    gigabyte and seconds of CPU to start); the tests joining `ray start --head` run in one worker,
    so one head starts (a module fixture starts one per worker that runs its tests); the browser
    tests run in one worker, so at most one installs Chromium (two apt-get runs at once fail on
    dpkg's lock). Run before xdist's own hook, which reads the marks into the node ids it
    schedules by.

    The tests marked `long` (the ones that take tens of seconds) are collected first, so that
    xdist hands them out at the start and the short ones fill the workers in at the end: collected
    in file order, a 100-second test that began last ran alone for over a minute after the other
    worker had finished."""
    for item in items:
        if "ray_session" in item.fixturenames:
            # Two groups, split by module: one Ray serialised every in-process search of the run
            # on one worker, the longest chain of the run; two Rays halve it.
            half = zlib.crc32(item.module.__name__.encode()) % 2
            item.add_marker(pytest.mark.xdist_group(f"ray-{half}"))
        elif "ray_head" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("ray-head"))
        elif "chromium" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("chromium"))
    items.sort(key=lambda item: item.get_closest_marker("long") is None)  # stable: file order within


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory: pytest.TempPathFactory):
    """A run-wide ARCHSEARCH_CACHE (tests that need an empty one override it per test), shared by
    the xdist workers, so the corpus and the eager-bytes counts are built once per run, not once
    per worker. Sharing is safe: every cache entry is written whole under a unique temporary name
    and renamed into place (`fileio.write_atomic`; a corpus in a scratch folder of its own), so
    two workers writing one entry at once leave a whole one, and a reader never sees half."""
    old = os.environ.get("ARCHSEARCH_CACHE")
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, above each worker's own
    folder = base / "archsearch-cache"
    folder.mkdir(exist_ok=True)
    os.environ["ARCHSEARCH_CACHE"] = str(folder)
    yield
    if old is None:
        os.environ.pop("ARCHSEARCH_CACHE", None)
    else:
        os.environ["ARCHSEARCH_CACHE"] = old


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """The test process's own torch work on one intra-op thread. Its tensors are tiny, and the
    processes a test starts (Ray workers, CLI subprocesses) compete for the same cores: at two
    threads on a busy 2-core host, OpenMP's spinning made six 150-step overfits of a 32-wide model
    take 362 s against 20 s at one. Tests of thread counts set their own (`two_threads`, the
    trainer's `threads` setting); subprocesses choose theirs as users' do."""
    import torch

    own = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(own)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for all in-process searches (a search joins it and leaves it running)."""
    import ray

    from archsearch.search.pool import start_local_ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    for attempt in range(3):
        try:
            start_local_ray(2, log_to_driver=False, configure_logging=False)
            break
        except Exception as exc:  # Ray raises a bare Exception when its raylet registers late
            # On a loaded machine (a CI runner, xdist's other workers) the raylet can take longer
            # than the 30 s Ray waits for it; one failed start would error every test on this Ray.
            ray.shutdown()
            if attempt == 2 or "timed out during startup" not in str(exc):
                raise
    yield
    ray.shutdown()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend_url(request, tmp_path) -> Iterator[str]:
    """A fresh, empty database URL on each backend (the storage contract suite and the fault tests
    run against both); PostgreSQL skips visibly when absent."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'trials.db'}"
        return
    from tests.postgres import postgres_database

    with postgres_database() as url:
        yield url


@pytest.fixture
def study_url(tmp_path) -> str:
    """A SQLite URL of `tmp_path / "trials.db"` holding the filled study "s" (`fill_study`)."""
    from archsearch.storage import Storage
    from tests.storage.test_query import fill_study

    url = f"sqlite:///{tmp_path / 'trials.db'}"
    with Storage.open(url) as db:
        fill_study(db)
    return url


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


@pytest.fixture
def training_warmups(monkeypatch) -> list[float]:
    """The warm-up fraction of every training run started in this process, in order (the stall
    rule's retries show as a second, longer one)."""
    from archsearch.evaluators import trainer

    seen, real = [], trainer.train

    def spy(cfg, data, settings, **kwargs):
        seen.append(settings.warmup)
        return real(cfg, data, settings, **kwargs)

    monkeypatch.setattr(trainer, "train", spy)
    return seen
