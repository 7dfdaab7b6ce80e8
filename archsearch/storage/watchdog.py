"""A client-side bound on every PostgreSQL statement, for a server that is there but never answers.

A server whose processes are stopped (SIGSTOP, a frozen VM, a hung storage layer under it) keeps
its host's kernel answering TCP: keepalives are acknowledged and sent data is, so neither TCP
keepalive nor `tcp_user_timeout` ever fires; `statement_timeout` cannot fire in a backend that
does not run; and libpq has no client-side timeout. A command would then wait without end: a
`validate` under a frozen server waited over 250 s, until the server was resumed.

So each statement (`BoundedCursor.execute`, the cursor every archsearch and Optuna engine's
connections use, `engine.engine_kwargs`) and each commit or rollback (`watch_engine`) is watched by
one thread: past `statement_bound_s()` without an answer, it shuts the connection's socket down,
the blocked call fails at once with the driver's `OperationalError`, and the statement's error
names the bound. archsearch's own statements are small (a study's rows, one trial's outcome);
another driver's lock is bounded sooner, by the server's `lock_timeout`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg

from archsearch.units import env_seconds

BOUND_ENV = "ARCHSEARCH_DB_STATEMENT_S"
DEFAULT_BOUND_S = 120.0


def statement_bound_s() -> float:
    """Seconds a statement may wait for the server: `$ARCHSEARCH_DB_STATEMENT_S`, else 120.

    Raises:
        ArchsearchError: a value that is not a number of seconds in (0, 86400): `inf` lifted the
            bound and a typo was the default, both silently (checked when an engine is watched).
    """
    return env_seconds(BOUND_ENV, DEFAULT_BOUND_S)


class _Watchdog:
    """Deadlines by connection; one daemon thread, started on first use, checks them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deadlines: dict[int, tuple[float, Any]] = {}  # id(connection) -> (deadline, connection)
        self.fired: set[int] = set()  # connections whose socket the watchdog shut
        self._thread: threading.Thread | None = None

    def arm(self, connection: Any) -> None:
        with self._lock:
            self._deadlines[id(connection)] = (time.monotonic() + statement_bound_s(), connection)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="archsearch-db-watchdog", daemon=True)
                self._thread.start()

    def disarm(self, connection: Any) -> None:
        with self._lock:
            self._deadlines.pop(id(connection), None)

    @contextlib.contextmanager
    def watching(self, connection: Any) -> Iterator[None]:
        self.arm(connection)
        try:
            yield
        finally:
            self.disarm(connection)

    def _run(self) -> None:
        while True:
            time.sleep(0.5)
            now = time.monotonic()
            with self._lock:
                late = [(key, c) for key, (deadline, c) in self._deadlines.items() if deadline <= now]
                for key, _ in late:
                    del self._deadlines[key]
                    self.fired.add(key)
            for _, connection in late:
                _shut(connection)


def _shut(connection: Any) -> None:
    """Shut the connection's socket down (both ways): libpq's blocked read returns at once."""
    with contextlib.suppress(Exception):  # the connection closed meanwhile
        fd = os.dup(connection.pgconn.socket)
        with socket.socket(fileno=fd) as sock:
            sock.shutdown(socket.SHUT_RDWR)


WATCHDOG = _Watchdog()


def _unanswered(connection: Any, exc: BaseException) -> BaseException:
    """`exc`, or, where the watchdog cut the connection, an error naming the bound."""
    if id(connection) not in WATCHDOG.fired:
        return exc
    WATCHDOG.fired.discard(id(connection))
    return psycopg.OperationalError(
        f"the server did not answer within {statement_bound_s():g} s (stopped or unreachable; "
        f"${BOUND_ENV} sets the bound)"
    )


class BoundedCursor(psycopg.Cursor):
    """psycopg's cursor, each statement watched (module docstring)."""

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        return self._watched(super().execute, args, kwargs)

    def executemany(self, *args: Any, **kwargs: Any) -> Any:
        return self._watched(super().executemany, args, kwargs)

    def _watched(self, call: Any, args: tuple, kwargs: dict) -> Any:
        with WATCHDOG.watching(self.connection):
            try:
                return call(*args, **kwargs)
            except psycopg.OperationalError as exc:
                raise _unanswered(self.connection, exc) from exc


def watch_engine(engine: Any) -> None:
    """Watch an engine's commits and rollbacks too (statements are watched by `BoundedCursor`):
    armed before the driver's commit, disarmed when the connection goes back to the pool or
    runs its next statement."""
    from sqlalchemy import event

    statement_bound_s()  # a bad $ARCHSEARCH_DB_STATEMENT_S is refused here, when the database opens

    def arm(conn: Any) -> None:
        dbapi = conn.connection.dbapi_connection
        if isinstance(dbapi, psycopg.Connection):
            WATCHDOG.arm(dbapi)

    def disarm(dbapi: Any, _record: Any) -> None:
        WATCHDOG.disarm(dbapi)

    event.listen(engine, "commit", arm)
    event.listen(engine, "rollback", arm)
    event.listen(engine.pool, "checkin", disarm)
