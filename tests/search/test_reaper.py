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
    with ray_reaped() as token:
        assert os.environ[OWNER_ENV] == token
        child = _sleeper(token)  # as Ray's processes inherit the marked environment
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
