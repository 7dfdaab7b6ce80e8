"""A throwaway database on the local PostgreSQL for a test, or a throwaway cluster of the test's
own (one it can stop); the test skips, saying why, without one."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432"


def _postgres_admin():
    try:
        import psycopg
    except ImportError:
        return None, "psycopg is not installed"
    try:
        return psycopg.connect(
            "host=127.0.0.1 port=5432 user=postgres dbname=postgres", autocommit=True, connect_timeout=3
        ), None
    except psycopg.Error as exc:
        return None, f"no PostgreSQL at 127.0.0.1:5432 ({str(exc).strip().splitlines()[0]})"


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """The URL of a new, empty database, dropped afterwards; `pytest.skip` when PostgreSQL is absent."""
    admin, why = _postgres_admin()
    if admin is None:
        pytest.skip(f"PostgreSQL backend not tested: {why}")
    name = f"archsearch_test_{uuid.uuid4().hex[:12]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_SERVER}/{name}"
    finally:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.close()


def _server_bin() -> Path | None:
    """The folder of the installed server's programs (`initdb`, `pg_ctl`), None without one."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: p.parts)
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class Cluster:
    """A PostgreSQL cluster of this test's own: its data and socket in a temporary folder, on a
    free port; run as the `postgres` user when the tests run as root (initdb refuses root)."""

    def __init__(self, bin_dir: Path, root: Path, port: int, as_user: list[str]) -> None:
        self.bin_dir, self.root, self.port, self.as_user = bin_dir, root, port, as_user
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/archsearch"

    def command(self, *args: str) -> list[str]:
        """`pg_ctl` on this cluster with `args`, as its user."""
        return [*self.as_user, str(self.bin_dir / "pg_ctl"), "-D", str(self.root / "data"), *args]

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.root / "server.log")
        subprocess.run(self.command("-w", "-t", "120", "-o", options, "-l", log, "start"), check=True,
                       capture_output=True, timeout=180)  # fmt: skip

    def stop_command(self, mode: str) -> list[str]:
        """The command that stops the server (`-m immediate`: as a crash or a kill would)."""
        return self.command("-w", "-t", "120", "-m", mode, "stop")


@contextlib.contextmanager
def throwaway_cluster() -> Iterator[Cluster]:
    """A new PostgreSQL cluster (initdb, pg_ctl) with an empty database `archsearch`, started;
    stopped and deleted afterwards. Skips, saying why, where the server's programs are absent."""
    bin_dir = _server_bin()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server programs (initdb, pg_ctl) installed")
    try:
        import psycopg
    except ImportError:
        pytest.skip("psycopg is not installed")
    as_user: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="archsearch-pg-"))  # not under pytest's 0700 folders
    try:
        if os.geteuid() == 0:  # initdb refuses to run as root
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                pytest.skip("running as root, and there is no postgres user to run initdb as")
            if shutil.which("runuser") is None:
                pytest.skip("running as root, and no runuser to run initdb as postgres")
            os.chown(root, user.pw_uid, user.pw_gid)
            as_user = ["runuser", "-u", "postgres", "--"]
        initdb = [
            *as_user, str(bin_dir / "initdb"), "-D", str(root / "data"), "-U", "postgres", "--auth=trust",
            "--no-sync",
        ]  # fmt: skip
        done = subprocess.run(initdb, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            pytest.skip(f"initdb failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        cluster = Cluster(bin_dir, root, port, as_user)
        cluster.start()
        try:
            with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres",
                                 autocommit=True, connect_timeout=10) as admin:  # fmt: skip
                admin.execute('CREATE DATABASE "archsearch"')
            yield cluster
        finally:
            subprocess.run(cluster.stop_command("immediate"), capture_output=True, timeout=180)
    finally:
        shutil.rmtree(root, ignore_errors=True)
