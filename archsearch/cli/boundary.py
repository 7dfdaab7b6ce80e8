"""The command boundary: every user-facing error of a command becomes one line on stderr and an
exit code, here and nowhere else.

A user error (an `ArchsearchError`) is `error: ...` and exit code 2; a failure of the environment
(`EnvironmentFailure`, or an `OSError` such as an output path that cannot be written) one line and
exit code 1 (so does running out of memory); Ctrl-C one line and 130, SIGTERM 143. A bug keeps its
traceback. `CommandGroup` is the class of every Typer app (`cli.common`).
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperGroup

from archsearch.errors import ArchsearchError, Terminated, error_line

EXIT_USAGE = 2  # Click's code for bad usage; archsearch uses it for every bad input
EXIT_ENVIRONMENT = 1  # a failure of what the command depends on (`errors.EnvironmentFailure`)
EXIT_SIGINT = 130  # 128 + SIGINT, as shells report a process Ctrl-C stopped
EXIT_SIGTERM = 143  # 128 + SIGTERM
OUT_OF_MEMORY = (
    "out of memory: this process hit its memory limit (the machine's or GPU's, ulimit -v, a "
    "container's); raise it or use a smaller shape, batch or context"
)
# How the dynamic loader says a library did not fit the address space (ImportError's text):
# recognised so that `profile` under `ulimit -v 500000` ends in one line, not a traceback from torch.
_MAP_FAILURES = ("failed to map segment from shared object", "Cannot allocate memory")
# Click's usage error class, from the Click that Typer runs: recent Typers vendor a copy whose
# classes are not `click`'s. The public typer.BadParameter derives from it in both cases.
_USAGE_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def _allocation_failure(exc: BaseException) -> bool:
    """Python's MemoryError, or torch's allocation failure, a RuntimeError (the CPU allocator's
    "can't allocate memory", CUDA's OutOfMemoryError): `profile --serve --context 100000000` on the
    CPU under `ulimit -v` ended in torch's traceback. Only torch raises those, so only once it is
    loaded is `evaluators.device` (which imports it) asked."""
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, ImportError):  # a shared library that cannot be mapped: torch under `ulimit -v`
        return any(text in str(exc) for text in _MAP_FAILURES)
    if "torch" not in sys.modules:
        return False
    from archsearch.evaluators.device import is_memory_error

    return is_memory_error(exc)


def os_error_text(exc: OSError) -> str:
    """An `OSError` as `cannot use PATH: Permission denied`, the file named when known."""
    what = exc.strerror or type(exc).__name__
    paths = [p for p in (exc.filename, exc.filename2) if p is not None]
    if paths:
        return f"cannot use {' -> '.join(map(str, paths))}: {what}"
    # No file named: a write to stdout (`> /dev/full`) said "No space left on device: [Errno 28]
    # No space left on device".
    return what if exc.strerror else f"{what}: {exc}"


def interrupted(exc: KeyboardInterrupt, again: str | None = None) -> int:
    """Says which signal stopped the command, in one line on stderr (with `again`, the command that
    continues its work); returns its exit code.

    Read by the command boundary (`CommandGroup.invoke`), by `cli.main` around it, for a signal while
    Typer builds the command line from the signatures, before any command runs, and by `search`
    for a second signal that cut its clean-up short.
    """
    terminated = isinstance(exc, Terminated)
    then = f"; continue with `{again}`" if again else ""
    typer.echo(f"error: interrupted by {'SIGTERM' if terminated else 'SIGINT'}{then}", err=True)
    return EXIT_SIGTERM if terminated else EXIT_SIGINT


def usage_error_line(exc: Exception) -> str:
    """Click's usage error as the one line archsearch prints, whatever Click wraps."""
    return "error: " + " ".join(exc.format_message().split()) + " (see --help)"  # type: ignore[attr-defined]


class CommandGroup(TyperGroup):
    """Turns library errors into one line on stderr and exit code 2, at the command boundary.

    Click's usage errors in a command's arguments (a bad value, an unknown flag or command) are
    raised here too, while the command's arguments are parsed: they get the same one line instead
    of Click's usage box; so do those before the command name (`parse_args`).
    """

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        # Before the command boundary: Typer's own handler would turn a signal while the arguments
        # are parsed into a silent exit 130, SIGTERM too.
        try:
            return super().make_context(info_name, args, parent, **extra)
        except KeyboardInterrupt as exc:
            raise typer.Exit(interrupted(exc)) from None

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except _USAGE_ERROR as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # no arguments: the help, not an error
                raise
            typer.echo(usage_error_line(exc), err=True)
            raise typer.Exit(EXIT_USAGE) from None

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return self._invoke(ctx)
        finally:
            # The command has ended: a signal in Click's teardown replaced its exit (0, or the code
            # just chosen) with a KeyboardInterrupt traceback and death by SIGINT (-2), a race the
            # suite met under load. Only the console script sets it: in-process callers keep theirs.
            if on_command_end is not None and ctx.parent is None:
                on_command_end()

    def _invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ArchsearchError as exc:
            typer.echo(error_line(str(exc)), err=True)
            raise typer.Exit(exc.exit_code) from None
        except _USAGE_ERROR as exc:
            typer.echo(usage_error_line(exc), err=True)
            raise typer.Exit(EXIT_USAGE) from None
        except OSError as exc:  # an output path that cannot be written, a full disk
            typer.echo(error_line(os_error_text(exc)), err=True)
            # A name longer than the file system takes is the input's fault, not the environment's.
            raise typer.Exit(EXIT_USAGE if exc.errno == errno.ENAMETOOLONG else EXIT_ENVIRONMENT) from None
        # A memory limit hit outside a trial, even on import (a library the loader could not map).
        except (MemoryError, RuntimeError, ImportError) as exc:
            if not _allocation_failure(exc):
                raise
            typer.echo(error_line(OUT_OF_MEMORY), err=True)  # the frames that held the memory are gone
            raise typer.Exit(EXIT_ENVIRONMENT) from None
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (`errors.Terminated`) before a search runs
            raise typer.Exit(interrupted(exc)) from None


# What the console script (`cli.main`) has the boundary call once a command has ended; None in
# process (tests' CliRunner, a notebook).
on_command_end: Callable[[], None] | None = None
