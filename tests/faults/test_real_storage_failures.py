"""The database failing for real, not injected: a disk that fills mid-search (a small tmpfs the test
mounts), and a PostgreSQL server stopped mid-search (a throwaway cluster the test starts and stops).

Each ends the search in one line naming the database and the cause; the file (or the server) is
left intact, and once the space is freed (the server started again) the search continues to
exactly N. Both fault at a fixed point: inside a trial's evaluation (a Ray worker, so the driver is
mid-search, with a trial running), before the outcome returns.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from ray import cloudpickle  # Ray vendors it
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.search import driver as driver_module
from archsearch.search.driver import SearchOptions, run_search
from archsearch.storage import Storage, StorageUnavailableError
from tests import helpers
from tests.helpers import N, failure_message, fill_disk, instant, resume_search
from tests.postgres import throwaway_cluster
from tests.specs import tiny_spec, tiny_toml

# Ray workers need not import tests/: this module's functions and the helpers' go by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(helpers)
pytestmark = pytest.mark.usefixtures("ray_session")

LEASE_S = 2  # a trial the failure leaves running is re-queued by a resume this soon


# --- a full disk --------------------------------------------------------------------------------------
def test_a_disk_that_fills_mid_search_ends_in_one_line_and_the_hint_finishes_exactly_n(
    small_disk, tmp_path, monkeypatch
):
    url = f"sqlite:///{small_disk / 'trials.db'}"
    marker = tmp_path / "filled"

    def fill_then_finish(request, known=None, board=None):
        if request.number >= 1 and not marker.exists():  # trial 0 recorded, trial 1 running
            marker.touch()
            fill_disk(small_disk)
        return instant(request)

    space = tmp_path / "space.toml"
    space.write_text(tiny_toml(search=f"trials = {N}\nprune = false"))
    monkeypatch.setattr(driver_module, "evaluate", fill_then_finish)
    # The CLI's own SearchOptions, with a short lease: the failure leaves the trial being recorded
    # running (re-queueing it needs the write that failed), and a resume waits out its lease.
    monkeypatch.setattr(driver_module, "SearchOptions", functools.partial(SearchOptions, lease_s=LEASE_S))
    result = CliRunner().invoke(app, ["search", "--space", str(space), "--study", "s", "--storage", url])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert all(line.startswith("[") for line in lines[:-1]), result.output  # progress, then the line
    assert "Traceback" not in result.output
    line = lines[-1]
    doing = r"[A-Za-z0-9'() ]+"  # whichever write comes first: archsearch's or Optuna's
    assert re.match(
        "^error: " + failure_message(url, doing, "OperationalError: database or disk is full")[1:], line
    )
    assert line.count("`") == 2 and "--resume" in line, line
    # Read without writing: a read-write connection closing last would checkpoint onto the full disk.
    conn = sqlite3.connect(f"{(small_disk / 'trials.db').as_uri()}?mode=ro", uri=True)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    (small_disk / "filler").unlink()  # the space freed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(driver_module, "evaluate", instant)
    done = CliRunner().invoke(app, shlex.split(line.rsplit("`", 2)[-2])[1:])  # followed literally
    assert done.exit_code == 0, done.output
    with Storage.open(url, read_only=True) as db:
        counts = db.counts("s")
    assert counts["complete"] == N and set(counts) <= {"complete", "interrupted", "duplicate"}, counts
    assert list(elsewhere.iterdir()) == []


# --- a PostgreSQL server stopped ---------------------------------------------------------------------
def test_a_postgresql_server_stopped_mid_search_ends_in_one_line_and_a_resume_finishes_exactly_n(tmp_path):
    with throwaway_cluster() as cluster:
        stop = cluster.stop_command("immediate")  # as a crash, an OOM kill or a failover would
        marker = tmp_path / "stopped"

        def stop_server_then_finish(request, known=None, board=None):
            if request.number >= 1 and not marker.exists():  # trial 0 recorded, trial 1 running
                marker.touch()
                subprocess.run(stop, check=True, capture_output=True, timeout=180)  # -w: until it is down
            return instant(request)

        with Storage.open(cluster.url) as db, pytest.raises(StorageUnavailableError) as info:
            options = SearchOptions(study="s", trials=N, lease_s=LEASE_S)
            run_search(tiny_spec(), db, options, evaluate_fn=stop_server_then_finish)
        message = str(info.value)
        assert re.match(failure_message(cluster.url, r"[A-Za-z0-9'() ]+", "OperationalError: .+"), message), (
            message
        )
        assert "\n" not in message and f"left running until the lease expires ({LEASE_S} s)" in message
        cluster.start()
        resume_search(cluster.url, lease_s=LEASE_S)  # exactly N, nothing running in either table


@pytest.mark.long
def test_a_postgresql_server_that_is_there_and_never_answers_is_bounded(monkeypatch):
    """Every server process stopped (SIGSTOP, as a frozen VM): its kernel still acknowledges TCP, so
    keepalives never fire, and a command waited without end; the statement's bound ends it."""
    from archsearch.storage import StorageError, engine
    from tests.processes import descendants

    monkeypatch.setenv("ARCHSEARCH_DB_STATEMENT_S", "2")
    # A new connection to the frozen server is bounded by libpq's connect timeout: 3 s here, not
    # the product's 15, which this test would otherwise sit out.
    monkeypatch.setattr(engine, "CONNECT_TIMEOUT_S", 3)
    with throwaway_cluster() as cluster, Storage.open(cluster.url) as db:
        db.study_names()  # a pooled connection, answered
        postmaster = int((cluster.root / "data" / "postmaster.pid").read_text().split()[0])
        frozen = {postmaster, *descendants(postmaster)}
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            with pytest.raises(StorageError) as info:
                db.study_names()
            took = time.monotonic() - start
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
        assert took < 60, took  # 2 s for the statement, libpq's 3 s connect bound for a new one
        message = str(info.value)
        assert "\n" not in message, message
        assert "did not answer within 2 s" in message or "timeout" in message, message
        assert db.study_names() == []  # the server resumed: a new connection answers


