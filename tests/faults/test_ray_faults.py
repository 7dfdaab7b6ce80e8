"""Ray failing under a search: its local node dying mid-search (the raylet killed, as a memory
limit does), a start that does not finish (a Ray address that never answers, one that refuses),
and a failed local start, whose line names the cause its raylet logged.

Each ends in one line; the node's death with the command that continues, which, followed
literally, finishes exactly N trials.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ray import cloudpickle  # Ray vendors it

from archsearch.search import pool as pool_module
from archsearch.search.driver import SearchOptions, run_search
from archsearch.search.pool import RayPool, RayStartError, Stop, handle_signals
from archsearch.search.raystart import (
    CPP_WAITS,
    RayStartTimeout,
    bounded,
    shortened_ray_waits,
    start_failure_cause,
)
from archsearch.search.reaper import how_it_ended, local_raylet
from archsearch.storage import Storage
from archsearch.trial import TrialOutcome
from tests.processes import archsearch_env, running_task, start_archsearch, wait_for
from tests.results.studies import small_study
from tests.specs import tiny_spec, tiny_toml

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers need not import tests/

# Trials long enough for the raylet's kill to land in one (it follows the state it waits for
# at once, and a fresh worker imports torch for seconds before its first trial trains), short
# enough for the resume to train both again in a few seconds.
SLOW_PROXY = 'seconds = 1\nbatch_size = 4\nevals = 2\neval_batches = 1\ndevice = "cpu"'


def _counts(url: str) -> dict[str, int]:
    try:
        with Storage.open(url, read_only=True) as db:
            return db.counts("s")
    except Exception:  # not created yet
        return {}


def _error_line(err: str) -> str:
    """The one error line after the progress lines (which start with '['), nothing else."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and all(line.startswith("[") for line in lines[:-1]), err
    assert lines[-1].startswith("error: ") and "Traceback" not in err, err
    return lines[-1]


def _kill_its_raylet(proc: subprocess.Popen, busy, work: str, database: Path) -> str:
    """SIGKILL the raylet of `proc`'s own local Ray once `busy()` holds (what a memory limit's OOM
    kill does to it); returns the one error line `proc` ends with, having checked that it names the
    node's death under `work`, that stdout stays empty and that the SQLite `database` is whole."""
    try:
        raylet = wait_for(lambda: busy() and local_raylet(proc.pid), 180, f"{work} on its own local Ray")
        os.kill(raylet[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0, err
    line = _error_line(err)
    assert line.startswith(
        f"error: the local Ray node died under {work} (its raylet, pid {raylet[0]}, was killed by SIGKILL"
    ), line
    assert out == "", out  # nothing of Ray's on stdout either
    conn = sqlite3.connect(database)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    return line


# --- the local node dies mid-search ------------------------------------------------------------------
@pytest.mark.long
@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="the watcher's witness needs pidfd_open (Linux)")
def test_a_ray_node_that_dies_mid_search_ends_it_in_one_line_and_the_hint_finishes_exactly_n(tmp_path):
    (tmp_path / "db").mkdir()
    url = f"sqlite:///{tmp_path / 'db' / 'trials.db'}"
    space = tmp_path / "space.toml"
    # One trial, the one the node's death stops (nothing else runs before it): the resume trains
    # it again and nothing more.
    space.write_text(tiny_toml(proxy=SLOW_PROXY, search="trials = 1\nprune = false"))
    proc = start_archsearch("search", "--space", str(space), "--study", "s", "--storage", url, cwd=tmp_path)
    # Waited for by state: a trial running in the database, a worker of this search running it.
    running = lambda: _counts(url).get("running") and running_task(proc.pid)  # noqa: E731
    line = _kill_its_raylet(proc, running, "the search", tmp_path / "db" / "trials.db")
    # Followed literally, from elsewhere: the trial the node's death stopped is re-queued and run.
    command = shlex.split(line.rsplit("`", 2)[-2])
    assert command[:2] == ["archsearch", "search"] and command[command.index("--storage") + 1] == url
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "archsearch", *command[1:]], cwd=elsewhere, env=archsearch_env(),
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    with Storage.open(url, read_only=True) as db:
        counts, records = db.counts("s"), db.trials("s")
    assert counts["complete"] == 1 and set(counts) <= {"complete", "interrupted", "duplicate"}, counts
    stopped = [r for r in records if r.status == "interrupted"]
    assert stopped, records
    later = [r.params for r in records if r.status == "complete" and r.number > stopped[0].number]
    assert stopped[0].params in later  # re-queued, not lost
    assert list(elsewhere.iterdir()) == []


@pytest.mark.long
@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="the watcher's witness needs pidfd_open (Linux)")
def test_a_ray_node_that_dies_under_validate_ends_it_in_one_line_and_keeps_the_database(tmp_path):
    """validate (and ladder, on the same pool loop) check the node as the search does: before, a
    dead node's run was retried on it and the command waited forever."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    with Storage.open(url) as db:
        small_study(db, "s")  # 2,048-token proxies: at 5,000x, a long run outlasts the test
    args = ["validate", "--study", "s", "--storage", url, "--trials", "4", "--multiplier", "5000"]
    proc = start_archsearch(*args, cwd=tmp_path)
    training = lambda: running_task(proc.pid, b"ray::long_run")  # noqa: E731
    line = _kill_its_raylet(proc, training, "validate", tmp_path / "t.db")
    assert line.endswith("; the long runs stored so far are kept; rerun the same command to train the rest")
    with Storage.open(url, read_only=True) as db:
        assert db.long_runs("s", 5000) == [] and db.counts("s")["complete"] == 5


def test_how_a_process_ended_is_read_from_its_zombie():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    start = int(Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[19])
    assert how_it_ended(child.pid, start) is None
    os.kill(child.pid, signal.SIGKILL)
    wait_for(lambda: how_it_ended(child.pid, start), 30, "the child to die")
    assert how_it_ended(child.pid, start) == "was killed by SIGKILL"  # a zombie until collected
    child.wait()
    assert how_it_ended(child.pid, start) == "ended"


# --- a start that does not finish ----------------------------------------------------------------------
def _space(tmp_path: Path) -> Path:
    space = tmp_path / "space.toml"
    space.write_text(tiny_toml(search="trials = 2\nprune = false"))
    return space


def test_a_ray_address_that_accepts_and_never_answers_ends_within_the_bound(tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    with socket.socket() as silent:  # connections queue in its backlog; nothing ever answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        args = ["search", "--space", str(_space(tmp_path)), "--storage", url, "--address", address]
        done = subprocess.run(
            [sys.executable, "-m", "archsearch", *args], cwd=tmp_path, capture_output=True, text=True,
            env=archsearch_env(ARCHSEARCH_RAY_START_S="1"), timeout=120,  # the bound, plus Python's start-up
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(
        f"error: Ray did not start within 1 s (trying to join Ray at {address}; "
        "$ARCHSEARCH_RAY_START_S sets it)"
    ), done.stderr
    with Storage.open(url, read_only=True) as db:
        assert db.study_names() == []


def test_a_ray_address_that_refuses_is_one_line_at_once(tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    args = ["search", "--space", str(_space(tmp_path)), "--storage", url, "--address"]
    done = subprocess.run(
        [sys.executable, "-m", "archsearch", *args, "127.0.0.1:1"], cwd=tmp_path, capture_output=True,
        text=True, env=archsearch_env(), timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    refused = "error: cannot join Ray at 127.0.0.1:1: nothing answers there (Connection refused)\n"
    assert done.stderr == refused


def test_the_bound_is_raised_again_until_the_block_ends():
    caught = []
    with pytest.raises(RayStartTimeout):
        with bounded(0.05):
            try:
                time.sleep(30)
            except RayStartTimeout:  # swallowed once, as Ray's clean-up code might
                caught.append(1)
                time.sleep(30)
    assert caught == [1]


def test_ray_s_waits_are_shortened_inside_the_start_only_and_a_user_s_are_kept(monkeypatch):
    # A 3 s bound cuts the GCS connect (5 s) and first-answer (30 s) waits to 1 s while Ray starts;
    # after it, a child started later (an archsearch under its own bound) must not inherit them.
    monkeypatch.delenv("RAY_gcs_rpc_server_connect_timeout_s", raising=False)
    monkeypatch.setenv("RAY_py_gcs_connect_timeout_s", "17")  # the user's own: kept
    with shortened_ray_waits(3):
        assert os.environ["RAY_gcs_rpc_server_connect_timeout_s"] == "1"
        assert os.environ["RAY_py_gcs_connect_timeout_s"] == "17"
    assert "RAY_gcs_rpc_server_connect_timeout_s" not in os.environ
    assert os.environ["RAY_py_gcs_connect_timeout_s"] == "17"
    with pytest.raises(RuntimeError), shortened_ray_waits(3):  # put back on the way out of a failure
        raise RuntimeError
    assert "RAY_gcs_rpc_server_connect_timeout_s" not in os.environ
    with shortened_ray_waits(120):  # the default bound: Ray's own values
        assert os.environ["RAY_gcs_rpc_server_connect_timeout_s"] == str(
            CPP_WAITS["RAY_gcs_rpc_server_connect_timeout_s"]
        )


# --- a failed local start names its cause ----------------------------------------------------------------
RAYLET_LOG = """\
[2026-11-25 03:00:00,001 I 41 41] (raylet) main.cc:283: Setting cluster ID to: d4c1
[2026-11-25 03:00:00,002 E 41 41] (raylet) worker_pool.cc:512: Some earlier error
[2026-11-25 03:00:00,003 C 41 41] (raylet) plasma_store_runner.cc:97: Check failed: /dev/shm has 60 MB, the \
object store needs 70 MB
*** StackTrace Information ***
"""


def _instant(request, known=None, board=None):
    return TrialOutcome(status="complete", train={"val_loss": 2.0, "tokens": 64, "val_curve": [[64, 2.0]]})


def test_a_failed_local_start_names_the_cause_the_raylet_logged(tmp_path, monkeypatch):
    import ray

    logs = tmp_path / "ray" / f"session_2026-11-25_03-00-00_000001_{os.getpid()}" / "logs"
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))

    def times_out(*args, **kwargs):  # what Ray raises when its raylet does not register
        # The session's logs are written while Ray starts, as Ray writes them: made before the
        # start, on a loaded machine, they were older than it and rightly not blamed.
        logs.mkdir(parents=True)
        (logs / "raylet.out").write_text(RAYLET_LOG)
        raise Exception(
            "The current node timed out during startup. This could happen because some of the raylet "
            "failed to startup or the GCS has become overloaded."
        )

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(pool_module, "start_local_ray", times_out)
    url = f"sqlite:///{tmp_path / 't.db'}"
    with Storage.open(url) as db, pytest.raises(RayStartError) as info:
        run_search(tiny_spec(), db, SearchOptions(study="s", trials=1), evaluate_fn=_instant)
    assert str(info.value) == (
        "cannot start a local Ray: Check failed: /dev/shm has 60 MB, the object store needs 70 MB "
        f"(from {logs / 'raylet.out'})"
    )
    with Storage.open(url, read_only=True) as db:
        assert db.study_names() == []


def test_a_signal_while_a_lazy_pool_starts_goes_to_the_search_s_stop(monkeypatch):
    """A pool that starts inside the search's loop (lazy) holds a signal while Ray starts, as an
    eager one does, then hands it to the loop's `Stop` rather than ending the start: the loop
    stops as it would have a moment later."""
    import ray

    def start(*args, **kwargs):  # Ray "comes up" while a Ctrl-C arrives
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: None)  # another test's Ray may run in this process
    monkeypatch.setattr(pool_module, "start_local_ray", start)
    stop = Stop()
    with RayPool(SearchOptions(study="s", trials=1), _instant, lazy=True) as pool, handle_signals(stop):
        assert not pool.started  # nothing needed Ray yet
        pool.start()
        assert pool.started and stop.signum == signal.SIGINT


def test_a_session_of_another_process_is_not_blamed(tmp_path):
    logs = tmp_path / "ray" / f"session_2026-11-25_03-00-00_000001_{os.getpid() + 1}" / "logs"
    logs.mkdir(parents=True)
    (logs / "raylet.out").write_text(RAYLET_LOG)
    assert start_failure_cause(os.getpid(), 0, tmp_path / "ray") is None
    assert start_failure_cause(os.getpid() + 1, 0, tmp_path / "ray") == (
        "Check failed: /dev/shm has 60 MB, the object store needs 70 MB",
        logs / "raylet.out",
    )


FAILED_START = """
import atexit, sys, threading
import ray
from archsearch.search import pool
from archsearch.search.driver import SearchOptions, run_search
from archsearch.search.pool import RayStartError
from archsearch.storage import Storage
from tests.specs import tiny_spec

def stuck(*args, **kwargs):  # as Ray's exit hook waited after a start that failed for want of memory
    threading.Event().wait()

def fails(*args, **kwargs):
    raise Exception("Check failed: allocation.has_value() PlasmaAllocator initialization failed")

atexit.unregister(ray.shutdown)
ray.shutdown = stuck
atexit.register(stuck, True)  # in the place of Ray's own hook
ray.is_initialized = lambda: False
pool.start_local_ray = fails
with Storage.open(sys.argv[1]) as db:
    try:
        run_search(tiny_spec(), db, SearchOptions(study="s", trials=1))
    except RayStartError as exc:
        print(exc, flush=True)
"""


def test_a_failed_local_start_ends_the_process_without_ray_s_exit_hook(tmp_path):
    """Ray's `atexit` hook (`ray.shutdown`) waited without end after a local start that failed under
    a memory limit, the error line already printed; the reaper has stopped what Ray started, so the
    hook is dropped. Run in a child process, bounded: a regression fails instead of hanging."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "RAY_TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", FAILED_START, f"sqlite:///{tmp_path / 't.db'}"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("cannot start a local Ray: Exception: Check failed"), done.stdout
