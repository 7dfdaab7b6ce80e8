"""Starting or joining Ray within a bound, and the cause of a start that failed.

`ray.init` waits on processes outside this one: a local start waits for its GCS and raylet to come
up, a join (`--address`) for a GCS to answer. Ray bounds some of those waits itself, in pieces
(20 one-second GCS connect attempts, 30 s for the raylet to register, each with its own
timeouts), and none of them in a way the user is told; a GCS address that accepts the
connection and never answers was measured waiting far longer. So the start runs under one bound,
`RAY_START_S` (`$ARCHSEARCH_RAY_START_S` to change it), named in the message when it runs out.

A local start that fails ends in Ray's guess ("some of the raylet failed to startup or the GCS
has become overloaded"), while the cause, when there is one, is a line the raylet or the GCS
logged as an error in the session's log folder: `start_failure_cause` finds it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from archsearch.units import env_seconds

RAY_START_ENV = "ARCHSEARCH_RAY_START_S"
# Ray's own waits add up to about a minute on a loaded machine; twice that, so the bound only ends
# a start that is stuck, not one that is slow.
RAY_START_S = 120.0
RETRY_S = 1.0  # how often the bound is raised again once it has run out (see `bounded`)
# A C++ log line of Ray's: "[2026-11-25 02:59:40,883 E 23981 23981] (raylet) main.cc:283: text".
# Severity E (error) or C (fatal: a failed check, the process then ends).
_LOG_LINE = re.compile(r"^\[\S+ \S+ ([EC]) \d+ \d+\] (?:\(\w+\) )?(?:[\w./-]+:\d+: )?(.*\S)")
# The logs of the processes a local start waits for, the raylet's first: it is what did not come up.
_START_LOGS = ("raylet.out", "raylet.err", "gcs_server.out", "gcs_server.err")


class RayStartTimeout(BaseException):
    """The bound ran out while Ray started. A BaseException, like KeyboardInterrupt: Ray's retry
    loops catch `Exception`, and would take it for one more failed connection attempt."""


def start_bound() -> float:
    """The bound in seconds: `$ARCHSEARCH_RAY_START_S`, else `RAY_START_S`."""
    return env_seconds(RAY_START_ENV, RAY_START_S)


# Ray's own waits inside one C++ call, which no Python signal handler interrupts: a GCS connection
# attempt (5 s by default) and the wait for the GCS's first answer (30 s; a join measured 44 s
# under a 3 s bound with them), with Ray's defaults. `shortened_ray_waits` cuts each to fit.
CPP_WAITS = {"RAY_gcs_rpc_server_connect_timeout_s": 5, "RAY_py_gcs_connect_timeout_s": 30}


@contextlib.contextmanager
def shortened_ray_waits(seconds: float) -> Iterator[None]:
    """Cut Ray's C++ waits (`CPP_WAITS`) to a quarter of the bound where that is shorter (at least
    1 s) inside the block, so that a call returns in time for the bound to end it; a value set in
    the environment is kept. Ray reads them on import and as it starts: import and start Ray
    inside the block. The environment is put back as it was when the block ends, so a process
    started later (an archsearch under another bound) does not inherit them as if they were the
    user's. The default bound leaves Ray's defaults as they are."""
    set_here = [name for name in CPP_WAITS if name not in os.environ]
    for name in set_here:
        os.environ[name] = str(max(1, min(CPP_WAITS[name], int(seconds // 4))))
    try:
        yield
    finally:
        for name in set_here:
            os.environ.pop(name, None)


@contextlib.contextmanager
def bounded(seconds: float) -> Iterator[None]:
    """Raise `RayStartTimeout` in the block once `seconds` have passed, and again every `RETRY_S`
    until the block ends: raised at an arbitrary point, an exception can land in a fork handler
    of Ray's process start, where Python prints and drops it; Ray's waits inside one C++ call
    delay it unless shortened (`shortened_ray_waits`). Main thread only (a signal timer); elsewhere
    the block runs unbounded."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    inside = [True]

    def expire(_signum: int, _frame: object) -> None:
        if inside[0]:
            raise RayStartTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, RETRY_S)
    try:
        yield
        inside[0] = False
    finally:
        inside[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def refused(address: str, timeout: float = 5.0) -> str | None:
    """Why nothing can answer at a `HOST:PORT` Ray address ("Connection refused"), found at once;
    None when a connection opens, or for another form of address (`auto`, `ray://...`)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "/" in host:
        return None
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def session_logs(pid: int, since: float, temp_dir: Path | None = None) -> Path | None:
    """The log folder of the newest Ray session process `pid` started since `since` (a time.time()).

    Ray names a session's folder after the process that started it (`session_<date>_<pid>`);
    `session_latest` is no use on a shared machine: it names whichever start came last.
    """
    root = temp_dir or Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray"
    found = []
    for path in root.glob(f"session_*_{pid}"):
        with contextlib.suppress(OSError):
            if path.stat().st_mtime >= since - 1:
                found.append((path.stat().st_mtime, path))
    return max(found)[1] / "logs" if found else None


def start_failure_cause(pid: int, since: float, temp_dir: Path | None = None) -> tuple[str, Path] | None:
    """The cause of a failed local start as (the line, the log it is in): the first fatal line
    (a failed check) of the raylet's or the GCS's logs, else the last error line; None when they
    logged no error (or the session has no folder)."""
    logs = session_logs(pid, since, temp_dir)
    if logs is None:
        return None
    for name in _START_LOGS:
        fatal, error = None, None
        with contextlib.suppress(OSError):
            with open(logs / name, errors="replace") as handle:
                for line in handle:
                    match = _LOG_LINE.match(line)
                    if match is None:
                        continue
                    if match[1] == "C" and fatal is None:
                        fatal = match[2]
                    elif match[1] == "E":
                        error = match[2]
        if fatal or error:
            return (fatal or error)[:500], logs / name  # type: ignore[index]
    return None


@contextlib.contextmanager
def native_stderr_to(path: Path) -> Iterator[None]:
    """What Ray's C++ writes to file descriptor 2 inside (`ray.init` logs its connection warnings
    there before its log files are set up) is appended to `path`; Python's `sys.stderr`, when it
    is that descriptor, goes on writing where it went (a progress bar, an error line)."""
    try:
        sys.stderr.flush()
        python_on_fd2 = sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):  # a replaced stderr (a test runner's buffer)
        python_on_fd2 = False
    path.parent.mkdir(parents=True, exist_ok=True)
    saved, target = os.dup(2), os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    previous = sys.stderr
    try:
        os.dup2(target, 2)
        if python_on_fd2:
            sys.stderr = open(  # closed below; the descriptor is `saved`'s
                saved, "w", buffering=1, encoding=previous.encoding, errors="backslashreplace", closefd=False
            )
        yield
    finally:
        if python_on_fd2:
            sys.stderr.close()
            sys.stderr = previous
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)
