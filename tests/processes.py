"""Real archsearch processes for the tests that need them (signals, killed workers and raylets,
concurrent drivers), and waits on their state rather than on sleeps.

Linux only where it reads /proc; the callers skip elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def archsearch_env(**extra: str) -> dict[str, str]:
    """This environment for a child archsearch: no Ray usage stats, unbuffered output."""
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1", **extra}


def start_archsearch(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python -m archsearch ARGS` in a session of its own (a signal to the test's process group
    does not reach it; `os.killpg(proc.pid, ...)` reaches it and what it started), text pipes."""
    return subprocess.Popen(
        [sys.executable, "-m", "archsearch", *args], cwd=cwd, env=env or archsearch_env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip


def wait_for(condition: Callable[[], T], timeout: float, what: str, every: float = 0.1) -> T:
    """`condition()`'s first true value, polled every `every` seconds; AssertionError naming
    `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def state(pid: int) -> str | None:
    """The process's state letter (R, S, Z for a zombie ...), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def alive(pids: set[int]) -> set[int]:
    """Those of `pids` still running (a zombie, dead but not yet reaped by its parent, is not)."""
    return {pid for pid in pids if state(pid) not in (None, "Z", "X")}


def descendants(root: int) -> set[int]:
    """The processes under `root`: Ray's raylet and its workers are children of the driver."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit():
                ppid = int((proc / "stat").read_text().rpartition(")")[2].split()[1])
                children.setdefault(ppid, []).append(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def running_task(driver: int, task: bytes = b"ray::evaluate") -> int | None:
    """A Ray worker of this driver running `task` (its command line starts so): only this
    driver's, since the machine is shared and another search's worker is not ours to kill."""
    for pid in descendants(driver):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(task):
                return pid
        except OSError:
            continue
    return None
