"""A local Ray that does not outlive its driver, however the driver ends.

`ray.init()` starts the cluster's processes (GCS, raylet, agents, workers) under the driver. When
the driver is SIGKILLed, nothing runs its `ray.shutdown()`, and Ray's agents were measured living
on for 60-90 s (after a SIGBUS crash they ignored SIGTERM). So the driver starts this small
watcher first, in a session of its own, with a pipe on its stdin, and marks its environment with
a token that the Ray processes it starts inherit. Ray's agents are started with an environment of
their own, so while the driver lives the watcher also notes, every second, the processes below the
marked ones. When the pipe closes (the driver ended, cleanly or not: the kernel closes a dead
process's files), the watcher stops them all: SIGTERM, then SIGKILL after a grace period.

The watcher is also the witness of a local Ray node that dies under its driver (the raylet
killed, by a memory limit say). Ray's core worker in the driver then ends the process from C++
(`QuickExit`, exit status 1, where Python can neither catch it nor print anything), and the trials
it ran stay `running` in the database. So the driver hands the watcher, once its study is open,
what to do in that case (`Watcher.arm`): the watcher notices the raylet's death at once (a pidfd
on it wakes it), notes whether the driver was still alive then (else the driver died first and
the kernel's parent-death signal took the raylet with it), and, when the driver then ends
without releasing it, prints the one error line the driver could not, with the command that
continues the search, and ends the leases of the driver's running trials so that `--resume`
re-queues them at once. A driver that survives the raylet's death long enough reports it itself
(`pool.RayPool.check_node`) and releases the watcher.

Linux only (it reads /proc); elsewhere the watcher finds nothing and Ray's own shutdown is all.
"""

from __future__ import annotations

import contextlib
import json
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
POLL_S = 1.0  # how often the watcher notes the marked processes' trees
RAYLET = "raylet"  # the raylet's process name (/proc/PID/comm), the node's own process


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


def local_raylet(parent: int, proc: Path = Path("/proc")) -> tuple[int, int] | None:
    """(pid, start time) of the raylet that `parent` started (a local Ray's node), None if none."""
    for pid, (state, ppid, start) in _processes(proc).items():
        if ppid != parent or state in ("Z", "X"):
            continue
        try:
            if (proc / str(pid) / "comm").read_text().strip() == RAYLET:
                return pid, start
        except OSError:
            continue
    return None


def how_it_ended(pid: int, start: int, proc: Path = Path("/proc")) -> str | None:
    """How the process (`pid`, `start`) ended: "was killed by SIGKILL", "exited with status 1",
    or "ended" once its parent has collected it; None while it runs."""
    try:
        fields = (proc / str(pid) / "stat").read_text().rpartition(")")[2].split()
    except OSError:
        return "ended"
    if int(fields[19]) != start:
        return "ended"  # the pid was reused
    if fields[0] not in ("Z", "X"):
        return None
    status = int(fields[49]) if len(fields) > 49 else None  # exit_code (proc(5)), as waitpid's
    if status is None:
        return "ended"
    if status & 0x7F:
        try:
            return f"was killed by {signal.Signals(status & 0x7F).name}"
        except ValueError:
            return f"was killed by signal {status & 0x7F}"
    return f"exited with status {status >> 8}"


def node_died(pid: int, ended: str, work: str) -> str:
    """The start of the line for a local Ray node that died under `work` ("the search", "validate"),
    said by the driver (`pool.RayPool.check_node`) or by the watcher when Ray ended the driver."""
    return (
        f"the local Ray node died under {work} (its raylet, pid {pid}, {ended}; a memory limit or the "
        "OOM killer can do that)"
    )


class Watcher:
    """The driver's end of the watcher: `token` marks the processes to stop; `arm` says what to do
    if Ray ends the driver (module docstring); `release` says the driver ended on its own."""

    def __init__(self, token: str, process: subprocess.Popen) -> None:
        self.token = token
        self._process = process

    def _send(self, message: dict[str, object]) -> None:
        with contextlib.suppress(OSError, ValueError):  # the watcher is gone: nothing to tell
            self._process.stdin.write(json.dumps(message).encode() + b"\n")  # type: ignore[union-attr]
            self._process.stdin.flush()  # type: ignore[union-attr]

    def arm(
        self,
        storage_url: str | None,
        host: str | None,
        continue_with: str | None,
        work: str = "the search",
        kept: str | None = None,
    ) -> None:
        """If the local Ray node dies and takes this driver with it: end the leases of `host`'s
        running trials in `storage_url` (when given) and print the line: the node died under `work`,
        then `kept` (what is left; by default that a resume re-queues the running trials), then
        `continue_with` (a command)."""
        self._send(dict(storage=storage_url, host=host, continue_with=continue_with, work=work, kept=kept))

    def release(self) -> None:
        self._send({"released": True})


