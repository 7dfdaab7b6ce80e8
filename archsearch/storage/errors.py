"""Storage's errors, and how a database driver's failure is told apart: the input's fault (exit 2),
the environment's (a server gone, a lock held too long, a full disk, a damaged file: exit 1), or a
bug's. Every error here is an `ArchsearchError` of `archsearch.errors`, and those the environment
causes are its `EnvironmentFailure` too.
"""

from __future__ import annotations

import re

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from archsearch.errors import ArchsearchError, EnvironmentFailure


class StorageError(ArchsearchError):
    """The database cannot be opened, reached or written, or holds something unexpected."""


class SchemaVersionError(StorageError):
    """The database was written by a different version of archsearch's schema."""


class StudyExistsError(StorageError):
    """A study of that name exists (or another driver created it at the same moment)."""


class ReadOnlyStorageError(StorageError):
    """The database can be read but not written here: a read-only file, folder, mount or role."""


class StorageUnavailableError(StorageError, EnvironmentFailure):
    """The database failed under a statement: a server that went away, a lock held past the
    timeout, a full disk, an I/O error. Not the input's fault: the CLI exits 1.

    `cause` is the driver's error as one line (`OperationalError: database is locked`).
    """

    def __init__(self, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class DamagedStorageError(StorageError, EnvironmentFailure):
    """The database file is damaged (pages SQLite cannot read): the disk's or a copy's fault,
    not the input's; no search can continue on it, so the CLI exits 1 without a resume hint."""


class ValueRefusedError(StorageError):
    """The database refused a value it was given: a constraint broken, a number out of range."""


def failure_cause(exc: BaseException) -> str:
    """The database driver's error behind `exc` as one line, e.g. `OperationalError: database is
    locked`: Optuna's `StorageInternalError` says only that a commit failed, its cause says why."""
    seen: BaseException | None = exc
    for _ in range(20):  # a chain of causes and contexts; bounded, in case one loops
        if seen is None:
            break
        if isinstance(seen, StorageUnavailableError) and seen.cause:
            return seen.cause
        if isinstance(seen, DBAPIError):
            return f"{type(seen.orig).__name__}: {one_line(seen)}"
        seen = seen.__cause__ or seen.__context__
    return f"{type(exc).__name__}: {one_line(exc)}"


def database_failure(exc: BaseException) -> bool:
    """Whether `exc` (from archsearch's or Optuna's calls) is the database failing, not a bug.

    SQLAlchemy's operational and interface errors are the connection, the server or the file
    failing (`StorageUnavailableError` once archsearch's session has turned them); Optuna wraps
    them as its `StorageInternalError`. Integrity and data errors are a value the database
    refused; other database errors (a corrupt file, a bug's SQL) are not the database failing.
    """
    if isinstance(exc, StorageError):
        return isinstance(exc, StorageUnavailableError)
    if type(exc).__name__ == "StorageInternalError":  # optuna.exceptions, not imported for a name
        return True
    return isinstance(exc, (OperationalError, InterfaceError))


def one_line(exc: BaseException) -> str:
    """The first line of `exc`'s message (its driver error's, when it wraps one)."""
    orig = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(orig).splitlines() if line.strip()]
    return lines[0] if lines else type(orig).__name__


# SQLite's primary result codes (sqlite3 exposes them on its errors since Python 3.11) for a
# database this process may read but not write: READONLY (a 0444 or immutable file, a read-only
# mount: SQLite then opens it read-only) and PERM (access denied). CANTOPEN is not one: a file
# that cannot be opened at all cannot be read either.
_SQLITE_READ_ONLY = {3, 8}  # SQLITE_PERM, SQLITE_READONLY
# ...but READONLY_DIRECTORY stops readers too: a WAL database needs its -wal and -shm files, and
# SQLite cannot create them in a read-only folder.
_SQLITE_READONLY_DIRECTORY = 1544
# PostgreSQL's SQLSTATE for a write in a read-only transaction (a hot standby, a database or
# role with default_transaction_read_only). A missing privilege (42501) is not one: it refuses
# reads too, and its own message says which.
_PG_READ_ONLY = {"25006"}
# Another process's lock held past the bound: SQLite's BUSY (the busy timeout ran out), and
# PostgreSQL's lock_not_available (the lock_timeout set in `engine.engine_kwargs`).
_SQLITE_BUSY = 5
# A file SQLite finds damaged (CORRUPT: a truncated or overwritten file), and the environment
# failing under it (IOERR: an I/O error, a file-size limit; FULL: a full disk): exit 1, as for the
# same faults mid-search. NOTADB (a file that is not a database at all) stays the input's fault.
SQLITE_CORRUPT = 11
SQLITE_ENVIRONMENT = {10, 13}  # SQLITE_IOERR, SQLITE_FULL
_PG_LOCK_NOT_AVAILABLE = "55P03"
# A PostgreSQL server that is down, restarting or full: libpq's connection failures carry no
# SQLSTATE, only their text. The environment's fault, exit 1, as the same server stopping
# mid-search is (a missing database or role, a bad password stay the input's: exit 2).
_PG_UNREACHABLE = re.compile(
    r"Connection refused|timeout expired|No route to host|Network is unreachable|Connection reset|"
    r"server closed the connection|the database system is (?:starting up|shutting down|in recovery)|"
    r"too many (?:connections|clients)|remaining connection slots",
    re.IGNORECASE,
)


def refused_writes(exc: DBAPIError) -> bool:
    """Whether a database error says this process may not write the database."""
    orig = exc.orig
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _SQLITE_READ_ONLY  # extended codes keep the primary in the low byte
    return getattr(orig, "sqlstate", None) in _PG_READ_ONLY


def unreachable(exc: DBAPIError) -> bool:
    """Whether a PostgreSQL connection failed because the server is not there to answer."""
    return getattr(exc.orig, "sqlite_errorcode", None) is None and bool(_PG_UNREACHABLE.search(str(exc.orig)))


def busy(exc: DBAPIError) -> bool:
    """Whether a database error says another process held a lock past the bound."""
    orig = exc.orig
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF == _SQLITE_BUSY
    return getattr(orig, "sqlstate", None) == _PG_LOCK_NOT_AVAILABLE


def sqlite_code(exc: DBAPIError) -> int:
    """SQLite's primary result code of `exc` (0 for another driver's error): extended codes keep
    the primary in the low byte."""
    return (getattr(exc.orig, "sqlite_errorcode", None) or 0) & 0xFF


def damaged_error(display_url: str, why: str) -> DamagedStorageError:
    """The one line for a damaged database (`why`: what was found) and what to do about it."""
    return DamagedStorageError(
        f"the database {display_url} is damaged ({why}): restore it from a copy, or give another --storage"
    )


def read_only_error(exc: DBAPIError, display_url: str, sqlite: bool) -> ReadOnlyStorageError:
    """The one line for a database this process may not write, and what to check."""
    if getattr(exc.orig, "sqlite_errorcode", None) == _SQLITE_READONLY_DIRECTORY:
        return ReadOnlyStorageError(
            f"cannot use the database {display_url}: its folder is read-only, and SQLite must "
            "create the database's -wal and -shm files there, even to read it; make the folder "
            "writable or copy the database to one"
        )
    check = (
        "the permissions of the file and its folder"
        if sqlite
        else "whether the server is a standby or sets default_transaction_read_only"
    )
    return ReadOnlyStorageError(
        f"cannot write the database {display_url}: {one_line(exc)}; check {check}, or give another --storage"
    )
