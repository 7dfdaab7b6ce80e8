"""`archsearch profile --serve`: modelled on a catalogued GPU, measured here with the prediction."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.space import ArchConfig, save_config
from tests.helpers import one_line

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def test_llama2_7b_decode_on_an_h100_is_modelled_with_its_breakdown_and_floor():
    result = run(
        "profile", "--preset", "llama2-7b", "--device", "h100-sxm", "--serve", "--context", "4096", "--json"
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["modelled"] is True and out["dtype"] == "bf16" and out["batch"] == 1
    decode = out["decode"]
    assert out["decode_time_s"] == decode["time_s"] and out["prefill_time_s"] == out["prefill"]["time_s"]
    assert 1.0 <= decode["time_s"] / decode["floor_s"] <= 1.6
    for part in ("weights_read_s", "cache_read_s", "compute_s", "launch_s", "floor_s"):
        assert decode[part] > 0
    assert out["costs"]["kv_bytes_per_token"] == 512 * 2**10
    assert out["costs"]["memory_limit"] == 80 * 10**9
    # (80 GB - 13.48 GB of weights) / (4097 tokens x 512 KiB) = 30.96 sequences.
    assert out["costs"]["max_batch"] == out["decode_at_max_batch"]["batch"] == 30
    assert out["decode_at_max_batch"]["tokens_per_second"] > 5 * out["decode_tokens_per_s"]


def test_a_memory_limit_sets_the_largest_batch_and_decode_there():
    args = ("profile", "--preset", "llama2-7b", "--device", "h100-sxm", "--serve", "--context", "4096")
    out = json.loads(run(*args, "--memory", "20GB", "--json").stdout)
    # (20 GB - 13.48 GB of weights) / (4097 tokens x 512 KiB) = 3.03 sequences.
    assert out["costs"]["memory_limit"] == 20 * 10**9
    assert out["costs"]["max_batch"] == out["decode_at_max_batch"]["batch"] == 3
    out = json.loads(run(*args, "--memory", "10GB", "--json").stdout)  # not even the weights fit
    assert out["costs"]["max_batch"] == 0 and "decode_at_max_batch" not in out


def test_the_modelled_table_names_the_parts():
    result = run("profile", "--preset", "llama3-8b", "--device", "a100-80gb", "--serve", "--batch", "4")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "serving modelled on NVIDIA A100 80GB SXM, bf16, batch 4, context 512" in text
    assert "largest batch in 80GB:" in text
    for word in ("prefill", "decode", "weights read", "cache read", "launches", "floor"):
        assert word in text, text


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny.json"
    cfg = ArchConfig(
        vocab_size=256, seq_len=32, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64
    )
    save_config(cfg, path)
    return path


@pytest.fixture
def brief_local_calibration():
    """The local serving model calibrated briefly (`serve_profiler.brief_calibration`): this checks
    what `profile --serve` reports, not how well the model predicts (benchmarks/serve_accuracy.py),
    and the full calibration was most of its CPU."""
    from archsearch.evaluators.serve_profiler import brief_calibration

    with brief_calibration():
        yield


@pytest.mark.long
def test_cpu_measures_prefill_and_decode_with_the_local_prediction_beside(
    tiny_config, brief_local_calibration
):
    args = (
        "profile",
        str(tiny_config),
        "--serve",
        "--batch",
        "2",
        "--context",
        "48",
        "--min-run-time",
        "0.01",
    )
    result = run(*args, "--dtype", "fp32", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["modelled"] is False and out["dtype"] == "fp32"
    measured, predicted = out["measured"], out["predicted"]
    assert out["prefill_time_s"] == measured["prefill_time_s"] > 0
    assert out["decode_time_s"] == measured["decode_time_s"] > 0
    assert measured["context"] == 48 > 32  # past the shape's seq_len: the rope angles extend
    assert measured["decode_ops"] > 0 and measured["prefill_ops"] >= measured["decode_ops"]
    assert measured["decode_graph_time_s"] is None and measured["graph_error"] is None  # CUDA only
    assert predicted["decode"]["kernels"] == measured["decode_ops"]
    assert predicted["prefill_time_s"] > 0 and predicted["decode_time_s"] > 0
    assert predicted["local_model"]["op_s"] > 0
    assert out["costs"]["kv_bytes_per_token"] == 2 * 2 * 16 * 4  # layers x K and V x kv_dim x fp32
    assert out["costs"]["max_batch"] is None
    # What 1 MB holds beside the weights: caches of 48 + 1 tokens (the step decoded) of 256 B each.
    limited = json.loads(run(*args, "--dtype", "fp32", "--memory", "1MB", "--json").stdout)["costs"]
    assert limited["max_batch"] == (10**6 - limited["weight_bytes"]) // (49 * 256) == 68
    table = run(*args, "--dtype", "fp32").stdout
    assert "serving measured on" in table and "predicted" in table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--dtype", "int4"), "error: --dtype 'int4' is unknown; valid: auto, fp32, bf16, fp16, fp8\n"),
        (("--device", "tpu"), "error: unknown device 'tpu'; measured: cpu, cuda, cuda:N; modelled: "),
        (("--context", "0"), "error: Invalid value for '--context'"),
        (("--memory", "lots"), "error: --memory "),
    ],
)
def test_bad_serving_options_are_one_line(args, message):
    result = run("profile", "--preset", "byte-1m", "--serve", "--device", "h100-sxm", *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr


def test_memory_without_serve_is_one_line():
    result = run("profile", "--preset", "byte-1m", "--device", "h100-sxm", "--memory", "40GB")
    assert result.exit_code == 2 and result.stderr == "error: --memory only goes with --serve\n"


def test_a_serving_batch_past_2_31_is_refused():
    """`profile --serve --batch 99999999999999999999` printed cache bytes of 27 digits, exit 0."""
    result = CliRunner().invoke(
        app, ["profile", "--preset", "byte-1m", "--device", "h100-sxm", "--serve", "--batch", "9" * 20]
    )
    assert one_line(result, 2) == (
        "error: batch must be a positive integer up to 2**31 - 1, got a 20-digit number"
    )