PG_HOLDER = """
import os, sys, time, psycopg
conn = psycopg.connect(sys.argv[1])
conn.execute("SELECT name FROM archsearch_studies WHERE name = 's' FOR UPDATE")  # until released
print("locked", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
conn.rollback()
"""


def test_a_postgresql_lock_held_by_another_process_past_the_timeout(tmp_path, monkeypatch):
    from sqlalchemy.engine import make_url

    from archsearch.storage import engine as engine_module
    from tests.postgres import postgres_database

    monkeypatch.setattr(engine_module, "BUSY_TIMEOUT_S", 1)  # PostgreSQL's lock_timeout is set from it
    release, marker = tmp_path / "release", tmp_path / "locked-once"
    with postgres_database() as url:
        parsed = make_url(url)
        dsn = f"host={parsed.host} port={parsed.port or 5432} user={parsed.username} dbname={parsed.database}"

        def lock_then_finish(request, known=None, board=None):
            if request.number >= 1 and not marker.exists():  # the study's row, as a driver's claim takes it
                marker.touch()
                holder = subprocess.Popen(
                    [sys.executable, "-c", PG_HOLDER, dsn, str(release)], stdout=subprocess.PIPE, text=True
                )
                assert holder.stdout.readline().strip() == "locked"  # held before the outcome returns
            return instant(request)

        try:
            with Storage.open(url) as db, pytest.raises(StorageUnavailableError) as info:
                options = SearchOptions(study="s", trials=N, lease_s=LEASE_S)
                run_search(tiny_spec(), db, options, evaluate_fn=lock_then_finish)
        finally:
            release.touch()
        message = str(info.value)
        cause = "LockNotAvailable: canceling statement due to lock timeout"  # psycopg's class for 55P03
        assert re.match(failure_message(url, r"[A-Za-z0-9'() ]+", cause), message), message
        monkeypatch.undo()  # the full timeout: the holder lets go within it
        resume_search(url, lease_s=LEASE_S)
