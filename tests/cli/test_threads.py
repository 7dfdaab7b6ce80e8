"""`train` and `profile` run a CPU step on threads chosen by one rule (`trainer.step_threads`),
take `--threads`, and say how many they used. The rule's inputs are set here (the cores this
process may use, the load average, the work each thread needs), never read from the host."""

from __future__ import annotations

import json
import os

import pytest
import torch
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.evaluators import settings
from archsearch.evaluators.trainer import step_threads
from archsearch.space import ArchConfig

runner = CliRunner()
CFG = ArchConfig(
    vocab_size=256, seq_len=32, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64
)
BATCH = 2
TRAIN = ["--tokens", "2048", "--batch-size", str(BATCH), "--precision", "fp32", "--device", "cpu"]
PROFILE = ["--batch", str(BATCH), "--dtype", "fp32", "--device", "cpu", "--min-run-time", "0.002"]
PROFILE += ["--steps", "1"]  # one real step timed: the breakdown's residual line, quickly
CHOSEN = "(chosen from the shape and the free cores)"


@pytest.fixture
def tiny_config(tmp_path) -> str:
    path = tmp_path / "tiny.json"
    path.write_text(CFG.to_json())
    return str(path)


@pytest.fixture
def machine(monkeypatch):
    """Sets the rule's inputs: `cores` usable by this process and the 1-minute `load`. Each thread
    needs half the tiny shape's largest GEMM, so the shape wants 2 threads where 2 cores are free."""

    def set_machine(cores: int, load: float) -> None:
        monkeypatch.setattr(settings, "usable_cores", lambda: cores)
        monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))

    tokens = BATCH * CFG.seq_len
    monkeypatch.setattr(settings, "GEMM_MACS_PER_THREAD", settings.largest_gemm(CFG, tokens) // 2)
    return set_machine


def _json(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    ("cores", "load", "threads"),
    [(4, 0.0, 2), (4, 3.5, 1), (1, 0.0, 1)],
    ids=["the-shape-caps-it", "busy-cores-cap-it", "one-core"],
)
def test_train_and_profile_choose_the_same_threads(machine, tiny_config, cores, load, threads):
    machine(cores, load)
    before = torch.get_num_threads()
    assert step_threads(CFG, "cpu", BATCH * CFG.seq_len) == threads  # the rule itself
    trained = _json("train", tiny_config, *TRAIN)
    profiled = _json("profile", tiny_config, *PROFILE)
    assert trained["threads"] == profiled["threads"] == profiled["device"]["threads"] == threads
    assert trained["settings"]["threads"] is None  # asked for none: chosen
    assert torch.get_num_threads() == before  # each command puts the process's count back


def test_both_take_threads_and_say_how_many_they_used(machine, tiny_config):
    machine(1, 0.9)  # the rule would choose 1
    assert _json("train", tiny_config, *TRAIN, "--threads", "3")["threads"] == 3
    assert _json("profile", tiny_config, *PROFILE, "--threads", "3")["threads"] == 3
    table = runner.invoke(app, ["train", tiny_config, *TRAIN, "--threads", "3"])
    assert "3 threads (--threads)" in table.stdout, table.output
    header = runner.invoke(app, ["profile", tiny_config, *PROFILE]).stdout.splitlines()[1]
    assert header == f"measured on {_cpu_name()}, fp32, batch 2 x 32, 1 thread {CHOSEN}", header
    machine(4, 0.0)
    table = runner.invoke(app, ["train", tiny_config, *TRAIN]).stdout
    assert f"2 threads {CHOSEN}" in table


def _cpu_name() -> str:
    from archsearch.evaluators.device import detect_device

    return detect_device("cpu").name


@pytest.mark.parametrize("command", [["train", *TRAIN], ["profile", *PROFILE]], ids=["train", "profile"])
def test_a_thread_count_below_one_is_one_error_line(tiny_config, command):
    result = runner.invoke(app, [command[0], tiny_config, *command[1:], "--threads", "0"])
    assert result.exit_code == 2, result.output
    assert result.stderr == "error: threads must be a positive integer (or unset: chosen), got 0\n"


def test_a_modelled_profile_runs_no_threads_and_refuses_threads():
    report = _json("profile", "--preset", "byte-1m", "--device", "h100-sxm")
    assert report["modelled"] is True and report["threads"] is None
    result = runner.invoke(app, ["profile", "--preset", "byte-1m", "--device", "h100-sxm", "--threads", "2"])
    assert result.exit_code == 2
    assert result.stderr == "error: --threads is for a step measured here; h100-sxm is modelled\n"
