"""The command boundary: an empty or malformed value is refused, not taken for the default; a
library error, the environment's or the input's, ends in one line with its exit code; a bug keeps
its traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.cli import boundary as cli_boundary
from tests.helpers import example_space, one_line
from tests.results.studies import ladder_study


def test_an_error_line_folds_line_breaks_and_cuts_a_huge_value():
    from archsearch.errors import MAX_LINE, error_line

    line = error_line("bad value:\n" + "x" * 10_000_000)
    assert "\n" not in line and len(line) <= MAX_LINE + len("error: ")
    assert line.startswith("error: bad value: xxx") and line.endswith("characters cut)")


def test_empty_objectives_are_refused_not_the_default(study_url):
    """`pareto --objectives ''` ranked the study's own objectives, exit 0."""
    result = CliRunner().invoke(app, ["pareto", "--study", "s", "--objectives", "", "--storage", study_url])
    one_line(result, 2, "objectives '' must be loss then one or two of")


def test_an_empty_storage_is_refused_not_the_default_database(tmp_path, monkeypatch):
    """`--storage ''` opened ./archsearch.db (`no database at archsearch.db`)."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["studies", "--storage", ""])
    assert (
        one_line(result, 2) == "error: --storage is empty: give a database URL (e.g. sqlite:///archsearch.db)"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_library_that_cannot_be_mapped_under_a_memory_limit_is_the_out_of_memory_line(
    monkeypatch, tmp_path
):
    """`profile`, `train`, `align`, `export --scale-to` under `ulimit -v 500000` ended in
    torch's ImportError traceback ('libtorch_cpu.so: failed to map segment from shared object')."""

    def unmappable(*args, **kwargs):
        raise ImportError("libtorch_cpu.so: failed to map segment from shared object")

    monkeypatch.setattr("archsearch.cli.gpus.resolve_config", unmappable)
    result = CliRunner().invoke(app, ["align", "--preset", "gpt2-small", "--device", "h100-sxm"])
    assert one_line(result, 1) == f"error: {cli_boundary.OUT_OF_MEMORY}"


def test_another_import_error_keeps_its_traceback(monkeypatch):
    def missing(*args, **kwargs):
        raise ImportError("No module named 'nothing_here'")

    monkeypatch.setattr("archsearch.cli.gpus.resolve_config", missing)
    result = CliRunner().invoke(app, ["align", "--preset", "gpt2-small", "--device", "h100-sxm"])
    assert isinstance(result.exception, ImportError)  # a bug, not the environment: not hidden


def test_a_file_name_too_long_for_the_file_system_is_bad_input(study_url, tmp_path):
    """`pareto --plot <300 characters>.png` was exit 1, the environment's code."""
    out = tmp_path / f"{'a' * 300}.png"
    result = CliRunner().invoke(app, ["pareto", "--study", "s", "--plot", str(out), "--storage", study_url])
    assert one_line(result, 2) == f"error: cannot use {out}: File name too long"


def test_an_os_error_without_a_file_is_not_said_twice():
    assert cli_boundary.os_error_text(OSError(28, "No space left on device")) == "No space left on device"


def test_a_failed_training_run_says_why_on_stderr(monkeypatch):
    """`train --batch-size 1000000000000` exited 1 with the reason only in the table on
    stdout and nothing on stderr."""
    from archsearch.evaluators import trainer

    real = trainer.train

    def too_large(cfg, dataset, settings, progress=None):
        result = real(cfg, dataset, settings.__class__(**{**settings.__dict__, "tokens": 1}), progress)
        return result.__class__(
            **{**result.__dict__, "status": "failed", "reason": "config too large for cpu"}
        )

    monkeypatch.setattr(trainer, "train", too_large)
    result = CliRunner().invoke(app, ["train", "--preset", "byte-1m", "--device", "cpu", "--tokens", "512"])
    assert one_line(result, 1) == "error: the run failed: config too large for cpu"
    assert "failed (config too large for cpu)" in result.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["space", "check", ""],
        ["config", "check", " "],
        ["train", "--preset", "byte-1m", "--tokens", "64", "--data", ""],
        ["search", "--space", ""],
        ["export", "--study", "s", "--format", "hf", "--output", ""],
        ["profile", "--preset", "byte-1m", "--device", "cpu", "--cache", ""],
    ],
)
def test_an_empty_path_is_refused_not_read_as_the_working_folder(argv, tmp_path, monkeypatch):
    """`Path("")` is ".": `train --data ''` trained on the working folder's files."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, argv)
    assert one_line(result, 2).endswith(f"must name a file or folder, got {argv[-1]!r} (see --help)")
    assert list(tmp_path.iterdir()) == []  # nothing read into a cache, nothing written


FLOATS = "takes finite numbers separated by commas"


ADDRESS = "must be auto, HOST:PORT or ray://HOST:PORT"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["pareto", "--study", "tiny", "--reference", ""], f"error: --reference {FLOATS}, got ''"),
        (["export", "--study", "tiny", "--knee", "--format", "hf", "-o", "{out}", "--device", ""],
         "error: --device only go with --scale-to"),
        (["search", "--space", "{space}", "--trials", "1", "--address", ""],
         f"error: --address {ADDRESS}, got ''"),
        (["search", "--space", "{space}", "--trials", "1", "--address", "not a host"],
         f"error: --address {ADDRESS}, got 'not a host'"),
    ],
    ids=["pareto-reference", "export-device", "search-address", "search-address-malformed"],
)  # fmt: skip
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_empty_or_malformed_value_is_not_taken_for_the_default(tmp_path, argv, line):
    """`--reference ''` used the default point, `export --device ''` wrote the folder, `--address ''`
    started a local Ray; `--address 'not a host'` failed after Ray's start-up as the environment's."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    ladder_study(url)
    args = [a.format(out=tmp_path / "out", space=example_space(tmp_path)) for a in argv]
    result = CliRunner().invoke(app, [*args, "--storage", url])
    assert one_line(result, 2) == line
    assert not (tmp_path / "out").exists()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_command_started_with_its_stdout_closed_says_so():
    """`archsearch presets >&-` exited 0 having printed nothing."""
    run = subprocess.run(
        [sys.executable, "-m", "archsearch", "presets"], stderr=subprocess.PIPE, text=True, timeout=120,
        preexec_fn=lambda: os.close(1), env={**os.environ, "COLUMNS": "100"},
    )  # fmt: skip
    assert run.returncode == 1
    assert run.stderr.strip() == "error: stdout is closed: nothing could be printed"


def test_a_huge_objectives_value_is_quoted_once_and_shortened(tmp_path, monkeypatch):
    """`--objectives` of 100k characters was echoed twice and cut to one line saying
    199,212 characters were cut."""
    monkeypatch.chdir(tmp_path)  # the default database's folder
    huge = "x" * 100_000
    result = CliRunner().invoke(app, ["pareto", "--study", "s", "--objectives", huge])
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert "\n" not in line and "characters cut" not in line and len(line) < 400, line
    assert line.startswith("error: unknown objective 'xxx") and "must be loss then" in line