@contextlib.contextmanager
def ray_reaped() -> Iterator[Watcher]:
    """Mark the processes started inside (a local Ray) so that they end when this process does.

    Yields the `Watcher`. On a clean exit the watcher is released and stops what Ray's shutdown left.
    """
    token = f"{os.getpid()}-{secrets.token_hex(6)}"
    env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}
    watcher = subprocess.Popen(
        [sys.executable, "-m", "archsearch.search.reaper", token],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env,  # stderr: the driver's, for the line
        start_new_session=True,  # a Ctrl-C to the terminal's process group does not reach it
    )  # fmt: skip
    handle = Watcher(token, watcher)
    previous = os.environ.get(OWNER_ENV)
    os.environ[OWNER_ENV] = token
    try:
        yield handle
    finally:
        if previous is None:
            os.environ.pop(OWNER_ENV, None)
        else:
            os.environ[OWNER_ENV] = previous
        handle.release()
        with contextlib.suppress(OSError):
            watcher.stdin.close()  # type: ignore[union-attr]
        with contextlib.suppress(subprocess.TimeoutExpired):
            watcher.wait(timeout=2 * GRACE_S + 5)


class _Witness:
    """What the watcher learns while its driver runs: the driver's instructions (`Watcher.arm`),
    whether it was released, and how the local raylet ended if it died under a live driver."""

    def __init__(self, driver: int) -> None:
        self.driver = driver
        self.note: dict[str, object] = {}
        self.released = False
        self.raylet: tuple[int, int] | None = None
        self.pidfd: int | None = None
        self.raylet_ended: str | None = None  # set only when the driver outlived its raylet
        self._pending = b""

    def read(self, chunk: bytes) -> None:
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            message = json.loads(line)
            self.released = self.released or bool(message.get("released"))
            self.note.update({k: v for k, v in message.items() if k != "released"})

    def find_raylet(self) -> None:
        if self.raylet is not None or not hasattr(os, "pidfd_open"):
            return
        self.raylet = local_raylet(self.driver)
        if self.raylet is not None:
            with contextlib.suppress(OSError):  # readable once the raylet has ended
                self.pidfd = os.pidfd_open(self.raylet[0])

    def check_raylet(self) -> None:
        """The raylet's pidfd woke the watcher: note how it ended if its driver still lived."""
        pid, start = self.raylet  # type: ignore[misc]
        ended = how_it_ended(pid, start) or "ended"
        driver = _stat(Path(f"/proc/{self.driver}"))
        # A zombie raylet still below the driver died first; so did one whose driver still runs.
        # Otherwise the driver died first, and the kernel's parent-death signal ended the raylet.
        raylet = _stat(Path(f"/proc/{pid}"))
        below_driver = raylet is not None and raylet[0] == "Z" and raylet[1] == self.driver
        if below_driver or (driver is not None and driver[0] not in ("Z", "X")):
            self.raylet_ended = ended
        os.close(self.pidfd)  # type: ignore[arg-type]  # last: a test waits for it, by state
        self.pidfd = None

    def settle(self) -> None:
        """The driver has ended: if its raylet died first and it did not release the watcher, Ray
        ended it: end its trials' leases and print the line it could not."""
        if self.released or self.raylet_ended is None or not self.note:  # not armed: Ray's own exit
            return
        if self.note.get("storage"):
            with contextlib.suppress(Exception):  # best effort: the lease expires anyway
                from archsearch.storage import Storage

                with Storage.open(str(self.note["storage"]), create=False) as db:
                    db.expire_leases(str(self.note["host"]))
        from archsearch.errors import error_line

        work = str(self.note.get("work") or "the search")
        kept = self.note.get("kept") or "a resume re-queues its running trials"
        again = self.note.get("continue_with")
        message = (
            f"{node_died(self.raylet[0], self.raylet_ended, work)} and Ray ended {work} with it; {kept}"  # type: ignore[index]
            + (f"; continue with `{again}`" if again else "")
        )
        sys.stderr.write(error_line(message) + "\n")
        sys.stderr.flush()


def main() -> None:
    """`python -m archsearch.search.reaper TOKEN`: note TOKEN's processes until stdin closes, then
    stop them (and speak for a driver that its Ray node's death ended, `_Witness`)."""
    token = sys.argv[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    witness = _Witness(os.getppid())
    known: set[tuple[int, int]] = set()
    stdin = sys.stdin.buffer.raw  # type: ignore[attr-defined]
    while True:
        waits = [stdin] if witness.pidfd is None else [stdin, witness.pidfd]
        ready, _, _ = select.select(waits, [], [], POLL_S)
        if witness.pidfd is not None and witness.pidfd in ready:
            witness.check_raylet()  # first: the driver may be ending right behind it
        if stdin in ready:
            chunk = stdin.read(4096)
            if not chunk:  # EOF: the driver closed the pipe or died
                break
            witness.read(chunk)
        known |= owned_trees(token)
        witness.find_raylet()
    witness.settle()
    reap(token, known=known)


if __name__ == "__main__":
    main()
