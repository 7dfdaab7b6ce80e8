"""A local Ray that does not outlive its driver, however the driver ends.

`ray.init()` starts the cluster's processes (GCS, raylet, agents, workers) under the driver. When
the driver is SIGKILLed, nothing runs its `ray.shutdown()`, and Ray's agents were measured living
on for 60-90 s (after a SIGBUS crash they ignored SIGTERM). So the driver starts this small
watcher first, in a session of its own, with a pipe on its stdin, and marks its environment with
a token that every Ray process it starts inherits. When the pipe closes (the driver ended, cleanly
or not: the kernel closes a dead process's files), the watcher stops every process whose
environment carries the token: SIGTERM, then SIGKILL after a grace period.

Linux only (it reads /proc); elsewhere the watcher finds nothing and Ray's own shutdown is all.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

OWNER_ENV = "ARCHSEARCH_RAY_OWNER"
GRACE_S = 3.0  # between SIGTERM and SIGKILL


def owned_processes(token: str, proc: Path = Path("/proc")) -> set[int]:
    """The live processes whose environment carries `OWNER_ENV=token` (zombies excluded)."""
    marker = f"{OWNER_ENV}={token}".encode()
    found = set()
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):  # gone meanwhile, or not ours to read
            continue
        if state not in ("Z", "X"):
            found.add(int(entry.name))
    return found


def reap(token: str, grace_s: float = GRACE_S) -> set[int]:
    """Stop every process that `owned_processes(token)` finds; returns the ones signalled."""
    signalled: set[int] = set()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = owned_processes(token)
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        signalled |= left
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 0)
        while owned_processes(token) and time.monotonic() < deadline:
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
    """`python -m archsearch.search.reaper TOKEN`: wait for stdin to close, then reap TOKEN."""
    token = sys.argv[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        sys.stdin.buffer.read()  # returns at EOF: the driver closed the pipe or died
    reap(token)


if __name__ == "__main__":
    main()
