"""Probe 8's tracebacks and unbounded waits (issue 26): each now one line, the right exit code."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

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
    result = _pareto_at_size_after(
        tmp_path, "UPDATE archsearch_ladder_rungs SET trial_number = 999 WHERE trial_number = 1"
    )
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
    # No design left to rank is an error since probe 10 (it printed an empty table, exit 0).
    assert _one_line(result, 2).startswith(
        "error: no laddered design of 'tiny' can be ranked at 1 parameters"
    )
    assert "trial 0: no shape keeping its design has 1 parameters" in result.stderr
    assert "--top" not in result.stderr and "--rungs" not in result.stderr


def test_a_serving_batch_past_2_31_is_refused():
    """`profile --serve --batch 99999999999999999999` printed cache bytes of 27 digits, exit 0."""
    result = CliRunner().invoke(
        app, ["profile", "--preset", "byte-1m", "--device", "h100-sxm", "--serve", "--batch", "9" * 20]
    )
    assert _one_line(result, 2) == (
        "error: batch must be a positive integer up to 2**31 - 1, got a 20-digit number"
    )


def test_a_huge_seed_in_a_space_file_is_quoted_by_its_digits(tmp_path):
    """`[search] seed = 1e300` (a float the reader makes whole) printed all 301 digits."""
    space = tmp_path / "s.toml"
    text = (Path(__file__).parents[2] / "examples" / "tiny-hf.toml").read_text()
    space.write_text(text.replace("seed = 0", "seed = 1e300", 1))
    result = CliRunner().invoke(app, ["space", "check", str(space)])
    assert _one_line(result, 2) == (
        f"error: {space}: [search].seed: must be in 0..4294967295 (Optuna's seed range), "
        "got a 301-digit number"
    )


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
    assert _one_line(result, 2).endswith(f"must name a file or folder, got {argv[-1]!r} (see --help)")
    assert list(tmp_path.iterdir()) == []  # nothing read into a cache, nothing written


def test_a_stored_rung_loss_no_run_ends_with_is_a_damaged_database(tmp_path):
    """A rung whose val_loss is -1e308 reached the fit's logarithm: exit 2, as if the input erred."""
    result = _pareto_at_size_after(
        tmp_path, "UPDATE archsearch_ladder_rungs SET val_loss = -1e308 WHERE id = 1"
    )
    line = _one_line(result, 1)
    assert "damaged" in line and "the val_loss of ladder rung 1 of 'tiny' is -1e+308" in line, line


@pytest.mark.parametrize("command", [["align"], ["profile", "--device", "h100-sxm"]])
def test_a_modelled_batch_past_2_31_sequences_is_refused(command):
    """`align --batch 1e20` modelled a step of 360 peta-seconds."""
    result = CliRunner().invoke(app, [*command, "--preset", "byte-1m", "--batch", str(10**20)])
    assert (
        _one_line(result, 2)
        == "error: batch must be a positive integer up to 2**31 - 1, got a 21-digit number"
    )


def test_a_batch_past_memory_says_how_much_in_a_short_number():
    """`train --batch-size 1e20` said `needs ~4125976562500000256.0 GiB`."""
    from archsearch.evaluators.device import DeviceInfo
    from archsearch.evaluators.trainer import too_large
    from archsearch.space import preset

    cfg = preset("byte-1m")
    info = DeviceInfo("cpu", None, "a CPU", 2, 2, "AVX2", "AVX2", "2.13.0", None, memory_bytes=2**30)
    assert re.search(r"needs ~[0-9.]+e\+[0-9]+ GiB, has 1\.0 GiB$", too_large(cfg, 10**20, cfg.seq_len, info))


def _pareto_at_size_after(tmp_path, sql):
    """`pareto --at-size 2M` on a laddered study whose database `sql` edited behind its back."""
    url = _laddered(_study(f"sqlite:///{tmp_path / 't.db'}"))
    with sqlite3.connect(tmp_path / "t.db") as conn:
        conn.execute(sql)
    conn.close()
    return CliRunner().invoke(app, ["pareto", "--study", "tiny", "--at-size", "2M", "--storage", url])
