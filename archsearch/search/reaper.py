"""A local Ray that does not outlive its driver, however the driver ends.

`ray.init()` starts the cluster's processes (GCS, raylet, agents, workers) under the driver. When
the driver is SIGKILLed, nothing runs its `ray.shutdown()`, and Ray's agents were measured living
on for 60-90 s (after a SIGBUS crash they ignored SIGTERM). So the driver starts this small
watcher first, in a session of its own, with a pipe on its stdin, and marks its environment with
a token that the Ray processes it starts inherit. Ray's agents are started with an environment of
their own, so while the driver lives the watcher also notes, every second, the processes below the
marked ones. When the pipe closes (the driver ended, cleanly or not: the kernel closes a dead
process's files), the watcher stops them all: SIGTERM, then SIGKILL after a grace period.

Linux only (it reads /proc); elsewhere the watcher finds nothing and Ray's own shutdown is all.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

OWNER_ENV = "ARCHSEARCH_RAY_OWNER"
GRACE_S = 3.0  # between SIGTERM and SIGKILL


def _stat(entry: Path) -> tuple[str, int, int] | None:
    """(state, parent pid, start time in clock ticks) of a /proc entry, None when it is gone."""
    try:
        fields = (entry / "stat").read_text().rpartition(")")[2].split()
        return fields[0], int(fields[1]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _processes(proc: Path) -> dict[int, tuple[str, int, int]]:
    """pid -> (state, parent, start time) of every process."""
    found = {}
    for entry in proc.iterdir() if proc.is_dir() else ():
        if entry.name.isdigit() and (stat := _stat(entry)) is not None:
            found[int(entry.name)] = stat
    return found


def owned_processes(token: str, proc: Path = Path("/proc")) -> set[int]:
    """The live processes whose environment carries `OWNER_ENV=token` (zombies excluded)."""
    marker = f"{OWNER_ENV}={token}".encode()
    found = set()
    for pid, (state, _, _) in _processes(proc).items():
        if pid == os.getpid() or state in ("Z", "X"):
            continue
        try:
            if marker in (proc / str(pid) / "environ").read_bytes().split(b"\0"):
                found.add(pid)
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def owned_trees(token: str, proc: Path = Path("/proc")) -> set[tuple[int, int]]:
    """(pid, start time) of the marked processes and every live process below them."""
    table = _processes(proc)
    children: dict[int, list[int]] = {}
    for pid, (_, parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    todo, seen = list(owned_processes(token, proc)), set()
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(children.get(pid, ()))
    return {(pid, table[pid][2]) for pid in seen if pid in table and table[pid][0] not in ("Z", "X")}


def _alive(known: set[tuple[int, int]], proc: Path = Path("/proc")) -> set[int]:
    """Those of `known` still running as the same process (a reused pid has another start time)."""
    alive = set()
    for pid, start in known:
        stat = _stat(proc / str(pid))
        if stat is not None and stat[2] == start and stat[0] not in ("Z", "X"):
            alive.add(pid)
    return alive


def reap(token: str, grace_s: float = GRACE_S, known: set[tuple[int, int]] = frozenset()) -> set[int]:
    """Stop the marked processes, what is below them and the `known` ones noted earlier (agents
    whose parent is already gone); returns the pids signalled."""
    known = set(known) | owned_trees(token)
    signalled: set[int] = set()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        known |= owned_trees(token)
        left = _alive(known)
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        signalled |= left
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 0)
        while _alive(known) and time.monotonic() < deadline:
            time.sleep(0.1)
    return signalled


@contextlib.contextmanager
def ray_reaped() -> Iterator[str]:
    """Mark the processes started inside (a local Ray) so that they end when this process does.

    Yields the token. On a clean exit the watcher is released and stops what Ray's shutdown left.
    """
    token = f"{os.getpid()}-{secrets.token_hex(6)}"
    env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}
    watcher = subprocess.Popen(
        [sys.executable, "-m", "archsearch.search.reaper", token],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        start_new_session=True,  # a Ctrl-C to the terminal's process group does not reach it
    )  # fmt: skip
    previous = os.environ.get(OWNER_ENV)
    os.environ[OWNER_ENV] = token
    try:
        yield token
    finally:
        if previous is None:
            os.environ.pop(OWNER_ENV, None)
        else:
            os.environ[OWNER_ENV] = previous
        watcher.stdin.close()  # type: ignore[union-attr]
        with contextlib.suppress(subprocess.TimeoutExpired):
            watcher.wait(timeout=2 * GRACE_S + 5)


def main() -> None:
    """`python -m archsearch.search.reaper TOKEN`: note TOKEN's processes until stdin closes, then
    stop them."""
    token = sys.argv[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    known: set[tuple[int, int]] = set()
    stdin = sys.stdin.buffer.raw  # type: ignore[attr-defined]
    while True:
        ready, _, _ = select.select([stdin], [], [], 1.0)
        if ready and not stdin.read(4096):  # EOF: the driver closed the pipe or died
            break
        known |= owned_trees(token)
    reap(token, known=known)


if __name__ == "__main__":
    main()
