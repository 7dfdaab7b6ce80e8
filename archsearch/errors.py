"""The library's error types.

Every error a user can cause (a bad config, file, flag or name) is an `ArchsearchError`; the CLI
turns it into one line on stderr and exit code 2. A failure of the environment (a database that
went away or stayed locked mid-search, a full disk) is an `EnvironmentFailure`: one line, exit 1.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class ArchsearchError(Exception):
    """Base class of errors caused by user input, reported as one line."""

    exit_code = 2  # the CLI's exit status for it: bad input


class EnvironmentFailure(ArchsearchError):
    """Something the command depends on failed under it, not its input: exit 1."""

    exit_code = 1


class ConfigError(ArchsearchError, ValueError):
    """An `ArchConfig` (or its JSON form) breaks a rule; the message names the field and rule."""


class UnknownNameError(ArchsearchError, KeyError):
    """A name is not in a registry; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so clean-up runs as on Ctrl-C; the CLI exits 143.

    A `KeyboardInterrupt`: code that settles its work on Ctrl-C settles it on SIGTERM too.
    """


def on_sigterm(signum: int, _frame: object) -> None:
    """The SIGTERM handler the CLI installs from its first instant (`cli.main`)."""
    raise Terminated


def quoted(text: str, limit: int = 40) -> str:
    """User text quoted for a one-line message: escapes for control characters, shortened."""
    shown = text if len(text) <= limit else text[: limit - 3] + "..."
    return ascii(shown) if not shown.isprintable() else f"'{shown}'"
