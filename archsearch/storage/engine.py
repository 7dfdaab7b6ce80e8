"""Engines and dialects: the database URL, and the engine each backend gets, with every wait on
the database bounded.

- SQLite runs in WAL mode with a 30 s busy timeout and writes with `BEGIN IMMEDIATE`: a deferred
  transaction that later needs the write lock fails at once whatever the timeout, so every
  transaction here, and in Optuna's engine on the same file, takes the lock when it begins.
- PostgreSQL engines get `pool_pre_ping` (Optuna sets it only for MySQL) and a small pool, the
  connect timeout, a lock timeout as long as SQLite's, TCP keepalives and a user timeout for a
  network that goes away mid-statement, and a client-side bound on each statement and commit for
  a server that is there but never answers (`watchdog`).
- A reader's engine never changes the database: it keeps the file's journal mode, refuses writes
  (SQLite's `query_only`, PostgreSQL's read-only transactions), and never checkpoints a WAL that a
  stopped writer left (it opens such a file read-only).
"""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from archsearch.storage.errors import StorageError

DEFAULT_STORAGE_URL = "sqlite:///archsearch.db"
STORAGE_ENV = "ARCHSEARCH_STORAGE"
BUSY_TIMEOUT_S = 30  # 5 s gave "database is locked" with 64 concurrent writers, 30 s never did
CONNECT_TIMEOUT_S = 15  # a PostgreSQL server that does not answer (libpq's connect_timeout)
TCP_USER_TIMEOUT_S = 60  # data sent to a PostgreSQL server that stays unacknowledged this long: it is gone
READ_ONLY = "archsearch_read_only"  # execution option of the sessions that only read


def storage_url(url: str | None = None) -> str:
    """The URL to use: `url`, else `$ARCHSEARCH_STORAGE`, else `sqlite:///archsearch.db`."""
    if url is not None and not url.strip():  # `--storage ""` was the default database, silently
        raise StorageError("--storage is empty: give a database URL (e.g. sqlite:///archsearch.db)")
    return url or os.environ.get(STORAGE_ENV) or DEFAULT_STORAGE_URL


def parse_url(url: str) -> URL:
    try:
        return make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        shown = re.sub(r"(//[^/@:]*:)[^/@]*@", r"\1***@", url)  # a password, unparsed, is still hidden
        raise StorageError(f"not a database URL: {shown!r} (e.g. {DEFAULT_STORAGE_URL})") from None


def sqlite_path(url: URL) -> Path:
    if not url.database or url.database == ":memory:":
        raise StorageError("an in-memory SQLite database cannot hold a search; give a file path")
    if url.query:
        # archsearch opens the file its own way (`engine_kwargs`); the options were honoured by
        # some connections and not others: `?mode=ro&uri=true` sent a search's trials to a new
        # file named `trials.db?mode=ro`, the database named left untouched.
        raise StorageError(f"{masked(url)}: a SQLite URL takes no options; give sqlite:///PATH")
    if url.database.endswith("/"):  # sqlite:///new/ would make a database file named `new`
        raise StorageError(
            f"{masked(url)} names a folder: give the database file, e.g. {url.database}archsearch.db"
        )
    return Path(url.database)


def database_files(url: str | None) -> dict[Path, str]:
    """The files of the SQLite database at `url` (see `storage_url`), the database and its WAL,
    index and journal beside it, each with what to call it; none for a server's database. A
    command's outputs are checked against them (`fileio.check_writable`).

    Raises:
        StorageError: a malformed URL, an in-memory database or a SQLite URL with options.
    """
    parsed = parse_url(storage_url(url))
    if parsed.get_backend_name() != "sqlite":
        return {}
    path = sqlite_path(parsed)
    what = f"the database {masked(parsed)}"
    return {
        path: what,
        **{path.with_name(path.name + s): f"a file of {what}" for s in ("-wal", "-shm", "-journal")},
    }


def use_immediate_transactions(engine: Engine, reader: bool = False) -> None:
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
        # found it to be archsearch's (`Storage._use_wal`).
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        # Reads take no write lock (WAL readers never block, nor wait for, the writer).
        read_only = reader or connection.get_execution_options().get(READ_ONLY, False)
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def engine_kwargs(url: URL, reader: bool = False) -> dict[str, Any]:
    if url.get_backend_name() == "sqlite":
        kwargs = {"connect_args": {"timeout": BUSY_TIMEOUT_S}}
        path = sqlite_path(url)
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


def watched(engine: Any) -> Any:
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


def masked(url: URL) -> str:
    return url.render_as_string(hide_password=True)
