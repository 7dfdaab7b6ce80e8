"""`python -m archsearch` and the `archsearch` console script.

A signal while the command line loads (its imports take a fraction of a second, seconds on a busy
machine) ends as one a moment later would: one line, exit 130 for SIGINT and 143 for SIGTERM,
rather than a traceback from inside an import or a silent exit by the default action. Nothing has
started then, so there is nothing to clean up. `cli.main` installs the handlers for the run.
"""

from __future__ import annotations

import os
import signal


def _while_loading(signum: int, _frame: object) -> None:
    os.write(2, f"error: interrupted by {signal.Signals(signum).name}\n".encode())
    os._exit(128 + signum)


# How long the interpreter may take to tear down once the command has ended, before SIGALRM's
# default action ends it: torch's and pandas' modules unload in well under a second.
TEARDOWN_BOUND_S = 30


def _settled() -> None:
    """The command has ended and said how: its output is whole, its line printed, its exit code
    chosen. A signal while the interpreter then tears down (0.3 s with torch loaded, after Python
    has put the default actions back) would kill it silently with 130 or 143 after a complete run
    (`export` SIGTERMed as it exited: its folder written, yet exit 143 and no line).
    Ignored from here, so the exit code stays the command's; a teardown that hangs is still ended
    by SIGALRM after TEARDOWN_BOUND_S (Python leaves an ignored signal ignored while it finalises).
    """
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    signal.alarm(TEARDOWN_BOUND_S)


def main() -> None:
    previous = {s: signal.signal(s, _while_loading) for s in (signal.SIGINT, signal.SIGTERM)}
    from archsearch.cli import main as run

    for s, handler in previous.items():
        signal.signal(s, handler)
    try:
        run(on_end=_settled)  # called by the command boundary as the command ends
    finally:
        _settled()  # and again, for an end outside it (Typer's own usage errors)


if __name__ == "__main__":
    main()
