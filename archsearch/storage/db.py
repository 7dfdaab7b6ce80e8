"""The trial database: one SQLAlchemy URL holding Optuna's study and archsearch's own tables.

Design (BRIEF.md section 8 measured how this stack fails):
- SQLite runs in WAL mode with a 30 s busy timeout and writes with `BEGIN IMMEDIATE`: a deferred
  transaction that later needs the write lock fails at once whatever the timeout, so every
  transaction here, and in Optuna's engine on the same file, takes the lock when it begins.
- PostgreSQL engines get `pool_pre_ping` (Optuna sets it only for MySQL) and a small pool.
- Every wait on the database is bounded: SQLite's busy timeout; on PostgreSQL the connect
  timeout, a lock timeout as long as SQLite's, TCP keepalives and a user timeout for a network
  that goes away mid-statement, and a client-side bound on each statement and commit for a server
  that is there but never answers (`watchdog`).
- A storage opened to read (`Storage.open(read_only=True)`, every command that only reads) never
  changes the database: it keeps the file's journal mode, creates and upgrades nothing, refuses
  writes (SQLite's `query_only`, PostgreSQL's read-only transactions), and never checkpoints a
  WAL that a stopped writer left (it opens such a file read-only).
- Creating the tables is serialised between processes (a file lock for SQLite, an advisory lock
  for PostgreSQL), so several searches can start on a new database at once.
- Each trial's results are written in one transaction (`finish_trial`); the driver is the only
  writer of trial state, and workers hold no connection.
- Records that leave this module are frozen dataclasses, never ORM objects.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import socket
import sqlite3
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ColumnElement,
    Engine,
    Float,
    Integer,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    insert,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DataError,
    DBAPIError,
    IntegrityError,
    InterfaceError,
    NoSuchModuleError,
    OperationalError,
    PendingRollbackError,
    SQLAlchemyError,
)
from sqlalchemy.orm import Session

from archsearch.errors import ArchsearchError, EnvironmentFailure, UnknownNameError, quoted
from archsearch.space.config import ArchConfig
from archsearch.space.costs import flop_counts, kv_cache_bytes_per_token, param_counts
from archsearch.space.objectives import OBJECTIVES, LossRule, curve_change
from archsearch.storage import schema
from archsearch.storage.schema import SCHEMA_VERSION
from archsearch.trial import COMPLETE, FINISHED, PRUNED, RUNNING, TrialOutcome, check_state
from archsearch.units import short_number

if TYPE_CHECKING:
    import optuna

DEFAULT_STORAGE_URL = "sqlite:///archsearch.db"
STORAGE_ENV = "ARCHSEARCH_STORAGE"
BUSY_TIMEOUT_S = 30  # 5 s gave "database is locked" at 64 writers, 30 s none (BRIEF.md section 8)
CONNECT_TIMEOUT_S = 15  # a PostgreSQL server that does not answer (libpq's connect_timeout)
TCP_USER_TIMEOUT_S = 60  # data sent to a PostgreSQL server that stays unacknowledged this long: it is gone
READ_ONLY = "archsearch_read_only"  # execution option of the sessions that only read
_PG_INIT_LOCK = 0x61726368  # "arch": the advisory lock id that serialises table creation


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
            return f"{type(seen.orig).__name__}: {_one_line(seen)}"
        seen = seen.__cause__ or seen.__context__
    return f"{type(exc).__name__}: {_one_line(exc)}"


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


def storage_url(url: str | None = None) -> str:
    """The URL to use: `url`, else `$ARCHSEARCH_STORAGE`, else `sqlite:///archsearch.db`."""
    if url is not None and not url.strip():  # `--storage ""` was the default database, silently
        raise StorageError("--storage is empty: give a database URL (e.g. sqlite:///archsearch.db)")
    return url or os.environ.get(STORAGE_ENV) or DEFAULT_STORAGE_URL


# ------------------------------------------------------------------------------------------------
# Records (what leaves storage)
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StudyRecord:
    name: str
    spec_fingerprint: str
    spec_source: str
    spec: dict[str, Any]
    objectives: tuple[str, ...]
    created_at: float
    counts: dict[str, int] | None = None  # trials by state; None: not counted (`require_study`)

    @property
    def finished(self) -> int:
        if self.counts is None:
            raise ValueError(f"study {self.name!r} was read without its trial counts")
        return sum(self.counts.get(s, 0) for s in FINISHED)

    @property
    def size_beta(self) -> float | None:
        """The study's loss objective credits size by this beta (`objectives.loss_objective`);
        None: it does not (and studies from before it existed)."""
        beta = self.spec.get("size_beta")
        return None if beta is None else float(beta)

    @property
    def loss_rule(self) -> LossRule:
        """The study's loss objective (`objectives.LossRule`): its `[objectives]` size_beta and
        extrapolate (0 in studies from before it existed)."""
        return LossRule(self.size_beta, float(self.spec.get("extrapolate") or 0.0))


@dataclass(frozen=True)
class TrialRecord:
    """One trial row. `values` holds every column by name (the flat shape, costs and results)."""

    id: int
    study: str
    number: int | None
    status: str
    reason: str | None
    attempts: int
    params: dict[str, Any]
    config: ArchConfig | None
    values: dict[str, Any]

    def __getitem__(self, column: str) -> Any:
        return self.values[column]


@dataclass(frozen=True)
class LongRunRecord:
    """One stored long run: a trial's shape retrained at `multiplier` x the proxy's tokens."""

    study: str
    trial_number: int
    multiplier: float
    seed: int
    tokens: int
    val_loss: float
    val_curve: tuple[tuple[int, float], ...]
    settings: dict[str, Any]
    device_fingerprint: str | None
    corpus_fingerprint: str | None
    wall_time_s: float | None
    created_at: float

    @property
    def key(self) -> tuple[int, float, int]:
        """(trial number, multiplier, seed): what a rerun matches to skip a stored run."""
        return (self.trial_number, self.multiplier, self.seed)


@dataclass(frozen=True)
class LadderRungRecord:
    """One stored rung of a size ladder: a trial's design at one size (`config`), trained."""

    study: str
    trial_number: int
    tokens_per_param: float
    batch_size: int  # sequences per training step
    target_params: int
    shape_key: str  # sha256 of the config's JSON: one rung per shape
    config: ArchConfig
    params_total: int
    params_non_embedding: int
    seed: int
    tokens: int
    val_loss: float
    val_curve: tuple[tuple[int, float], ...]
    settings: dict[str, Any]
    device_fingerprint: str | None
    corpus_fingerprint: str | None
    wall_time_s: float | None
    created_at: float

    @property
    def key(self) -> tuple[int, float, int, str, int]:
        """(trial number, tokens per parameter, batch size, shape key, seed): what a rerun matches to
        skip it."""
        return (self.trial_number, self.tokens_per_param, self.batch_size, self.shape_key, self.seed)

    @property
    def recipe(self) -> tuple[float, int]:
        """(tokens per parameter, batch size): the rungs of one recipe share one law."""
        return (self.tokens_per_param, self.batch_size)


def shape_key(cfg: ArchConfig) -> str:
    """The key a ladder rung's shape is stored under: sha256 of its canonical JSON."""
    return hashlib.sha256(cfg.to_json(indent=None).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ValidationRecord:
    """One stored `validate` report."""

    id: int
    study: str
    multiplier: float
    seeds: int
    report: dict[str, Any]
    created_at: float


# ------------------------------------------------------------------------------------------------
# Engines
# ------------------------------------------------------------------------------------------------


def _parse_url(url: str) -> URL:
    try:
        return make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        shown = re.sub(r"(//[^/@:]*:)[^/@]*@", r"\1***@", url)  # a password, unparsed, is still hidden
        raise StorageError(f"not a database URL: {shown!r} (e.g. {DEFAULT_STORAGE_URL})") from None


def _sqlite_path(url: URL) -> Path:
    if not url.database or url.database == ":memory:":
        raise StorageError("an in-memory SQLite database cannot hold a search; give a file path")
    if url.query:
        # archsearch opens the file its own way (`_engine_kwargs`); the options were honoured by
        # some connections and not others: `?mode=ro&uri=true` sent a search's trials to a new
        # file named `trials.db?mode=ro`, the database named left untouched.
        raise StorageError(f"{_masked(url)}: a SQLite URL takes no options; give sqlite:///PATH")
    if url.database.endswith("/"):  # sqlite:///new/ made a database file named `new` (probe 9)
        raise StorageError(
            f"{_masked(url)} names a folder: give the database file, e.g. {url.database}archsearch.db"
        )
    return Path(url.database)


def database_files(url: str | None) -> dict[Path, str]:
    """The files of the SQLite database at `url` (see `storage_url`), the database and its WAL,
    index and journal beside it, each with what to call it; none for a server's database. A
    command's outputs are checked against them (`fileio.check_writable`).

    Raises:
        StorageError: a malformed URL, an in-memory database or a SQLite URL with options.
    """
    parsed = _parse_url(storage_url(url))
    if parsed.get_backend_name() != "sqlite":
        return {}
    path = _sqlite_path(parsed)
    what = f"the database {_masked(parsed)}"
    return {
        path: what,
        **{path.with_name(path.name + s): f"a file of {what}" for s in ("-wal", "-shm", "-journal")},
    }


def _use_immediate_transactions(engine: Engine, reader: bool = False) -> None:
    """SQLite: WAL, a busy timeout, and `BEGIN IMMEDIATE` for every transaction of `engine`; for
    a `reader`, the file's own journal mode (switching it to WAL rewrites the file's header),
    `query_only` (a write fails instead of changing the file) and plain `BEGIN`s.

    This is SQLAlchemy's documented pysqlite recipe: the driver's own transaction handling is off
    (`isolation_level = None`) and SQLAlchemy's "begin" event emits the BEGIN instead.
    """

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000}")
        if reader:
            cursor.execute("PRAGMA query_only = ON")
        # A writer's file is put in WAL mode (persistent; local disks only) once `Storage.open` has
        # found it to be archsearch's (`_use_wal`).
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        # Reads take no write lock (WAL readers never block, nor wait for, the writer).
        read_only = reader or connection.get_execution_options().get(READ_ONLY, False)
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def _engine_kwargs(url: URL, reader: bool = False) -> dict[str, Any]:
    if url.get_backend_name() == "sqlite":
        kwargs = {"connect_args": {"timeout": BUSY_TIMEOUT_S}}
        path = _sqlite_path(url)
        if reader and _wal_left(path):
            # Read-only: a read-write connection that closes last folds the WAL into the file
            # (SQLite's checkpoint on close), rewriting it; a read-only one leaves both as they are.
            kwargs["creator"] = lambda: sqlite3.connect(
                f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S
            )
        return kwargs
    # pre-ping drops connections a server or proxy closed; a driver needs few connections.
    kwargs: dict[str, Any] = {"pool_pre_ping": True, "pool_size": 2, "max_overflow": 4}
    if url.get_backend_name() == "postgresql":
        settings = f"-c lock_timeout={BUSY_TIMEOUT_S * 1000}"  # another driver's lock: as SQLite's busy wait
        if reader:  # the server refuses a write in any of this engine's transactions
            settings += " -c default_transaction_read_only=on"
        kwargs["connect_args"] = {
            "connect_timeout": CONNECT_TIMEOUT_S,  # libpq's own bound: a silent host would wait for TCP's
            # A network gone mid-statement is noticed within about a minute, not after the kernel's
            # two hours of TCP keepalive; a server that is there and never answers, by `watchdog`.
            "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3,
            "tcp_user_timeout": TCP_USER_TIMEOUT_S * 1000,
            "options": settings,
        }  # fmt: skip
        if url.get_driver_name() == "psycopg":  # a server that is there and never answers (`watchdog`)
            from archsearch.storage.watchdog import BoundedCursor

            kwargs["connect_args"]["cursor_factory"] = BoundedCursor
    return kwargs


