"""Input files that are not plain files: each ends in one line with exit code 2, and no wait without
end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from tests.faults.test_inputs import _one_line


# --- a FIFO where a file is read ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("command", "what"), [(["space", "check"], "search spec"), (["config", "check"], "config file")],
    ids=["space", "config"],
)  # fmt: skip
def test_a_fifo_given_as_an_input_file_is_refused_at_once(tmp_path, command, what):
    """Opening a FIFO to read waits for a writer that never comes: run in a child process, bounded,
    so a regression fails the test instead of hanging it."""
    fifo = tmp_path / "input.toml"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-m", "archsearch", *command, str(fifo)], capture_output=True, text=True, timeout=60,
        env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"error: cannot read {what} {fifo}: not a regular file"


def test_a_folder_given_as_the_space_still_says_so(tmp_path):
    folder = tmp_path / "space.toml"
    folder.mkdir()
    result = CliRunner().invoke(app, ["space", "check", str(folder)])
    _one_line(result, 2, "Is a directory")
