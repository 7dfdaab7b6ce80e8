"""Numbers too large to mean anything: integers of 400 and
5,000 digits in space files, config JSON, measurement caches, recorded runs and flags (each was a
traceback: Python converts no integer of more than 4,300 digits, and 400 digits overflow a float),
and sizes or budgets that are finite but could never finish (`export --scale-to 1P` searched for
minutes with no output; `train --seconds 1e300` trained until killed)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from tests.helpers import one_line
from tests.specs import TINY_TOML

D400 = "1" + "0" * 400
D5000 = "1" + "0" * 5000
PAST = "is past 2**63 - 1"
SPACE_EDITS = {  # (text replaced, by what, the error's fragment)
    "seq_len-5000": (
        "seq_len = 32",
        f"seq_len = {D5000}",
        "invalid TOML: a number of more than 4,300 digits",
    ),
    "seq_len-400": ("seq_len = 32", f"seq_len = {D400}", f"[model].seq_len: a 401-digit number {PAST}"),
    "d_model-400": (
        "d_model = [64, 128]",
        f"d_model = [64, {D400}]",
        f"[model].d_model: a 401-digit number {PAST}",
    ),
    "budget-400": (
        "[search]",
        f"[budget]\nparams = {{ max = {D400} }}\n[search]",
        "[budget.params].max: a 401",
    ),
    "serve-batch-400": (
        "[search]",
        f"[serve]\nbatch = {D400}\n[search]",
        f"[serve].batch: a 401-digit number {PAST}",
    ),
    "tokens-400": ("tokens = 2048", f"tokens = {D400}", f"[proxy].tokens: a 401-digit number {PAST}"),
    "gqa-5000": (
        "head_dim = [32]",
        f'head_dim = [32]\nattention_layout = ["gqa:{"9" * 5000}"]',
        "layout 'gqa:99",
    ),
}


@pytest.mark.parametrize("edit", SPACE_EDITS.values(), ids=SPACE_EDITS.keys())
def test_a_huge_number_in_a_space_file_is_one_line_exit_2(tmp_path, edit):
    old, new, fragment = edit
    assert old in TINY_TOML
    space = tmp_path / "space.toml"
    space.write_text(TINY_TOML.replace(old, new, 1))
    line = one_line(CliRunner().invoke(app, ["space", "check", str(space)]), 2, fragment)
    assert len(line) < 300, line  # the value named by its length, not echoed


CONFIG = {"vocab_size": 256, "seq_len": 64, "d_model": 128, "n_layers": 2, "n_heads": 4, "d_ff": 256}


@pytest.mark.parametrize("command", [["config", "check"], ["cost"]], ids=["config-check", "cost"])
def test_a_5000_digit_integer_in_a_config_file_is_one_line_exit_2(tmp_path, command):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(CONFIG).replace('"d_model": 128', f'"d_model": {D5000}'))
    one_line(
        CliRunner().invoke(app, [*command, str(path)]), 2, "invalid JSON: a number of more than 4,300 digits"
    )


def test_a_5000_digit_integer_in_a_measurement_cache_is_one_line(tmp_path):
    config, cache = tmp_path / "ok.json", tmp_path / "cache.json"
    config.write_text(json.dumps(CONFIG))
    cache.write_text('{"version": 1, "entries": {"a": {"seconds": ' + D5000 + "}}}")
    result = CliRunner().invoke(app, ["profile", str(config), "--cache", str(cache), "--steps", "0"])
    one_line(
        result,
        (1, 2),
        f"measurement cache {cache}: invalid JSON: a number of more than 4,300 digits; delete it",
    )


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["width", "9" * 400], "d_model must be at most 2**53, got a 400-digit number"),
        (["config", "new", "--d-model", "9" * 400, "--n-layers", "2"], "d_model must be at most 2**53"),
        (["config", "new", "--d-model", "128", "--n-layers", "2", "--multiple-of", "9" * 30], "multiple_of"),
    ],
    ids=["width", "config-new-d-model", "config-new-multiple-of"],
)
def test_a_huge_size_flag_is_named_by_its_length_exit_2(args, fragment):
    one_line(CliRunner().invoke(app, args), 2, fragment)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--tokens", "99999999999999999999999"], "tokens budget a 23-digit number is past 2**63 - 1"),
        (["--seconds", "1e300"], "seconds budget 1e+300 is past a year"),
    ],
    ids=["tokens", "seconds"],
)
def test_a_training_budget_that_never_ends_is_refused_before_training(tmp_path, args, fragment):
    config = tmp_path / "ok.json"
    config.write_text(json.dumps(CONFIG))
    one_line(CliRunner().invoke(app, ["train", str(config), "--device", "cpu", *args]), 2, fragment)