def _watched(engine: Any) -> Any:
    """`engine`, its commits and rollbacks bounded too on psycopg (`watchdog.watch_engine`)."""
    if engine.url.get_backend_name() == "postgresql" and engine.url.get_driver_name() == "psycopg":
        from archsearch.storage.watchdog import watch_engine

        watch_engine(engine)
    return engine


def _wal_left(path: Path) -> bool:
    """Whether the SQLite database at `path` has a WAL with frames in it beside it: a writer is
    running, or one stopped without the checkpoint its last close makes."""
    try:
        return path.with_name(path.name + "-wal").stat().st_size > 0
    except OSError:
        return False


def _one_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(orig).splitlines() if line.strip()]
    return lines[0] if lines else type(orig).__name__


def _masked(url: URL) -> str:
    return url.render_as_string(hide_password=True)


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
# PostgreSQL's lock_not_available (the lock_timeout set in `_engine_kwargs`).
_SQLITE_BUSY = 5
# A file SQLite finds damaged (CORRUPT: a truncated or overwritten file), and the environment
# failing under it (IOERR: an I/O error, a file-size limit; FULL: a full disk): exit 1, as for the
# same faults mid-search. NOTADB (a file that is not a database at all) stays the input's fault.
_SQLITE_CORRUPT = 11
_SQLITE_ENVIRONMENT = {10, 13}  # SQLITE_IOERR, SQLITE_FULL
_PG_LOCK_NOT_AVAILABLE = "55P03"
# The tables Optuna's RDB storage makes: a SQLite file holding only these (and archsearch's) may
# become an archsearch database; one holding any other table is another application's file.
_OPTUNA_TABLES = frozenset(
    {
        "alembic_version", "version_info", "studies", "study_directions", "study_user_attributes",
        "study_system_attributes", "trials", "trial_user_attributes", "trial_system_attributes",
        "trial_params", "trial_values", "trial_intermediate_values", "trial_heartbeats",
    }
)  # fmt: skip
# A PostgreSQL server that is down, restarting or full: libpq's connection failures carry no
# SQLSTATE, only their text. The environment's fault, exit 1, as the same server stopping
# mid-search is (a missing database or role, a bad password stay the input's: exit 2).
_PG_UNREACHABLE = re.compile(
    r"Connection refused|timeout expired|No route to host|Network is unreachable|Connection reset|"
    r"server closed the connection|the database system is (?:starting up|shutting down|in recovery)|"
    r"too many (?:connections|clients)|remaining connection slots",
    re.IGNORECASE,
)


def _not_optuna(conn: Any, names: set[str]) -> str | None:
    """The first of `names` (tables named as Optuna's) whose columns lack the keys of Optuna's table
    of that name, or None: another application's `studies` or `trials` table passed the name
    check, and the search then created archsearch's and Optuna's tables beside it (probe 9). The
    primary, foreign and unique keys have been the same in every Optuna schema, so an older Optuna's
    tables pass."""
    from optuna.storages._rdb import models

    expected = {
        t.name: {c.name for c in t.columns if c.primary_key or c.foreign_keys or c.unique}
        for t in models.BaseModel.metadata.sorted_tables
    }
    expected["alembic_version"] = {"version_num"}
    inspector = inspect(conn)
    for name in sorted(names):
        if not expected.get(name, set()) <= {c["name"] for c in inspector.get_columns(name)}:
            return name
    return None


def _read_only(exc: DBAPIError) -> bool:
    """Whether a database error says this process may not write the database."""
    orig = exc.orig
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _SQLITE_READ_ONLY  # extended codes keep the primary in the low byte
    return getattr(orig, "sqlstate", None) in _PG_READ_ONLY


def _unreachable(exc: DBAPIError) -> bool:
    """Whether a PostgreSQL connection failed because the server is not there to answer."""
    return getattr(exc.orig, "sqlite_errorcode", None) is None and bool(_PG_UNREACHABLE.search(str(exc.orig)))


def _busy(exc: DBAPIError) -> bool:
    """Whether a database error says another process held a lock past the bound."""
    orig = exc.orig
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF == _SQLITE_BUSY
    return getattr(orig, "sqlstate", None) == _PG_LOCK_NOT_AVAILABLE


