"""The library's error types.

Every error a user can cause (a bad config, file, flag or name) is an `ArchsearchError`; the CLI
turns it into one line on stderr and exit code 2. A failure of the environment (a database that
went away or stayed locked mid-search, a full disk) is an `EnvironmentFailure`: one line, exit 1.
Anything else is a bug and keeps its traceback.

The database's errors are these two kinds seen from storage: `archsearch.storage.errors` defines
them and tells which kind a database driver's failure is.
"""

from __future__ import annotations

MAX_LINE = 1_000  # an error line longer than this is cut: a message may quote a huge value


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


# What a JSON or TOML reader's ValueError means once its own decode errors are caught: Python
# converts no integer of more than 4,300 digits (`sys.get_int_max_str_digits`).
HUGE_INTEGER = "a number of more than 4,300 digits"


def quoted(text: str, limit: int = 40) -> str:
    """User text quoted for a one-line message: escapes for control characters, shortened."""
    shown = text if len(text) <= limit else text[: limit - 3] + "..."
    return ascii(shown) if not shown.isprintable() else f"'{shown}'"


def error_line(message: str) -> str:
    """`error: message` as one line: line breaks folded, a long message cut (with what was cut).

    The CLI's boundary prints every error so (`cli.boundary`), and so does the search's watcher
    (`search.reaper`) for a driver that Ray ended before it could.
    """
    text = " ".join(line.strip() for line in message.splitlines() if line.strip())
    if len(text) > MAX_LINE:
        text = f"{text[: MAX_LINE - 40]}... ({len(text) - MAX_LINE + 40:,} characters cut)"
    return f"error: {text}"
