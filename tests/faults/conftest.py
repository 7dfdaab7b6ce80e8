"""Fault injection: each test breaks one thing a run depends on and checks the exit code (or the
error), the one line, and the database afterwards (nothing left running, a resume reaching
exactly N). Backends: `backend_url` (tests/conftest.py), SQLite files and a throwaway database on
the local PostgreSQL."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A folder on an 8 MB tmpfs, mounted for the test; skips, saying why, where it cannot be."""
    folder = tmp_path / "small"
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a full disk needs a small tmpfs, and mounting one needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs for a full disk: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)
