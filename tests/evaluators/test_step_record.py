"""Recording real steps and their kernels, on the CPU through the GPU's code path: what a recorded
run holds is what `fit-device` reads."""

from __future__ import annotations

import pytest

from archsearch.evaluators import step_record
from archsearch.evaluators.counting import eager_kernel_count
from archsearch.evaluators.device import detect_device
from archsearch.evaluators.profiler import InMemoryCache
from archsearch.evaluators.step_fit import records_from_benchmark
from archsearch.space.knobs import config_from_knobs

TINY = config_from_knobs(
    vocab_size=256, seq_len=32, d_model=64, n_layers=2, head_dim=32, d_ff=128, n_kv_heads=1
)


def test_a_recorded_shape_is_what_the_fit_reads():
    entry = step_record.measure_shape("tiny", TINY, 2, "cpu", InMemoryCache(), 0.005, "bf16", train_steps=2)
    assert entry["label"] == "tiny" and entry["batch"] == 2 and entry["config"] == TINY.to_dict()
    assert entry["train_step_s"] > 0 and entry["measure_s"] >= entry["train_step_s"]
    kinds = {row["kind"] for row in entry["report"]["kernels"]}
    assert kinds == {"gemm", "sdpa.fwd", "sdpa.bwd"} and entry["report"]["dtype"] == "bf16"
    assert entry["attention_kernels"] and all(isinstance(name, str) for name in entry["attention_kernels"])
    raw = {"shapes": [entry]}
    (record,) = records_from_benchmark(raw, {"tiny": eager_kernel_count(TINY)})
    assert record.real_step_s == entry["train_step_s"] and record.dtype == "bf16"
    assert len(record.gemms) == sum(row["kind"] == "gemm" for row in entry["report"]["kernels"])
    assert {name for name, _ in record.attention} == {"sdpa.fwd", "sdpa.bwd"}


def test_the_fit_set_the_header_and_a_bad_step_count():
    (row,) = step_record.time_fit_gemms([(64, 32, 16)], "cpu", 0.005, "fp32")
    assert row[:3] == [64, 32, 16] and row[3] > 0
    with pytest.raises(ValueError, match="steps must be positive, got 0"):
        step_record.time_train_step(TINY, 1, "cpu", "fp32", steps=0)
    header = step_record.run_header(detect_device("cpu"), 0.1)
    assert header["shapes"] == header["fit_gemms"] == [] and header["nvidia_smi"] == ""
    assert header["device"]["fingerprint"] == detect_device("cpu").fingerprint


def test_a_traced_step_names_where_its_time_went():
    trace = step_record.trace_train_step(TINY, 2, "cpu", "fp32", steps=2, warmup=1, top=500)
    assert trace["steps"] == 2 and trace["wall_s"] > 0 and 0 < trace["device_s"]
    assert len(trace["top"]) == trace["names"] > 3  # every name, under a large enough `top`
    seconds = [k["seconds"] for k in trace["top"]]
    assert seconds == sorted(seconds, reverse=True) and sum(seconds) == pytest.approx(trace["device_s"])
    # The step's one fused AdamW step: a top-level operator on the CPU, once a step.
    (optimizer,) = [k for k in trace["top"] if k["name"].startswith("Optimizer.step")]
    assert optimizer["calls"] == 1
    assert len(step_record.trace_train_step(TINY, 2, "cpu", "fp32", steps=1, warmup=0, top=2)["top"]) == 2
    with pytest.raises(ValueError, match="steps must be positive, got 0"):
        step_record.trace_train_step(TINY, 1, "cpu", "fp32", steps=0)
