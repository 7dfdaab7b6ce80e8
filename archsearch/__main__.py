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


def main() -> None:
    previous = {s: signal.signal(s, _while_loading) for s in (signal.SIGINT, signal.SIGTERM)}
    from archsearch.cli import main as run

    for s, handler in previous.items():
        signal.signal(s, handler)
    run()


if __name__ == "__main__":
    main()
