"""The `archsearch` command line: a thin layer over the library, one module per command group.

- `boundary`: the command boundary: every error one line and an exit code, signals included;
- `common`: the Typer apps, the options defined once, output helpers;
- `shape`: cost, presets, width, config new / check;
- `train`: train (a proxy run on a budget);
- `profile`: profile (one training step, kernel by kernel);
- `gpus`: align, devices, fit-device (the GPU catalogue and its model);
- `space`: space check;
- `search`: search;
- `validate`: validate;
- `ladder`: ladder;
- `predictions`: the ladder's lines in export --scale-to and pareto --at-size;
- `results`: pareto, studies, trials;
- `export`: export;
- `report`: report, the HTML file that shares a study;
- `serving_lines`: the serving lines of profile --serve and export --scale-to;
- `reference`: the reference pages generated from the app and the space-file schema;
- `progress`: the progress bars, fed by the library's callbacks.

Each command parses its options, calls the library and prints; importing this package loads no
torch, Ray, Optuna or pandas (commands import what they need when they run).
"""

from __future__ import annotations

import errno
import io
from collections.abc import Callable

# Importing the command modules registers their commands on `app`, in this order in --help.
# isort: off
from archsearch.cli import shape, train, profile, gpus, space, search  # noqa: F401
from archsearch.cli import validate, ladder, results, export, report  # noqa: F401

# isort: on
from archsearch.cli.common import app

__all__ = ["app", "main"]


def main(on_end: Callable[[], None] | None = None) -> None:
    """Console-script entry point: SIGTERM, from the first instant, ends like Ctrl-C (exit 143).

    `on_end` is called by the command boundary once the command has ended, its lines printed and
    its exit code chosen (`__main__` ignores SIGINT and SIGTERM from there).
    """
    import signal
    import sys

    from archsearch.cli import boundary
    from archsearch.cli.boundary import interrupted
    from archsearch.errors import on_sigterm

    boundary.on_command_end = on_end
    signal.signal(signal.SIGTERM, on_sigterm)
    if sys.stdout is None:  # started with its stdout closed (`>&-`): print() wrote nothing, exit 0
        sys.stdout = _ClosedStdout()
    try:
        app()
    except KeyboardInterrupt as exc:  # outside the command boundary: while Typer reads the signatures
        sys.exit(interrupted(exc))


class _ClosedStdout(io.TextIOBase):
    """What stands for a stdout the process was started without: every write fails as a write to
    a closed descriptor does, so a command that prints its result ends in one line, exit 1 (the
    command boundary's `OSError`), while one that prints nothing runs as usual."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "stdout is closed: nothing could be printed")

    def isatty(self) -> bool:
        return False
