"""Running the console script the way a person sees it: stderr on a pseudo-terminal."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time


def under_a_terminal(args: list[str], cwd, timeout: float = 300) -> tuple[int, str, str]:
    """Run `archsearch ARGS` with stderr on a pseudo-terminal, as a person sees it; stdout piped.

    Returns (exit code, stdout, what the terminal showed)."""
    master, slave = os.openpty()
    env = {**os.environ, "COLUMNS": "200", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "archsearch", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
        stderr=slave, stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    os.close(slave)
    shown, deadline = bytearray(), time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every copy of the slave is closed, the process is gone
                    break
                if not chunk:
                    break
                shown += chunk
            elif proc.poll() is not None:
                break
        stdout, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, stdout, shown.decode(errors="replace")
