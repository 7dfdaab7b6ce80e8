"""Storage's core: opening a database (creating or upgrading its tables under a lock between
processes), checking it, Optuna's storage on it, and the one session helper every read and write
goes through.

A storage opened to read (`StorageCore.open(read_only=True)`, every command that only reads)
never changes the database: it creates and upgrades nothing and its engine refuses writes
(`engine`). Creating the tables is serialised between processes (a file lock for SQLite, an
advisory lock for PostgreSQL), so several searches can start on a new database at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from sqlalchemy import Engine, create_engine, delete, select, text, update
from sqlalchemy.engine import URL
from sqlalchemy.exc import (
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

# `engine.BUSY_TIMEOUT_S` is read through its module when a message is written, so the bound a
# message names is the one the engine was given.
from archsearch.storage import engine, schema
from archsearch.storage.engine import (
    CONNECT_TIMEOUT_S,
    READ_ONLY,
    engine_kwargs,
    masked,
    parse_url,
    sqlite_path,
    storage_url,
    use_immediate_transactions,
    watched,
)
from archsearch.storage.errors import (
    SQLITE_CORRUPT,
    SQLITE_ENVIRONMENT,
    DamagedStorageError,
    ReadOnlyStorageError,
    SchemaVersionError,
    StorageError,
    StorageUnavailableError,
    ValueRefusedError,
    busy,
    damaged_error,
    failure_cause,
    one_line,
    read_only_error,
    refused_writes,
    sqlite_code,
    unreachable,
)
from archsearch.storage.migrations import check_or_create
from archsearch.storage.rows import DamagedValue
from archsearch.storage.schema import SCHEMA_VERSION

if TYPE_CHECKING:
    import optuna

_PG_INIT_LOCK = 0x61726368  # "arch": the advisory lock id that serialises table creation


@contextlib.contextmanager
def _lock_file(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path`, and remove the file before letting go, so no lock file
    is left behind (one per database would pile up in the temp folder). A process that waited on the
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


class StorageCore:
    """An open database: its engine, locks and sessions. `Storage` adds what is stored in it.

    Use `Storage.open(url)`; close with `close()` or a `with` block.
    """

    def __init__(self, url: URL, engine: Engine) -> None:
        self._url = url
        self._engine = engine
        self._optuna: optuna.storages.BaseStorage | None = None
        self.host = f"{socket.gethostname()}:{os.getpid()}"

    # --- opening ---------------------------------------------------------------------------------
    @classmethod
    def open(cls, url: str | None = None, *, create: bool = True, read_only: bool = False) -> Self:
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
        parsed = parse_url(storage_url(url))
        sqlite = parsed.get_backend_name() == "sqlite"
        if sqlite:
            path = sqlite_path(parsed)
            if not path.parent.is_dir():
                raise StorageError(f"no folder {str(path.parent)!r} for the SQLite database {path}")
            if path.exists() and not path.is_file():  # a folder, a FIFO, a device: SQLite reads only files
                kind = "a folder" if path.is_dir() else "not a regular file"
                raise StorageError(f"{path} is {kind}, not a SQLite database")
            if not create and not path.is_file():
                raise StorageError(f"no database at {path}")
        try:
            bound = watched(create_engine(parsed, **engine_kwargs(parsed, reader=read_only)))
        except (NoSuchModuleError, ImportError) as exc:
            raise StorageError(f"no driver for {masked(parsed)}: {one_line(exc)}") from None
        if sqlite:
            use_immediate_transactions(bound, reader=read_only)
        storage = cls(parsed, bound)
        try:
            storage._initialise(create, read_only)
        except BaseException:
            bound.dispose()
            raise
        return storage

    def _initialise(self, create: bool, read_only: bool = False) -> None:
        with contextlib.nullcontext() if read_only else self._init_lock():  # a reader creates nothing
            try:
                with self._engine.begin() as conn:
                    found = check_or_create(
                        conn, create=create, read_only=read_only, display_url=self.display_url,
                        sqlite=self.is_sqlite,
                    )  # fmt: skip
                if found == SCHEMA_VERSION and self.is_sqlite and not read_only:
                    self._use_wal()
            except DBAPIError as exc:
                if refused_writes(exc):
                    raise self._read_only_error(exc) from None
                if busy(exc):  # another process's lock, held past the bound: the environment's fault
                    cause = failure_cause(exc)
                    raise StorageUnavailableError(
                        f"the database {self.display_url} failed: {cause} (another process held its lock "
                        f"for more than {engine.BUSY_TIMEOUT_S} s)",
                        cause,
                    ) from None
                if unreachable(exc):  # a server down, restarting or full: the environment's fault
                    raise self._unreachable_error(exc) from None
                code = sqlite_code(exc)
                if code == SQLITE_CORRUPT:  # as `check_intact` finds it: the file's fault, not the input's
                    raise self._damaged(one_line(exc)) from None
                if code in SQLITE_ENVIRONMENT:  # an I/O error, a full disk, a file-size limit
                    cause = failure_cause(exc)
                    raise StorageUnavailableError(
                        f"the database {self.display_url} failed: {cause}", cause
                    ) from None
                raise StorageError(f"cannot use the database {self.display_url}: {one_line(exc)}") from None
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
            path = Path(os.path.realpath(sqlite_path(self._url)))
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
            if unreachable(exc):
                raise self._unreachable_error(exc) from None
            raise StorageError(f"cannot use the database {self.display_url}: {one_line(exc)}") from None

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
            if refused_writes(exc):
                raise self._read_only_error(exc) from None
            raise StorageError(f"database error on {self.display_url}: {one_line(exc)}") from None

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
            found = one_line(exc)
        if found != "ok":
            raise self._damaged(f"SQLite's quick_check: {found}")

    def _unreachable_error(self, exc: DBAPIError) -> StorageUnavailableError:
        cause = failure_cause(exc)
        return StorageUnavailableError(
            f"cannot reach the database {self.display_url} (waited up to {CONNECT_TIMEOUT_S} s): {cause}",
            cause,
        )

    def _damaged(self, why: str) -> DamagedStorageError:
        return damaged_error(self.display_url, why)

    def _read_only_error(self, exc: DBAPIError) -> ReadOnlyStorageError:
        return read_only_error(exc, self.display_url, self.is_sqlite)

    @property
    def is_sqlite(self) -> bool:
        return self._url.get_backend_name() == "sqlite"

    @property
    def display_url(self) -> str:
        """The URL with any password hidden, for messages."""
        return masked(self._url)

    @property
    def url(self) -> str:
        return self._url.render_as_string(hide_password=False)

    def close(self) -> None:
        self._engine.dispose()
        if self._optuna is not None:
            optuna_engine = getattr(self._optuna, "engine", None)
            if optuna_engine is not None:
                optuna_engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def optuna_storage(self) -> optuna.storages.RDBStorage:
        """Optuna's RDB storage on the same database, with the same locking rules."""
        if self._optuna is None:
            import optuna

            with self._init_lock():
                try:
                    storage = optuna.storages.RDBStorage(self.url, engine_kwargs=engine_kwargs(self._url))
                except (SQLAlchemyError, RuntimeError) as exc:  # RuntimeError: tables of another Optuna
                    raise StorageError(
                        f"cannot open Optuna's tables in {self.display_url}: {one_line(exc)}"
                    ) from None
            if self.is_sqlite:
                use_immediate_transactions(storage.engine)
                storage.engine.dispose()  # connections opened before the listeners are dropped
            watched(storage.engine)
            self._optuna = storage
        return self._optuna

    # --- the one session helper, and the writes several record kinds share --------------------------
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
            # the invalidated connection: the statement's own error is the one to tell, not the
            # rollback's long traceback.
            cause = failure_cause(exc)
            raise StorageUnavailableError(f"the database {self.display_url} failed: {cause}", cause) from None
        except DBAPIError as exc:
            if not read_only and refused_writes(exc):
                raise self._read_only_error(exc) from None
            if isinstance(exc, (IntegrityError, DataError)):
                raise ValueRefusedError(f"database error on {self.display_url}: {one_line(exc)}") from None
            if isinstance(exc, (OperationalError, InterfaceError)):
                cause = failure_cause(exc)
                message = f"the database {self.display_url} failed: {cause}"
                if busy(exc):  # the bound the wait ran out of, as `Storage.open` says it
                    message += f" (another process held its lock for more than {engine.BUSY_TIMEOUT_S} s)"
                raise StorageUnavailableError(message, cause) from None
            raise StorageError(f"database error on {self.display_url}: {one_line(exc)}") from None
        except OverflowError as exc:  # pysqlite binds integers only up to 2**63 - 1
            raise ValueRefusedError(f"database error on {self.display_url}: {exc}") from None
        except (json.JSONDecodeError, DamagedValue) as exc:  # was a traceback in every reader
            raise self._damaged(f"a stored value is damaged: {exc}") from None

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