# ------------------------------------------------------------------------------------------------
# Storage
# ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _lock_file(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path`, and remove the file before letting go, so no lock file
    is left behind (one per database in the temp folder, probe 6). A process that waited on the
    removed file finds, once it holds it, that the path names another file or none: it opens the
    path again, so two processes never both hold the lock on different files."""
    while True:
        handle = open(path, "ab")  # closed below on every path
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            held = os.fstat(handle.fileno())
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
        except BaseException:
            handle.close()
            raise
        if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
            break
        handle.close()
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        handle.close()  # the flock goes with it


class Storage:
    """archsearch's tables (and Optuna's) in one database.

    Use `Storage.open(url)`; close with `close()` or a `with` block.
    """

    def __init__(self, url: URL, engine: Engine) -> None:
        self._url = url
        self._engine = engine
        self._optuna: optuna.storages.BaseStorage | None = None
        self.host = f"{socket.gethostname()}:{os.getpid()}"

    # --- opening ---------------------------------------------------------------------------------
    @classmethod
    def open(cls, url: str | None = None, *, create: bool = True, read_only: bool = False) -> Storage:
        """Open (and with `create`, initialise) the database at `url` (see `storage_url`).

        Args:
            create: create archsearch's tables in a database that has none yet.
            read_only: for a command that only reads: nothing is created, upgraded or written,
                and the file is left byte for byte as it was (module docstring); implies not
                `create`.

        Raises:
            StorageError: a malformed URL, a missing driver, an unreachable server, a missing
                SQLite file or folder, or a database that is not archsearch's (without `create`).
            SchemaVersionError: the database's schema version differs from this code's (to read
                it, older than this code's too: the upgrade would write).
        """
        create = create and not read_only
        parsed = _parse_url(storage_url(url))
        sqlite = parsed.get_backend_name() == "sqlite"
        if sqlite:
            path = _sqlite_path(parsed)
            if not path.parent.is_dir():
                raise StorageError(f"no folder {str(path.parent)!r} for the SQLite database {path}")
            if path.exists() and not path.is_file():  # a folder, a FIFO, a device: SQLite reads only files
                kind = "a folder" if path.is_dir() else "not a regular file"
                raise StorageError(f"{path} is {kind}, not a SQLite database")
            if not create and not path.is_file():
                raise StorageError(f"no database at {path}")
        try:
            engine = _watched(create_engine(parsed, **_engine_kwargs(parsed, reader=read_only)))
        except (NoSuchModuleError, ImportError) as exc:
            raise StorageError(f"no driver for {_masked(parsed)}: {_one_line(exc)}") from None
        if sqlite:
            _use_immediate_transactions(engine, reader=read_only)
        storage = cls(parsed, engine)
        try:
            storage._initialise(create, read_only)
        except BaseException:
            engine.dispose()
            raise
        return storage

    def _initialise(self, create: bool, read_only: bool = False) -> None:
        with contextlib.nullcontext() if read_only else self._init_lock():  # a reader creates nothing
            try:
                with self._engine.begin() as conn:
                    found = self._check_or_create(conn, create, read_only)
                if found == SCHEMA_VERSION and self.is_sqlite and not read_only:
                    self._use_wal()
            except DBAPIError as exc:
                if _read_only(exc):
                    raise self._read_only_error(exc) from None
                if _busy(exc):  # another process's lock, held past the bound: the environment's fault
                    cause = failure_cause(exc)
                    raise StorageUnavailableError(
                        f"the database {self.display_url} failed: {cause} (another process held its lock "
                        f"for more than {BUSY_TIMEOUT_S} s)",
                        cause,
                    ) from None
                if _unreachable(exc):  # a server down, restarting or full: the environment's fault
                    raise self._unreachable_error(exc) from None
                code = (getattr(exc.orig, "sqlite_errorcode", None) or 0) & 0xFF
                if code == _SQLITE_CORRUPT:  # as `check_intact` finds it: the file's fault, not the input's
                    raise self._damaged(_one_line(exc)) from None
                if code in _SQLITE_ENVIRONMENT:  # an I/O error, a full disk, a file-size limit
                    cause = failure_cause(exc)
                    raise StorageUnavailableError(
                        f"the database {self.display_url} failed: {cause}", cause
                    ) from None
                raise StorageError(f"cannot use the database {self.display_url}: {_one_line(exc)}") from None
        if found != SCHEMA_VERSION:
            newer = "a newer" if found > SCHEMA_VERSION else "an older"
            if found > SCHEMA_VERSION:
                advice = ": upgrade archsearch"
            elif read_only and schema.ADDITIVE_SINCE <= found:
                advice = (
                    " and upgrades it in place, which this command, which only reads, does not do: run "
                    "one that writes to it first (`search --resume`, `validate`)"
                )
            else:
                advice = ": use a new database"
            raise SchemaVersionError(
                f"{self.display_url} has archsearch schema version {found}, written by {newer} "
                f"archsearch; this one reads version {SCHEMA_VERSION}{advice}"
            )

    def _check_or_create(self, conn: Any, create: bool, read_only: bool) -> int:
        """The database's archsearch schema version, inside `conn`'s transaction: the tables made
        (`create`) or brought up to this code's version (a writer, from an additive version),
        and then this code's version.

        Raises:
            StorageError: no archsearch database there (without `create`), or a foreign table
                of archsearch's name.
        """
        tables = set(self._engine.dialect.get_table_names(conn))
        if schema.Meta.__tablename__ not in tables:
            if not create:
                raise StorageError(f"{self.display_url} holds no archsearch database")
            others = sorted(t for t in tables if t not in _OPTUNA_TABLES and not t.startswith("archsearch_"))
            if self.is_sqlite and others:  # a file is one application's: another's is not extended
                shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
                raise StorageError(
                    f"{self.display_url} holds no archsearch database but another application's tables "
                    f"({shown}): give a new file as --storage"
                )
            if name := _not_optuna(conn, tables & _OPTUNA_TABLES):
                raise StorageError(
                    f"{self.display_url} holds a table named {name!r} that is not Optuna's (it lacks "
                    "Optuna's columns): another application's; give a new database as --storage"
                )
            schema.Base.metadata.create_all(conn)
            conn.execute(
                schema.Meta.__table__.insert().values(key="schema_version", value=str(SCHEMA_VERSION))
            )
            return SCHEMA_VERSION
        row = conn.execute(
            select(schema.Meta.value).where(schema.Meta.key == "schema_version")
        ).scalar_one_or_none()
        try:
            found = int(row) if row is not None else 0
        except (TypeError, ValueError):
            raise StorageError(
                f"{self.display_url} holds no archsearch database: its {schema.Meta.__tablename__} table "
                f"gives the schema version {quoted(str(row))}, not a number"
            ) from None
        if schema.ADDITIVE_SINCE <= found < SCHEMA_VERSION and not read_only:
            # Those versions lack only tables added since: create them (existing tables are left
            # alone) and record the new version, in one transaction.
            schema.Base.metadata.create_all(conn, checkfirst=True)
            _add_columns(conn, self._engine)
            if found < schema.LOSS_CHANGE_SINCE:
                _fill_loss_changes(conn)
            if found < schema.LADDER_BATCH_SINCE:
                _rebuild_ladder_rungs(conn)
            conn.execute(
                update(schema.Meta.__table__)
                .where(schema.Meta.key == "schema_version")
                .values(value=str(SCHEMA_VERSION))
            )
            return SCHEMA_VERSION
        return found

    def _use_wal(self) -> None:
        """Put an archsearch SQLite database in WAL mode (persistent in the file), once it is known
        to be one: switching on connect rewrote the header of any file given as --storage, a
        foreign one that is then refused included. Outside a transaction, as SQLite requires."""
        with self._engine.connect() as conn:
            conn.connection.driver_connection.execute("PRAGMA journal_mode = WAL")  # type: ignore[union-attr]

    @contextlib.contextmanager
    def _init_lock(self) -> Iterator[None]:
        """Serialise table creation between processes on the same database."""
        if self.is_sqlite:
            # A lock file beside nothing: opening and closing the database file itself would drop
            # this process's POSIX locks on it, SQLite's included, and let another process delete
            # the live WAL. WAL needs a local disk, so a lock in the local temp folder suffices.
            # realpath, not Path.resolve: a symlink loop raises there (SQLite then says it cannot open it).
            path = Path(os.path.realpath(_sqlite_path(self._url)))
            digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
            with _lock_file(Path(tempfile.gettempdir()) / f"archsearch-{digest}.lock"):
                yield
            return
        try:
            with self._engine.connect() as conn:
                conn.execute(text("SELECT pg_advisory_lock(:id)"), {"id": _PG_INIT_LOCK})
                conn.commit()
                try:
                    yield
                finally:
                    conn.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": _PG_INIT_LOCK})
                    conn.commit()
        except DBAPIError as exc:
            if _unreachable(exc):
                raise self._unreachable_error(exc) from None
            raise StorageError(f"cannot use the database {self.display_url}: {_one_line(exc)}") from None

    def require_writable(self) -> None:
        """Check, before any work that will need it, that this process can write the database.

        One transaction rewrites the schema-version row with its own value and rolls back: it
        takes the write lock and dirties a page, which a read-only file, folder, mount or role
        refuses, and it leaves the database as it was. Readers (`trials`, `pareto`, `studies`,
        `export`) never call it: they work on a read-only database.

        Raises:
            ReadOnlyStorageError: the database cannot be written here (one line naming it).
            StorageError: another database error.
        """
        meta = schema.Meta.__table__
        probe = update(meta).where(meta.c.key == "schema_version").values(value=meta.c.value)
        try:
            with self._engine.connect() as conn:
                transaction = conn.begin()
                try:
                    conn.execute(probe)
                finally:
                    transaction.rollback()
        except DBAPIError as exc:
            if _read_only(exc):
                raise self._read_only_error(exc) from None
            raise StorageError(f"database error on {self.display_url}: {_one_line(exc)}") from None

    def check_intact(self) -> None:
        """Check, before a search spends any compute or writes anything, that no page of the
        SQLite file is damaged: SQLite's `quick_check` reads every page of every table, Optuna's
        included (time proportional to the file's size, without `integrity_check`'s slower
        cross-checks of indexes). A PostgreSQL server checks its own pages.

        Raises:
            DamagedStorageError: a damaged file, with SQLite's first complaint.
            StorageUnavailableError: the file could not be read (locked past the timeout).
        """
        if not self.is_sqlite:
            return
        reader = self._engine.execution_options(**{READ_ONLY: True})
        try:
            with reader.connect() as conn:
                found = str(conn.execute(text("PRAGMA quick_check(1)")).scalar())
        except (OperationalError, InterfaceError) as exc:  # locked or unreadable, not damaged
            cause = failure_cause(exc)
            raise StorageUnavailableError(f"the database {self.display_url} failed: {cause}", cause) from None
        except DBAPIError as exc:  # so damaged that the check itself fails
            found = _one_line(exc)
        if found != "ok":
            raise self._damaged(f"SQLite's quick_check: {found}")

    def _unreachable_error(self, exc: DBAPIError) -> StorageUnavailableError:
        cause = failure_cause(exc)
        return StorageUnavailableError(
            f"cannot reach the database {self.display_url} (waited up to {CONNECT_TIMEOUT_S} s): {cause}",
            cause,
        )

    def _damaged(self, why: str) -> DamagedStorageError:
        return DamagedStorageError(
            f"the database {self.display_url} is damaged ({why}): restore it from a copy, or give another "
            "--storage"
        )

    def _read_only_error(self, exc: DBAPIError) -> ReadOnlyStorageError:
        if getattr(exc.orig, "sqlite_errorcode", None) == _SQLITE_READONLY_DIRECTORY:
            return ReadOnlyStorageError(
                f"cannot use the database {self.display_url}: its folder is read-only, and SQLite must "
                "create the database's -wal and -shm files there, even to read it; make the folder "
                "writable or copy the database to one"
            )
        check = (
            "the permissions of the file and its folder"
            if self.is_sqlite
            else "whether the server is a standby or sets default_transaction_read_only"
        )
        return ReadOnlyStorageError(
            f"cannot write the database {self.display_url}: {_one_line(exc)}; check {check}, "
            "or give another --storage"
        )

    @property
    def is_sqlite(self) -> bool:
        return self._url.get_backend_name() == "sqlite"

    @property
    def display_url(self) -> str:
        """The URL with any password hidden, for messages."""
        return _masked(self._url)

    @property
    def url(self) -> str:
        return self._url.render_as_string(hide_password=False)

    def close(self) -> None:
        self._engine.dispose()
        if self._optuna is not None:
            engine = getattr(self._optuna, "engine", None)
            if engine is not None:
                engine.dispose()

    def __enter__(self) -> Storage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def optuna_storage(self) -> optuna.storages.RDBStorage:
        """Optuna's RDB storage on the same database, with the same locking rules."""
        if self._optuna is None:
            import optuna

            with self._init_lock():
                try:
                    storage = optuna.storages.RDBStorage(self.url, engine_kwargs=_engine_kwargs(self._url))
                except (SQLAlchemyError, RuntimeError) as exc:  # RuntimeError: tables of another Optuna
                    raise StorageError(
                        f"cannot open Optuna's tables in {self.display_url}: {_one_line(exc)}"
                    ) from None
            if self.is_sqlite:
                _use_immediate_transactions(storage.engine)
                storage.engine.dispose()  # connections opened before the listeners are dropped
            _watched(storage.engine)
            self._optuna = storage
        return self._optuna

    # --- the one session helper ------------------------------------------------------------------
    @contextlib.contextmanager
    def _session(self, read_only: bool = False) -> Iterator[Session]:
        """One transaction: commits on success, rolls back on any error, always closes.

        Database errors become `StorageError` with one line: `ReadOnlyStorageError` for a write
        that the database refuses as read-only, `ValueRefusedError` for a value it refuses (a
        constraint, a number out of range), `StorageUnavailableError` for the database failing
        (unreachable, locked past the timeout, full). The transaction leaves nothing.
        """
        try:
            bind = self._engine.execution_options(**{READ_ONLY: True}) if read_only else self._engine
            with Session(bind, expire_on_commit=False) as session, session.begin():
                yield session
        except PendingRollbackError as exc:
            # The rollback after a statement whose connection the watchdog shut (`watchdog`) meets
            # the invalidated connection: the statement's own error is the one to tell (probe 9:
            # a 500-line traceback under `$ARCHSEARCH_DB_STATEMENT_S` below the lock timeout).
            cause = failure_cause(exc)
            raise StorageUnavailableError(f"the database {self.display_url} failed: {cause}", cause) from None
        except DBAPIError as exc:
            if not read_only and _read_only(exc):
                raise self._read_only_error(exc) from None
            if isinstance(exc, (IntegrityError, DataError)):
                raise ValueRefusedError(f"database error on {self.display_url}: {_one_line(exc)}") from None
            if isinstance(exc, (OperationalError, InterfaceError)):
                cause = failure_cause(exc)
                message = f"the database {self.display_url} failed: {cause}"
                if _busy(exc):  # the bound the wait ran out of, as `Storage.open` says it
                    message += f" (another process held its lock for more than {BUSY_TIMEOUT_S} s)"
                raise StorageUnavailableError(message, cause) from None
            raise StorageError(f"database error on {self.display_url}: {_one_line(exc)}") from None
        except OverflowError as exc:  # pysqlite binds integers only up to 2**63 - 1
            raise ValueRefusedError(f"database error on {self.display_url}: {exc}") from None
        except (json.JSONDecodeError, _DamagedValue) as exc:  # was a traceback in every reader
            raise self._damaged(f"a stored value is damaged: {exc}") from None

    # --- studies ---------------------------------------------------------------------------------
    def create_study(
        self,
        name: str,
        *,
        spec_fingerprint: str,
        spec_source: str,
        spec: Mapping[str, Any],
        objectives: Sequence[str],
        exist_ok: bool = True,
    ) -> StudyRecord:
        """Record a new study, or return the existing one of that name unchanged.

        Atomic: drivers creating one study at the same moment get one row, and each the same
        record (compare its `spec_fingerprint` with yours). SQLite serialises the writers
        (`BEGIN IMMEDIATE`); on PostgreSQL the loser's insert meets the primary key inside a
        savepoint and reads the winner's row.

        Raises:
            StudyExistsError: with `exist_ok=False`, the study existed or another driver created it.
        """
        created = False
        with self._session() as s:
            if s.get(schema.Study, name) is None:
                try:
                    with s.begin_nested():
                        s.add(
                            schema.Study(
                                name=name, spec_fingerprint=spec_fingerprint, spec_source=spec_source,
                                spec_json=json.dumps(spec, sort_keys=True), objectives=",".join(objectives),
                                created_at=time.time(),
                            )
                        )  # fmt: skip
                    created = True
                except IntegrityError:  # another driver inserted it since our read
                    pass
        record = self.study(name)
        if not created and not exist_ok:
            finished = record.finished if record is not None else 0
            raise StudyExistsError(f"study {name!r} already exists ({finished} finished trials)")
        return record  # type: ignore[return-value]

    def study(self, name: str, *, counts: bool = True) -> StudyRecord | None:
        """The study called `name`, None when there is none.

        Args:
            counts: count its trials by state (one GROUP BY over its trials: a noticeable part of
                a query on a 100,000-trial study); False leaves `counts` None.
        """
        with self._session(read_only=True) as s:
            row = s.get(schema.Study, name)
            if row is None:
                return None
            return self._study_record(row, self._counts(s, name) if counts else None)

    def require_study(self, name: str, *, counts: bool = False) -> StudyRecord:
        """The study called `name`, by default without its trial counts (`study`).

        Raises:
            UnknownNameError: there is none; the message lists the database's studies.
        """
        record = self.study(name, counts=counts)
        if record is None:
            names = self.study_names()
            shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
            raise UnknownNameError(
                f"unknown study {quoted(name)} in {self.display_url}; "
                + (f"studies: {shown}" if names else "it holds no studies")
            )
        return record

    def optuna_objectives(self, name: str) -> int | None:
        """How many objectives Optuna's study `name` has in this database; None when it has no
        such study (or no Optuna tables yet). Read with SQL: Optuna is not imported."""
        with self._session(read_only=True) as s:
            conn = s.connection()
            if not {"studies", "study_directions"} <= set(self._engine.dialect.get_table_names(conn)):
                return None
            study_id = conn.execute(text("SELECT study_id FROM studies WHERE study_name = :n"), {"n": name})
            found = study_id.scalar()
            if found is None:
                return None
            q = text("SELECT count(*) FROM study_directions WHERE study_id = :i")
            return int(conn.execute(q, {"i": found}).scalar_one())

    def discard_empty_study(self, name: str) -> bool:
        """Delete archsearch's study `name` (and its search runs) if it holds no trials, in one
        transaction under the study's lock: what a search start that failed after creating it
        leaves. Returns whether it was deleted."""
        with self._session() as s:
            s.execute(select(schema.Study.name).where(schema.Study.name == name).with_for_update())
            row = s.get(schema.Study, name)
            trials = select(func.count()).select_from(schema.Trial).where(schema.Trial.study == name)
            if row is None or s.scalar(trials):
                return False
            s.execute(delete(schema.SearchRun).where(schema.SearchRun.study == name))
            s.delete(row)
            return True

    def study_names(self) -> list[str]:
        """The names of every study, oldest first (no trial counts: cheap)."""
        with self._session(read_only=True) as s:
            return list(s.scalars(select(schema.Study.name).order_by(schema.Study.created_at)))

    def studies(self) -> list[StudyRecord]:
        """Every study, oldest first, with its trial counts by state."""
        with self._session(read_only=True) as s:
            rows = s.scalars(select(schema.Study).order_by(schema.Study.created_at)).all()
            counts: dict[str, dict[str, int]] = {}
            for study, status, n in s.execute(
                select(schema.Trial.study, schema.Trial.status, func.count()).group_by(
                    schema.Trial.study, schema.Trial.status
                )
            ):
                counts.setdefault(study, {})[status] = n
            return [self._study_record(row, counts.get(row.name, {})) for row in rows]

    @staticmethod
    def _study_record(row: schema.Study, counts: dict[str, int] | None) -> StudyRecord:
        spec = _json_of(row.spec_json, dict, f"the spec of study {row.name!r}")
        _checked(row, f"study {row.name!r}")
        if not (isinstance(row.created_at, (int, float)) and math.isfinite(row.created_at)):
            raise _DamagedValue(f"the created_at of study {row.name!r} is {row.created_at!r}, not a time")
        if not isinstance(row.objectives, str):
            raise _DamagedValue(f"the objectives of study {row.name!r} are {row.objectives!r}, not text")
        unknown = [n for n in row.objectives.split(",") if n and n not in OBJECTIVES]
        if unknown:  # no study was created with an objective the registry does not know
            raise _DamagedValue(
                f"the stored objectives of study {row.name!r} name {quoted(unknown[0])}, which is no "
                "objective"
            )
        for key in ("size_beta", "extrapolate"):  # its loss rule, which every reader of its fronts applies
            if spec.get(key) is not None and not _non_negative(spec[key]):
                raise _DamagedValue(
                    f"the spec of study {row.name!r} gives {key} {quoted(str(spec[key]))}, "
                    "not a finite number >= 0"
                )
        return StudyRecord(
            name=row.name,
            spec_fingerprint=row.spec_fingerprint,
            spec_source=row.spec_source,
            spec=spec,
            objectives=tuple(row.objectives.split(",")) if row.objectives else (),
            created_at=row.created_at,
            counts=counts,
        )

    @staticmethod
    def _counts(s: Session, study: str) -> dict[str, int]:
        q = (
            select(schema.Trial.status, func.count())
            .where(schema.Trial.study == study)
            .group_by(schema.Trial.status)
        )
        return {status: n for status, n in s.execute(q)}

    def counts(self, study: str) -> dict[str, int]:
        """Trials of `study` by state."""
        with self._session(read_only=True) as s:
            return self._counts(s, study)

    # --- trial life cycle ------------------------------------------------------------------------
    def claim_trial(self, study: str, limit: int, lease_s: float) -> int | None:
        """Reserve one of `limit` trial slots: a running row, or None when the study is full.

        Finished and running trials fill slots. The count and the insert are one transaction
        (the write lock on SQLite, a row lock on the study in PostgreSQL), so several drivers on
        one study never run more than `limit` trials between them.
        """
        now = time.time()
        with self._session() as s:
            s.execute(select(schema.Study.name).where(schema.Study.name == study).with_for_update())
            taken = s.scalar(
                select(func.count())
                .select_from(schema.Trial)
                .where(schema.Trial.study == study, schema.Trial.status.in_((*FINISHED, RUNNING)))
            )
            if taken >= limit:
                return None
            row = schema.Trial(
                study=study,
                status=RUNNING,
                attempts=0,
                host=self.host,
                started_at=now,
                lease_expires_at=now + lease_s,
            )
            s.add(row)
            s.flush()
            return row.id

    def assign_trial(
        self,
        trial_id: int,
        *,
        number: int,
        optuna_trial_id: int,
        params: Mapping[str, Any],
        config: ArchConfig | None,
    ) -> int | None:
        """Attach Optuna's trial and the sampled shape (with its exact costs) to a claimed row.

        Returns:
            The number of another trial of the study with the same shape that is running or was
            trained (complete or pruned), else None: checked in the same transaction, under the
            study's lock, so two drivers sampling one shape at once cannot both miss the other.
        """
        values: dict[str, Any] = dict(
            number=number,
            optuna_trial_id=optuna_trial_id,
            params_json=json.dumps(dict(params), sort_keys=True),
        )
        if config is not None:
            values.update(_config_columns(config))
        with self._session() as s:
            row = s.get(schema.Trial, trial_id)
            if row is None:
                raise StorageError(f"no trial row {trial_id}")
            same = None
            if config is not None:
                s.execute(select(schema.Study.name).where(schema.Study.name == row.study).with_for_update())
                same = s.scalar(
                    select(schema.Trial.number)
                    .where(
                        schema.Trial.study == row.study,
                        schema.Trial.id != trial_id,
                        schema.Trial.config_json == values["config_json"],
                        schema.Trial.status.in_((RUNNING, COMPLETE, PRUNED)),
                    )
                    .order_by(schema.Trial.id)
                    .limit(1)
                )
            s.execute(update(schema.Trial).where(schema.Trial.id == trial_id).values(**values))
            return same

    def start_attempt(self, trial_id: int, lease_s: float, note: str | None = None) -> int:
        """Count one more worker run of a trial, renew its lease; `note` keeps a retry's cause."""
        with self._session() as s:
            row = s.get(schema.Trial, trial_id)
            if row is None:
                raise StorageError(f"no trial row {trial_id}")
            row.attempts += 1
            row.lease_expires_at = time.time() + lease_s
            if note:
                row.reason = f"{row.reason}; {note}" if row.reason else note
            return row.attempts

    def renew_leases(self, trial_ids: Sequence[int], lease_s: float) -> None:
        if not trial_ids:
            return
        with self._session() as s:
            s.execute(
                update(schema.Trial)
                .where(schema.Trial.id.in_(list(trial_ids)), schema.Trial.status == RUNNING)
                .values(lease_expires_at=time.time() + lease_s)
            )

    def expire_leases(self, host: str) -> int:
        """End now the leases of the running trials of the driver `host` (its `Storage.host`), which
        died without settling them: the next driver's sweep re-queues them at once instead of
        after the lease. Returns how many there were."""
        with self._session() as s:
            done = s.execute(
                update(schema.Trial)
                .where(schema.Trial.host == host, schema.Trial.status == RUNNING)
                .values(lease_expires_at=time.time())
            )
            return int(done.rowcount or 0)

    def end_trial(self, trial_id: int, status: str, reason: str) -> None:
        """Close a trial that produced no results: rejected, interrupted, or failed before running."""
        check_state(status)
        with self._session() as s:
            s.execute(
                update(schema.Trial)
                .where(schema.Trial.id == trial_id)
                .values(status=status, reason=reason, lease_expires_at=None, finished_at=time.time())
            )

    def finish_trial(self, trial_id: int, outcome: TrialOutcome) -> None:
        """Write everything a trial produced, in one transaction: all of it or none of it.

        Raises:
            ValueRefusedError: the database refused one of its values (nothing is written; the
                driver then fails the trial with that reason, `end_trial`).
            StorageUnavailableError: the database failed (nothing is written).
        """
        now = time.time()
        train = outcome.train or {}
        with self._session() as s:
            row = s.get(schema.Trial, trial_id)
            if row is None:
                raise StorageError(f"no trial row {trial_id}")
            row.status = outcome.status
            if outcome.reason:
                row.reason = f"{row.reason}; {outcome.reason}" if row.reason else outcome.reason
            row.lease_expires_at = None
            row.finished_at = now
            row.pruned_rung = outcome.pruned_rung
            row.step_time_s = outcome.step_time_s
            row.step_time_device = outcome.step_time_device
            row.prefill_time_s = outcome.prefill_time_s
            row.decode_time_s = outcome.decode_time_s
            if train:
                row.loss = train.get("val_loss")
                row.bits_per_byte = train.get("bits_per_byte")
                row.tokens_trained = train.get("tokens")
                row.steps = train.get("steps")
                row.train_seconds = train.get("wall_time_s")
                row.tokens_per_second = train.get("tokens_per_second")
                row.mfu = train.get("mfu")
                row.precision = train.get("precision")
                row.corpus_fingerprint = train.get("corpus_fingerprint")
                # The curve of the run whose loss is kept: a stalled run's retry's (search.worker).
                row.loss_change = curve_change(train.get("val_curve") or ())
                for kind, curve in (
                    ("train", train.get("loss_curve") or ()),
                    ("val", train.get("val_curve") or ()),
                ):
                    # One point per token count; finite points only, on every backend: a run
                    # stops at its first non-finite loss, which its reason records.
                    points = {int(t): float(v) for t, v in curve if math.isfinite(float(v))}
                    s.add_all(
                        schema.Curve(trial_id=trial_id, kind=kind, tokens=t, loss=v)
                        for t, v in points.items()
                    )
            if outcome.device:
                row.device_fingerprint = outcome.device.get("fingerprint")
                self._add_device(s, outcome.device)
            for p in outcome.profiles:
                s.add(
                    schema.Profile(
                        trial_id=trial_id,
                        device=p["device"],
                        modelled=bool(p["modelled"]),
                        dtype=p["dtype"],
                        batch=int(p["batch"]),
                        step_time_s=float(p["step_time_s"]),
                        tokens_per_second=float(p["tokens_per_second"]),
                        report_json=json.dumps(p.get("report", {}), sort_keys=True),
                    )
                )
            self._add_measurements(s, outcome.measurements)

    def stale_trials(self, study: str, now: float | None = None) -> list[TrialRecord]:
        """Running trials whose lease expired: their driver died without closing them."""
        now = time.time() if now is None else now
        with self._session(read_only=True) as s:
            rows = s.scalars(
                select(schema.Trial).where(
                    schema.Trial.study == study,
                    schema.Trial.status == RUNNING,
                    schema.Trial.lease_expires_at < now,
                )
            ).all()
            return [_trial_record(r) for r in rows]

    def trials(self, study: str, status: str | None = None) -> list[TrialRecord]:
        """The trials of `study` (optionally of one state), by trial number."""
        with self._session(read_only=True) as s:
            q = select(schema.Trial).where(schema.Trial.study == study)
            if status is not None:
                q = q.where(schema.Trial.status == status)
            rows = s.scalars(q.order_by(*_BY_NUMBER)).all()
            return [_trial_record(r) for r in rows]

    def complete_values(self, study: str, columns: Sequence[str]) -> tuple[list[int], list[tuple[Any, ...]]]:
        """Trial numbers and the given columns of `study`'s complete trials, in one lean query.

        For fronts over many trials: no records or configs are built.

        Raises:
            DamagedStorageError: a complete trial stores an infinite number, which no complete
                trial has (a non-finite loss fails the trial; NaN is stored as NULL, read as None).
        """
        rows = self.trial_rows(study, ["number", *columns], where=schema.Trial.status == COMPLETE)
        for row in rows:
            for column, value in zip(columns, row[1:], strict=True):
                if isinstance(value, float) and math.isinf(value):
                    raise self._damaged(
                        f"complete trial {row[0]} of {study!r} stores {column} = {value}, which no complete "
                        "trial has"
                    )
        return [r[0] for r in rows], [r[1:] for r in rows]

    def wall_times(self, study: str) -> list[float]:
        """Seconds from claim to result of each of `study`'s finished trials (complete, pruned or
        failed; retries included), by trial number: what a search's ETA is estimated from."""
        rows = self.trial_rows(study, ["started_at", "finished_at"], where=schema.Trial.status.in_(FINISHED))
        return [end - start for start, end in rows if start is not None and end is not None]

    def trials_by_number(self, study: str, numbers: Sequence[int]) -> list[TrialRecord]:
        """The records of `study`'s trials `numbers`, in that order (missing ones left out)."""
        # A number beyond a signed 64-bit integer names no row, and SQLite's driver cannot bind it.
        storable = [n for n in numbers if -(2**63) <= n < 2**63]
        with self._session(read_only=True) as s:
            wanted = schema.Trial.number.in_(storable)
            rows = s.scalars(select(schema.Trial).where(schema.Trial.study == study, wanted)).all()
            by_number = {r.number: _trial_record(r) for r in rows}
        return [by_number[n] for n in numbers if n in by_number]

    def trial_rows(
        self,
        study: str,
        columns: Sequence[str],
        *,
        where: ColumnElement[bool] | None = None,
        order_by: Sequence[ColumnElement[Any]] = (),
        limit: int | None = None,
    ) -> list[tuple[Any, ...]]:
        """Chosen columns of `study`'s trials in one SELECT: filter, order and limit run in SQL.

        Args:
            columns: `archsearch_trials` column names, in the order wanted.
            where: a boolean expression over that table (`storage.query.compile_filter` builds
                one from user text, with bound parameters).
            order_by: ORDER BY clauses; without any, by trial number, unnumbered rows last.
            limit: at most this many rows.
        """
        table = schema.Trial.__table__
        q = select(*(table.c[name] for name in columns)).where(table.c.study == study)
        if where is not None:
            q = q.where(where)
        q = q.order_by(*order_by, *_BY_NUMBER)
        if limit is not None:
            q = q.limit(limit)
        with self._session(read_only=True) as s:
            # A Core query on the session's connection: the ORM's result processing would
            # cost more than the query itself on a large study.
            rows = [tuple(row) for row in s.connection().execute(q)]
            _check_numbers(rows, [table.c[name] for name in columns])
            return rows

    def add_trials(self, study: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Insert trial rows in bulk, in one transaction.

        For synthetic databases (benchmarks, tests): a search records trials through
        `claim_trial`, `assign_trial` and `finish_trial` instead.

        Args:
            rows: `archsearch_trials` columns by name; a "config" entry (an `ArchConfig`) fills
                the shape and cost columns as `assign_trial` does.
        """
        columns: dict[ArchConfig, dict[str, Any]] = {}  # the cost model once per distinct shape
        values = []
        for row in rows:
            row = dict(row)
            cfg = row.pop("config", None)
            if cfg is not None:
                if cfg not in columns:
                    columns[cfg] = _config_columns(cfg)
                row = {**columns[cfg], **row}
            values.append({**row, "study": study})
        if values:
            with self._session() as s:
                s.execute(insert(schema.Trial), values)

    def trial(self, trial_id: int) -> TrialRecord | None:
        with self._session(read_only=True) as s:
            row = s.get(schema.Trial, trial_id)
            return None if row is None else _trial_record(row)

    def curves(self, trial_id: int) -> dict[str, list[tuple[int, float]]]:
        """A trial's loss curves: {"train": [(tokens, loss), ...], "val": [...]}."""
        with self._session(read_only=True) as s:
            rows = s.execute(
                select(schema.Curve.kind, schema.Curve.tokens, schema.Curve.loss)
                .where(schema.Curve.trial_id == trial_id)
                .order_by(schema.Curve.kind, schema.Curve.tokens)
            ).all()
            _check_numbers(rows, [schema.Curve.kind, schema.Curve.tokens, schema.Curve.loss], "a curve point")
        out: dict[str, list[tuple[int, float]]] = {"train": [], "val": []}
        for kind, tokens, loss in rows:
            out.setdefault(kind, []).append((tokens, loss))
        return out

    def profiles(self, trial_id: int) -> list[dict[str, Any]]:
        with self._session(read_only=True) as s:
            rows = s.scalars(select(schema.Profile).where(schema.Profile.trial_id == trial_id)).all()
            rows = [_checked(r, f"trial {trial_id}'s profile on {r.device!r}") for r in rows]
            return [
                dict(
                    device=r.device,
                    modelled=r.modelled,
                    dtype=r.dtype,
                    batch=r.batch,
                    step_time_s=r.step_time_s,
                    tokens_per_second=r.tokens_per_second,
                    report=_json_of(r.report_json, dict, f"trial {trial_id}'s profile on {r.device!r}"),
                )
                for r in rows
            ]

    # --- long runs and validation reports (`archsearch validate`) ---------------------------------
    def add_long_run(
        self,
        study: str,
        *,
        trial_number: int,
        multiplier: float,
        seed: int,
        tokens: int,
        val_loss: float,
        val_curve: Sequence[Sequence[float]] = (),
        settings: Mapping[str, Any] | None = None,
        device_fingerprint: str | None = None,
        corpus_fingerprint: str | None = None,
        wall_time_s: float | None = None,
    ) -> bool:
        """Record one long run, in one transaction; the first run of a (trial, multiplier, seed) wins.

        Returns:
            True when written, False when that run was already stored (it is left as it was).
        """
        key = dict(study=study, trial_number=trial_number, multiplier=float(multiplier), seed=seed)
        run = _run_columns(
            tokens, val_loss, val_curve, settings, device_fingerprint, corpus_fingerprint, wall_time_s
        )
        return self._add_once(schema.LongRun, key, run)

    def long_runs(self, study: str, multiplier: float | None = None) -> list[LongRunRecord]:
        """`study`'s long runs (of one multiplier, or all), by trial number, multiplier, seed."""
        with self._session(read_only=True) as s:
            q = select(schema.LongRun).where(schema.LongRun.study == study)
            if multiplier is not None:
                q = q.where(schema.LongRun.multiplier == float(multiplier))
            q = q.order_by(schema.LongRun.trial_number, schema.LongRun.multiplier, schema.LongRun.seed)
            return [_long_run_record(r) for r in s.scalars(q).all()]

    def long_run_losses(self, study: str) -> dict[int, tuple[float, float, int]]:
        """Per trial with long runs: (multiplier, mean loss over its seeds, seeds) at its largest
        multiplier; what `pareto` and `trials` show beside the proxy loss."""
        by_trial: dict[int, dict[float, list[float]]] = {}
        for run in self.long_runs(study):
            by_trial.setdefault(run.trial_number, {}).setdefault(run.multiplier, []).append(run.val_loss)
        out = {}
        for number, by_multiplier in by_trial.items():
            multiplier = max(by_multiplier)
            losses = by_multiplier[multiplier]
            out[number] = (multiplier, sum(losses) / len(losses), len(losses))
        return out

    def add_validation(self, study: str, *, multiplier: float, seeds: int, report: Mapping[str, Any]) -> int:
        """Store one `validate` report of `study`; returns its id."""
        with self._session() as s:
            row = schema.Validation(
                study=study,
                multiplier=float(multiplier),
                seeds=int(seeds),
                report_json=json.dumps(dict(report), sort_keys=True),
                created_at=time.time(),
            )
            s.add(row)
            s.flush()
            return row.id

    def validations(self, study: str) -> list[ValidationRecord]:
        """`study`'s stored `validate` reports, oldest first."""
        with self._session(read_only=True) as s:
            rows = self._oldest_first(s, schema.Validation, study, schema.Validation.created_at)
            return [
                ValidationRecord(
                    id=r.id,
                    study=r.study,
                    multiplier=r.multiplier,
                    seeds=r.seeds,
                    report=_json_of(r.report_json, dict, f"validation {r.id} of {study!r}"),
                    created_at=r.created_at,
                )
                for r in (_checked(row, f"validation {row.id} of {study!r}") for row in rows)
            ]

    # --- size ladders (`archsearch ladder`) ---------------------------------------------------------
    def add_ladder_rung(
        self,
        study: str,
        *,
        trial_number: int,
        tokens_per_param: float,
        batch_size: int,
        target_params: int,
        config: ArchConfig,
        seed: int,
        tokens: int,
        val_loss: float,
        val_curve: Sequence[Sequence[float]] = (),
        settings: Mapping[str, Any] | None = None,
        device_fingerprint: str | None = None,
        corpus_fingerprint: str | None = None,
        wall_time_s: float | None = None,
    ) -> bool:
        """Record one trained rung, in one transaction that also drops its claim (whoever holds it);
        the first of a (trial, tokens per parameter, batch size, shape, seed) wins.

        Returns:
            True when written, False when that rung was already stored (it is left as it was).
        """
        key = dict(
            study=study, trial_number=trial_number, tokens_per_param=float(tokens_per_param),
            batch_size=int(batch_size), shape_key=shape_key(config), seed=seed,
        )  # fmt: skip
        counts = param_counts(config)
        rung = dict(
            target_params=int(target_params), config_json=config.to_json(indent=None),
            params_total=counts.total, params_non_embedding=counts.non_embedding,
            **_run_columns(
                tokens, val_loss, val_curve, settings, device_fingerprint, corpus_fingerprint, wall_time_s
            ),
        )  # fmt: skip
        return self._add_once(schema.LadderRung, key, rung, settles=schema.LadderClaim)

    def claim_ladder_rung(
        self,
        study: str,
        *,
        trial_number: int,
        tokens_per_param: float,
        batch_size: int,
        config: ArchConfig,
        seed: int,
        owner: str,
        lease_s: float,
    ) -> str | None:
        """Claim one rung for `owner` to train, for `lease_s` seconds, in one transaction holding
        the study's row locked (of two ladders racing for it, the first wins).

        Returns:
            None when claimed (a lapsed claim of another ladder is taken over); else why not:
            "stored" (the rung is stored already) or "claimed" (another ladder holds it).
        """
        key = dict(
            study=study, trial_number=trial_number, tokens_per_param=float(tokens_per_param),
            batch_size=int(batch_size), shape_key=shape_key(config), seed=seed,
        )  # fmt: skip
        now = time.time()
        with self._session() as s:
            s.execute(select(schema.Study.name).where(schema.Study.name == study).with_for_update())
            rung = [schema.LadderRung.__table__.c[c] == v for c, v in key.items()]
            if s.scalar(select(schema.LadderRung.id).where(*rung)) is not None:
                return "stored"
            same = [schema.LadderClaim.__table__.c[c] == v for c, v in key.items()]
            held = s.scalar(select(schema.LadderClaim).where(*same))
            if held is not None and held.owner != owner and held.expires_at > now:
                return "claimed"
            if held is not None:
                s.delete(held)
                s.flush()
            s.add(schema.LadderClaim(**key, owner=owner[:128], expires_at=now + lease_s))
            return None

    def renew_ladder_claims(self, owner: str, lease_s: float) -> None:
        """Extend every claim `owner` holds to `lease_s` seconds from now."""
        with self._session() as s:
            s.execute(
                update(schema.LadderClaim)
                .where(schema.LadderClaim.owner == owner[:128])
                .values(expires_at=time.time() + lease_s)
            )

    def release_ladder_claims(self, owner: str) -> None:
        """Drop every claim `owner` holds (its rungs stored, failed or given up)."""
        with self._session() as s:
            s.execute(delete(schema.LadderClaim).where(schema.LadderClaim.owner == owner[:128]))

    def ladder_rungs(
        self, study: str, tokens_per_param: float | None = None, batch_size: int | None = None
    ) -> list[LadderRungRecord]:
        """`study`'s stored rungs (of one tokens-per-parameter and batch size, or all), by trial,
        ratio, batch, size, seed."""
        with self._session(read_only=True) as s:
            table = schema.LadderRung
            q = select(table).where(table.study == study)
            if tokens_per_param is not None:
                q = q.where(table.tokens_per_param == float(tokens_per_param))
            if batch_size is not None:
                q = q.where(table.batch_size == int(batch_size))
            q = q.order_by(
                table.trial_number, table.tokens_per_param, table.batch_size, table.params_total, table.seed,
                table.id,
            )  # fmt: skip
            return [_ladder_rung_record(r) for r in s.scalars(q).all()]

    def add_ladder_fit(
        self, study: str, *, tokens_per_param: float, batch_size: int, fit: Mapping[str, Any]
    ) -> int:
        """Store one fit of `study`'s ladders (`LadderFit.to_dict()`); returns its id."""
        with self._session() as s:
            row = schema.LadderFitRow(
                study=study,
                tokens_per_param=float(tokens_per_param),
                batch_size=int(batch_size),
                fit_json=json.dumps(dict(fit), sort_keys=True),
                created_at=time.time(),
            )
            s.add(row)
            s.flush()
            return row.id

    def ladder_fits(self, study: str) -> list[dict[str, Any]]:
        """`study`'s stored ladder fits, oldest first: {"tokens_per_param", "batch_size" (None for a fit
        stored before schema version 7), "fit", "created_at"}."""
        with self._session(read_only=True) as s:
            rows = self._oldest_first(s, schema.LadderFitRow, study, schema.LadderFitRow.created_at)
            return [
                dict(
                    tokens_per_param=r.tokens_per_param,
                    batch_size=r.batch_size,
                    fit=_json_of(r.fit_json, dict, f"ladder fit {r.id} of {study!r}"),
                    created_at=r.created_at,
                )
                for r in (_checked(row, f"ladder fit {row.id} of {study!r}") for row in rows)
            ]

    def _add_once(
        self, table: Any, key: Mapping[str, Any], columns: Mapping[str, Any], settles: Any = None
    ) -> bool:
        """Insert a row of `table` (`key` and `columns`, stamped now) unless one with the same `key`
        columns is stored, in one transaction holding the study's row locked: of two writers racing
        with the same key, the first wins. The rows of `settles` with that key (claims on it) are
        deleted in the same transaction either way.

        Returns:
            True when written, False when a row with that key was already stored (left as it was).
        """
        with self._session() as s:
            s.execute(select(schema.Study.name).where(schema.Study.name == key["study"]).with_for_update())
            same = [table.__table__.c[column] == value for column, value in key.items()]
            if settles is not None:
                s.execute(delete(settles).where(*(settles.__table__.c[c] == v for c, v in key.items())))
            if s.scalar(select(table.id).where(*same)) is not None:
                return False
            s.add(table(**key, **columns, created_at=time.time()))
            return True

    @staticmethod
    def _oldest_first(s: Session, table: Any, study: str, time: Any) -> Sequence[Any]:
        """The rows of a per-study table (`study` and `id` columns), oldest first by `time`."""
        return s.scalars(select(table).where(table.study == study).order_by(time, table.id)).all()

    # --- search runs ------------------------------------------------------------------------------
    def add_search_run(self, study: str, settings: Mapping[str, Any]) -> int:
        """Record that a driver started on `study` with `settings` (what ran); returns its id."""
        with self._session() as s:
            row = schema.SearchRun(
                study=study,
                host=self.host[:256],
                settings_json=json.dumps(dict(settings), sort_keys=True),
                started_at=time.time(),
            )
            s.add(row)
            s.flush()
            return row.id

    def search_runs(self, study: str) -> list[dict[str, Any]]:
        """`study`'s driver runs, oldest first: {"host" (name:pid), "started_at", "settings"}."""
        with self._session(read_only=True) as s:
            rows = self._oldest_first(s, schema.SearchRun, study, schema.SearchRun.started_at)
            return [
                {
                    "host": r.host,
                    "started_at": r.started_at,
                    "settings": _json_of(r.settings_json, dict, f"search run {r.id} of {study!r}"),
                }
                for r in (_checked(row, f"search run {row.id} of {study!r}") for row in rows)
            ]

    # --- kernel measurements (the profiler's shared cache) ----------------------------------------
    def measurements(self, fingerprint: str | None = None) -> dict[str, float]:
        """Measured kernel seconds by `MeasurementKey.to_str()`, for one device or all."""
        with self._session(read_only=True) as s:
            q = select(schema.Kernel.key, schema.Kernel.seconds)
            if fingerprint is not None:
                q = q.where(schema.Kernel.device_fingerprint == fingerprint)
            measured = dict(s.execute(q).all())
        for key, seconds in measured.items():  # a profile divides by them
            if isinstance(seconds, bool) or not (
                isinstance(seconds, (int, float)) and 0 < seconds < math.inf
            ):
                raise self._damaged(
                    f"a stored value is damaged: kernel {quoted(str(key))} took {quoted(str(seconds))} s, "
                    "not a positive number"
                )
        return measured

    def add_measurements(
        self, measurements: Sequence[Mapping[str, Any]], device: Mapping[str, Any] | None
    ) -> None:
        with self._session() as s:
            if device:
                self._add_device(s, device)
            self._add_measurements(s, measurements)

    def _add_measurements(self, s: Session, measurements: Sequence[Mapping[str, Any]]) -> None:
        if not measurements:
            return
        keys = [m["key"] for m in measurements]
        known = set(s.scalars(select(schema.Kernel.key).where(schema.Kernel.key.in_(keys))))
        now = time.time()
        for m in measurements:
            if m["key"] in known:
                continue  # first measurement wins: every trial on the device then reads the same time
            known.add(m["key"])
            s.add(
                schema.Kernel(
                    key=m["key"],
                    device_fingerprint=m["fingerprint"],
                    dtype=m["dtype"],
                    kind=m["kind"],
                    shape=m["shape"],
                    seconds=float(m["seconds"]),
                    measured_at=now,
                )
            )

    @staticmethod
    def _add_device(s: Session, device: Mapping[str, Any]) -> None:
        """Record a device once: an insert that does nothing where its fingerprint is stored, so
        drivers finishing trials on one device at once never collide (a read-then-insert lost a
        trial's result to a duplicate key on PostgreSQL under load)."""
        from sqlalchemy.dialects import postgresql, sqlite

        fingerprint = device.get("fingerprint")
        if not fingerprint:
            return
        values = dict(
            fingerprint=fingerprint,
            name=str(device.get("name", "")),
            type=str(device.get("type", "")),
            info_json=json.dumps(dict(device), sort_keys=True),
            first_seen=time.time(),
        )
        insert = postgresql.insert if s.get_bind().dialect.name == "postgresql" else sqlite.insert
        s.execute(
            insert(schema.Device).values(**values).on_conflict_do_nothing(index_elements=["fingerprint"])
        )

    def devices(self) -> list[dict[str, Any]]:
        with self._session(read_only=True) as s:
            return [
                _json_of(r.info_json, dict, f"device {r.fingerprint!r}")
                for r in s.scalars(select(schema.Device)).all()
            ]


def _add_columns(conn: Any, engine: Any) -> None:
    """Add the nullable columns of `schema.ADDED_COLUMNS` an older database's tables lack."""
    for table_name, column_name in schema.ADDED_COLUMNS:
        present = {c["name"] for c in engine.dialect.get_columns(conn, table_name)}
        if column_name in present:
            continue
        column = schema.Base.metadata.tables[table_name].c[column_name]
        kind = column.type.compile(dialect=engine.dialect)
        # Names and type from the schema module, never user text: DDL cannot bind parameters.
        conn.execute(text(f"ALTER TABLE {table_name} ADD COLUMN {column_name} {kind}"))


def _fill_loss_changes(conn: Any) -> None:
    """Fill `loss_change` (schema version 6) of an older database's trials from their stored
    held-out curves; a trial without one keeps NULL, which the loss objective reads as 0."""
    curves, trials = schema.Curve.__table__, schema.Trial.__table__
    rows = conn.execute(
        select(curves.c.trial_id, curves.c.tokens, curves.c.loss)
        .where(curves.c.kind == "val")
        .order_by(curves.c.trial_id, curves.c.tokens)
    )
    by_trial: dict[int, list[tuple[int, float]]] = {}
    for trial_id, tokens, loss in rows:
        by_trial.setdefault(trial_id, []).append((tokens, loss))
    if by_trial:
        conn.execute(
            update(trials).where(trials.c.id == bindparam("trial")).values(loss_change=bindparam("change")),
            [{"trial": t, "change": curve_change(curve)} for t, curve in by_trial.items()],
        )


# TrainSettings' default batch while schema versions 4-6 stored rungs: what a rung of theirs whose
# settings name no batch trained at (a fact of those versions, not today's default).
_V6_DEFAULT_BATCH = 16


def _rebuild_ladder_rungs(conn: Any) -> None:
    """Give an older database's ladder rungs their batch size (schema version 7), read from each
    row's stored settings (`_V6_DEFAULT_BATCH` where they name none), in the rebuilt table whose
    key includes it: a unique constraint cannot be altered on SQLite. The rows are read, the table
    dropped (its index and id sequence with it) and made again, in the caller's transaction."""
    table = schema.LadderRung.__table__
    old = [c["name"] for c in conn.dialect.get_columns(conn, table.name)]
    if "batch_size" in old:  # made by `create_all` just now, from an older version without ladders
        return
    rows = [dict(r) for r in conn.execute(text(f"SELECT * FROM {table.name}")).mappings()]
    table.drop(conn)
    table.create(conn)
    for row in rows:
        row.pop("id")
        try:
            batch = json.loads(row["settings_json"]).get("batch_size")
        except (ValueError, AttributeError):
            batch = None
        row["batch_size"] = batch if isinstance(batch, int) and batch > 0 else _V6_DEFAULT_BATCH
    if rows:
        conn.execute(table.insert(), rows)


# Trial order: by number, unnumbered (claimed, not yet asked) rows last on every backend, the row
# id breaking ties.
_BY_NUMBER = (schema.Trial.number.is_(None), schema.Trial.number, schema.Trial.id)


def _config_columns(cfg: ArchConfig) -> dict[str, Any]:
    counts, flops = param_counts(cfg), flop_counts(cfg)
    return dict(
        config_json=cfg.to_json(indent=None),
        **cfg.to_dict(),
        aspect_ratio=cfg.aspect_ratio,
        d_ff_ratio=cfg.d_ff_ratio,
        attention_layout=cfg.attention_layout,
        params_total=counts.total,
        params_non_embedding=counts.non_embedding,
        flops_forward_per_token=float(flops.forward),
        flops_train_per_token=float(flops.train),
        kv_cache_bytes_per_token=float(kv_cache_bytes_per_token(cfg)),
    )


class _DamagedValue(ValueError):
    """A stored value that is not what its column holds: text in a number column (SQLite keeps
    what it is given), a spec or config of another shape. `Storage._session` turns it, like JSON
    that does not parse, into the damaged-database line (issue 26 probe 5: tracebacks before)."""


# Sizes every trial's shape has, positive: a report takes their logarithm.
_POSITIVE_COLUMNS = frozenset({"params_total", "flops_forward_per_token", "flops_train_per_token"})


def _check_numbers(rows: Sequence[Sequence[Any]], columns: Sequence[Any], owner: str = "a trial") -> None:
    """Raises `_DamagedValue` for a value in a number column of `rows` that is not a number, or a
    size (`_POSITIVE_COLUMNS`) that is not positive; `owner` names the row in the message."""
    numeric = [i for i, c in enumerate(columns) if isinstance(c.type, (Integer, Float, schema.Real))]
    for row in rows:
        for i in numeric:
            value, name = row[i], columns[i].key
            if not (value is None or isinstance(value, (int, float))):
                raise _DamagedValue(f"the {name} of {owner} is {quoted(str(value))}, not a number")
            if value is not None and name in _POSITIVE_COLUMNS and not value > 0:
                raise _DamagedValue(f"the {name} of {owner} is {value!r}, not a positive number")


def _checked(row: Any, owner: str) -> Any:
    """An ORM row whose number columns hold numbers (`_check_numbers`), returned as it is.

    Every reader of a stored row goes through it (or `_check_numbers`), as through `_json_of` for
    its JSON: SQLite keeps whatever a column is given, so text in a number column, or JSON of
    another shape, reached the readers' arithmetic and ended in a traceback (issue 26 probe 6).
    """
    columns = list(type(row).__table__.columns)
    _check_numbers([tuple(getattr(row, c.key) for c in columns)], columns, owner)
    return row


def _json_of(text: Any, kind: type, what: str) -> Any:
    """A stored JSON column parsed, which must be a JSON object (`kind` dict) or list (list)."""
    if not isinstance(text, str):
        raise _DamagedValue(f"{what} is not JSON text")
    value = json.loads(text)  # JSONDecodeError: `Storage._session` says the database is damaged
    if not isinstance(value, kind):
        raise _DamagedValue(f"{what} is not a JSON {'object' if kind is dict else 'list'}")
    return value


def _loss_of(value: float, what: str) -> float:
    """A stored run's final loss: finite and >= 0 (a cross-entropy), as every run that is stored
    ended; any other was written by hand or by a damaged copy, and reached a fit's logarithm."""
    if not (math.isfinite(value) and value >= 0):
        raise _DamagedValue(f"the val_loss of {what} is {short_number(value)}, not a loss a finished run has")
    return value


def _curve_of(text: Any, what: str) -> tuple[tuple[int, float], ...]:
    """A stored curve: a JSON list of (tokens, loss) points."""
    try:
        return tuple((int(t), float(v)) for t, v in _json_of(text, list, what))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, _DamagedValue):
            raise
        raise _DamagedValue(f"{what} is not a list of (tokens, loss) points") from None


def _non_negative(value: Any) -> bool:
    """A finite real number >= 0 (not a bool): a loss rule's size_beta or extrapolate."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _trial_record(row: schema.Trial) -> TrialRecord:
    values = {c.key: getattr(row, c.key) for c in schema.Trial.__table__.columns}
    _check_numbers([tuple(values.values())], list(schema.Trial.__table__.columns))
    try:
        config = ArchConfig.from_json(row.config_json) if row.config_json else None
    except ArchsearchError as exc:
        raise _DamagedValue(f"trial {row.number}'s {exc}") from None
    return TrialRecord(
        id=row.id,
        study=row.study,
        number=row.number,
        status=row.status,
        reason=row.reason,
        attempts=row.attempts,
        params=_json_of(row.params_json, dict, f"trial {row.number}'s params") if row.params_json else {},
        config=config,
        values=values,
    )


def _run_columns(
    tokens: int,
    val_loss: float,
    val_curve: Sequence[Sequence[float]],
    settings: Mapping[str, Any] | None,
    device_fingerprint: str | None,
    corpus_fingerprint: str | None,
    wall_time_s: float | None,
) -> dict[str, Any]:
    """The columns a long run and a ladder rung share: what one training run measured."""
    return dict(
        tokens=int(tokens),
        val_loss=float(val_loss),
        val_curve_json=json.dumps([[int(t), float(v)] for t, v in val_curve]),
        settings_json=json.dumps(dict(settings or {}), sort_keys=True),
        device_fingerprint=device_fingerprint,
        corpus_fingerprint=corpus_fingerprint,
        wall_time_s=wall_time_s,
    )


def _ladder_rung_record(row: schema.LadderRung) -> LadderRungRecord:
    what = f"ladder rung {row.id} of {row.study!r}"
    _checked(row, what)
    try:
        config = ArchConfig.from_json(row.config_json)
    except ArchsearchError as exc:
        raise _DamagedValue(f"the config of {what}: {exc}") from None
    return LadderRungRecord(
        study=row.study,
        trial_number=row.trial_number,
        tokens_per_param=row.tokens_per_param,
        batch_size=row.batch_size,
        target_params=row.target_params,
        shape_key=row.shape_key,
        config=config,
        params_total=row.params_total,
        params_non_embedding=row.params_non_embedding,
        seed=row.seed,
        tokens=row.tokens,
        val_loss=_loss_of(row.val_loss, what),
        val_curve=_curve_of(row.val_curve_json, f"the curve of {what}"),
        settings=_json_of(row.settings_json, dict, f"the settings of {what}"),
        device_fingerprint=row.device_fingerprint,
        corpus_fingerprint=row.corpus_fingerprint,
        wall_time_s=row.wall_time_s,
        created_at=row.created_at,
    )


def _long_run_record(row: schema.LongRun) -> LongRunRecord:
    what = f"long run {row.id} of {row.study!r}"
    _checked(row, what)
    return LongRunRecord(
        study=row.study,
        trial_number=row.trial_number,
        multiplier=row.multiplier,
        seed=row.seed,
        tokens=row.tokens,
        val_loss=_loss_of(row.val_loss, what),
        val_curve=_curve_of(row.val_curve_json, f"the curve of {what}"),
        settings=_json_of(row.settings_json, dict, f"the settings of {what}"),
        device_fingerprint=row.device_fingerprint,
        corpus_fingerprint=row.corpus_fingerprint,
        wall_time_s=row.wall_time_s,
        created_at=row.created_at,
    )
