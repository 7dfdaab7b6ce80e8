"""Probe 8's tracebacks and unbounded waits (issue 26): each now one line, the right exit code."""

from __future__ import annotations

import sqlite3

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.search.validate import ValidateError, long_settings
from tests.faults.test_inputs import _one_line
from tests.results.test_ladder import _laddered, _study


@pytest.mark.parametrize("proxy", [{"tokens": 2048}, {"tokens": None, "flops": None, "seconds": 3.0}])
def test_a_multiplier_whose_budget_overflows_is_refused(proxy):
    """`validate --multiplier 1e308`: `round(inf)`, an OverflowError traceback."""
    with pytest.raises(
        ValidateError, match=r"--multiplier 1e\+308 makes long runs that cannot train: .*309-digit"
    ):
        long_settings(proxy, 1e308, 0, 1000)


def test_a_space_file_nested_past_the_recursion_limit_by_dotted_keys_is_one_line(tmp_path):
    """`a.a.a...b = 1` 1000 deep: tomllib reads it, the huge-integer check recursed into a traceback."""
    space = tmp_path / "deep.toml"
    space.write_text("[model]\n" + "a." * 1000 + "b = 1\n")
    result = CliRunner().invoke(app, ["space", "check", str(space)])
    assert _one_line(result, 2) == f"error: {space}: invalid TOML: nested too deeply to be a search spec"


def test_rungs_naming_a_trial_the_study_lacks_are_left_out_with_a_note(tmp_path):
    """`pareto --at-size` on rungs whose trial number names no trial: a KeyError traceback."""
    url = _laddered(_study(f"sqlite:///{tmp_path / 't.db'}"))
    with sqlite3.connect(tmp_path / "t.db") as conn:
        conn.execute("UPDATE archsearch_ladder_rungs SET trial_number = 999 WHERE trial_number = 1")
    conn.close()
    result = CliRunner().invoke(app, ["pareto", "--study", "tiny", "--at-size", "2M", "--storage", url])
    assert result.exit_code == 0, result.output
    assert "left out: trial 999: its rungs name a trial the study does not have" in result.stderr


def test_a_profile_timing_budget_past_a_minute_per_kernel_is_refused():
    """`profile --min-run-time 1e308` was accepted and timed its first kernel without end."""
    result = CliRunner().invoke(
        app, ["profile", "--preset", "byte-1m", "--device", "cpu", "--steps", "0", "--min-run-time", "1e308"]
    )
    assert _one_line(result, 2).startswith(
        "error: min_run_time must be a positive number of seconds, at most 60 per kernel, got 1e+308"
    )


def test_a_size_no_design_reaches_is_noted_without_another_command_s_flags(tmp_path):
    """`pareto --at-size 1` advised `--top` and `--rungs`, flags of `ladder`, not of `pareto`."""
    url = _laddered(_study(f"sqlite:///{tmp_path / 't.db'}"))
    result = CliRunner().invoke(app, ["pareto", "--study", "tiny", "--at-size", "1", "--storage", url])
    assert result.exit_code == 0, result.output
    assert "left out: trial 0: no shape keeping its design has 1 parameters" in result.stderr
    assert "--top" not in result.stderr and "--rungs" not in result.stderr


def test_a_serving_batch_past_2_31_is_refused():
    """`profile --serve --batch 99999999999999999999` printed cache bytes of 27 digits, exit 0."""
    result = CliRunner().invoke(
        app, ["profile", "--preset", "byte-1m", "--device", "h100-sxm", "--serve", "--batch", "9" * 20]
    )
    assert _one_line(result, 2) == (
        "error: batch must be a positive integer up to 2**31 - 1, got a 20-digit number"
    )
