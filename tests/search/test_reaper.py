"""The reaper stops the processes that carry its token, and only those, when its driver ends."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from archsearch.search.reaper import OWNER_ENV, owned_processes, ray_reaped, reap

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")


def _sleeper(token: str | None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}
    if token is not None:
        env[OWNER_ENV] = token
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)


def test_reap_stops_the_marked_processes_and_spares_the_others():
    marked, other, unmarked = _sleeper("t-1"), _sleeper("t-2"), _sleeper(None)
    try:
        assert owned_processes("t-1") == {marked.pid}
        assert reap("t-1", grace_s=5) == {marked.pid}
        assert marked.wait(timeout=10) != 0
        assert other.poll() is None and unmarked.poll() is None
    finally:
        for p in (marked, other, unmarked):
            p.kill()
            p.wait()


def test_what_starts_inside_ray_reaped_ends_with_it():
    with ray_reaped() as watcher:
        assert os.environ[OWNER_ENV] == watcher.token
        child = _sleeper(watcher.token)  # as Ray's processes inherit the marked environment
    assert OWNER_ENV not in os.environ
    try:
        assert child.wait(timeout=15) != 0  # the watcher stopped it when the block ended
    finally:
        child.kill()
        child.wait()


def test_the_watcher_reaps_when_its_driver_is_killed(tmp_path):
    # A driver that dies by SIGKILL inside the block: nothing of it runs, the watcher still does.
    code = (
        "import subprocess, sys, time\n"
        "from archsearch.search.reaper import ray_reaped\n"
        "with ray_reaped():\n"
        "    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "    print(child.pid, flush=True)\n"
        "    time.sleep(120)\n"
    )
    driver = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(driver.stdout.readline())
    driver.kill()
    driver.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{child}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            break
        if state in ("Z", "X"):
            break
        time.sleep(0.1)
    else:
        os.kill(child, 9)
        raise AssertionError("the orphaned child outlived its killed driver by 30 s")


def test_processes_below_a_marked_one_are_reaped_even_with_an_environment_of_their_own():
    # Ray's raylet starts its agents with an environment without the token.
    code = (
        "import os, subprocess, sys, time\n"
        "env = {k: v for k, v in os.environ.items() if k != 'ARCHSEARCH_RAY_OWNER'}\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], env=env)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    env = {**os.environ, OWNER_ENV: "t-tree"}
    parent = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert owned_processes("t-tree") == {parent.pid}
        assert reap("t-tree", grace_s=5) == {parent.pid, child}
        assert parent.wait(timeout=10) != 0
    finally:
        parent.kill()
        parent.wait()
        with contextlib.suppress(OSError):
            os.kill(child, 9)


FAKE_DRIVER = """
import os, subprocess, sys, time
from archsearch.search.reaper import ray_reaped
with ray_reaped() as watcher:
    raylet = subprocess.Popen([sys.executable, "-c",
        "open('/proc/self/comm', 'w').write('raylet'); import time; time.sleep(600)"])
    while open(f"/proc/{raylet.pid}/comm").read().strip() != "raylet":
        time.sleep(0.01)
    watcher.arm(sys.argv[1], "host:1", "archsearch search --resume")
    print(raylet.pid, watcher._process.pid, flush=True)
    sys.stdin.readline()  # the test says when
    os._exit(1)  # as Ray's core worker ends a driver whose raylet died: no Python clean-up runs
"""


def _pidfds(pid: int) -> int:
    """How many pidfds the process `pid` holds open."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd) == "anon_inode:[pidfd]"
    return count


def _until(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="the watcher's witness needs pidfd_open")
def test_a_driver_that_ray_ends_after_its_raylet_died_gets_its_line_and_its_leases_ended(tmp_path):
    import signal

    from archsearch.storage import Storage
    from archsearch.trial import RUNNING

    url = f"sqlite:///{tmp_path / 't.db'}"
    with Storage.open(url) as db:
        db.create_study("s", spec_fingerprint="f", spec_source="", spec={}, objectives=("loss",))
        db.host = "host:1"  # the fake driver's trials
        slot = db.claim_trial("s", 10, lease_s=3600)
    driver = subprocess.Popen(
        [sys.executable, "-c", FAKE_DRIVER, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    raylet, watcher = map(int, driver.stdout.readline().split())
    _until(lambda: _pidfds(watcher) == 1, "the watcher to watch the raylet")
    os.kill(raylet, signal.SIGKILL)
    _until(lambda: _pidfds(watcher) == 0, "the watcher to see the raylet's death")  # by state
    driver.stdin.write("end\n")
    driver.stdin.flush()
    _, err = driver.communicate(timeout=60)  # EOF once the watcher, which shares stderr, is done
    assert driver.returncode == 1
    assert err.splitlines() == [
        f"error: the local Ray node died under the search (its raylet, pid {raylet}, was killed by SIGKILL; "
        "a memory limit or the OOM killer can do that) and Ray ended the search with it; a resume "
        "re-queues its running trials; continue with `archsearch search --resume`"
    ], err
    with Storage.open(url) as db:
        [record] = db.trials("s", RUNNING)
        assert record.id == slot and record["lease_expires_at"] <= time.time()  # a resume sweeps it now


def test_a_driver_killed_before_its_raylet_gets_no_line(tmp_path):
    driver = subprocess.Popen(
        [sys.executable, "-c", FAKE_DRIVER, f"sqlite:///{tmp_path / 't.db'}"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    raylet, watcher = map(int, driver.stdout.readline().split())
    _until(lambda: _pidfds(watcher) == 1, "the watcher to watch the raylet")
    driver.kill()  # the raylet outlives it (no parent-death signal here): the watcher reaps it
    _, err = driver.communicate(timeout=60)
    assert err == ""
    _until(
        lambda: (
            not Path(f"/proc/{raylet}").exists()
            or Path(f"/proc/{raylet}/stat").read_text().rpartition(")")[2].split()[0] in "ZX"
        ),
        "the reap",
    )
