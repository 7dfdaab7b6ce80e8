from __future__ import annotations

import dataclasses
import itertools
import json
import statistics

import pytest

from archsearch.errors import ConfigError, UnknownNameError
from archsearch.evaluators.hardware import (
    ACCELERATORS,
    DeviceModel,
    GemmMeasurement,
    calibrate,
    device_model,
    local_cpu,
    modelled_profile,
    plan_gemm,
    predict_attention,
    predict_gemm,
    predict_memory_op,
    predict_step,
    prediction_errors,
)
from archsearch.evaluators.step_kernels import AttentionCall, MemoryOp, ProfileReport, step_kernels
from archsearch.space import preset

A100 = device_model("a100-80gb")


def single_tile(model: DeviceModel, tile: tuple[int, int] = (128, 128)) -> DeviceModel:
    """The same device restricted to one tile shape, so tile and wave counts are unambiguous."""
    return dataclasses.replace(model, device=dataclasses.replace(model.device, tiles=(tile,)))


# --- catalogue ---
@pytest.mark.parametrize("name", ["a100-80gb", "h100-sxm", "h200", "l4", "rtx4090"])
def test_required_accelerators_have_sources(name):
    device = ACCELERATORS[name]
    assert "NVIDIA" in device.source and ("datasheet" in device.source or "whitepaper" in device.source)
    assert {"fp32", "tf32", "bf16", "fp16"} <= set(device.dtypes)
    assert device.alignment_elements("bf16") == 8
    assert device.alignment_elements("fp32") == 4


@pytest.mark.parametrize(
    ("name", "sms", "bf16_tflops", "fp32_tflops", "bandwidth"),
    [
        ("a100-80gb", 108, 312.0, 19.5, 2.039e12),
        ("h100-sxm", 132, 989.4, 66.9, 3.35e12),
        ("h200", 132, 989.5, 67.0, 4.8e12),
        ("l4", 58, 121.0, 30.3, 300e9),
        ("rtx4090", 128, 165.2, 82.6, 1008e9),
    ],
)
def test_published_numbers(name, sms, bf16_tflops, fp32_tflops, bandwidth):
    device = ACCELERATORS[name]
    assert device.units == sms
    assert device.peak_flops("bf16") == pytest.approx(bf16_tflops * 1e12)
    assert device.peak_flops("fp32") == pytest.approx(fp32_tflops * 1e12)
    assert device.memory_bandwidth == pytest.approx(bandwidth)


def test_fp8_only_where_the_part_has_it():
    assert ACCELERATORS["h100-sxm"].peak_flops("fp8") == pytest.approx(1978.9e12)
    assert ACCELERATORS["h100-sxm"].alignment_elements("fp8") == 16
    with pytest.raises(
        UnknownNameError, match=r"A100 80GB SXM has no fp8 peak; valid: fp32, tf32, bf16, fp16"
    ):
        predict_gemm(A100, 4096, 4096, 4096, "fp8")


def test_unknown_device_lists_valid_names():
    with pytest.raises(
        UnknownNameError, match=r"unknown accelerator 'b200'; valid: a100-80gb, h100-sxm, h200, l4, rtx4090"
    ):
        device_model("b200")


def test_unknown_dtype():
    with pytest.raises(UnknownNameError, match=r"unknown compute dtype 'int4'; valid: fp32, tf32"):
        predict_gemm(A100, 64, 64, 64, "int4")


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((0, 128, 128), "m must be a positive integer, got 0"),
        ((128, -3, 128), "n must be a positive integer, got -3"),
        ((128, 128, 0), "k must be a positive integer, got 0"),
        ((128, 128, 12.5), "k must be a positive integer, got 12.5"),
    ],
)
def test_non_positive_sizes_are_rejected(shape, message):
    with pytest.raises(ConfigError, match=message):
        predict_gemm(A100, *shape)
    with pytest.raises(ConfigError, match=message):
        GemmMeasurement(*shape, "bf16", 1e-3)


def test_bad_measurements_and_assumptions_are_rejected():
    with pytest.raises(ConfigError, match=r"seconds must be a positive number, got 0"):
        GemmMeasurement(64, 64, 64, "bf16", 0)
    with pytest.raises(ConfigError, match=r"misaligned_factor must be in \(0, 1\], got 1.5"):
        device_model("l4", misaligned_factor=1.5)
    with pytest.raises(ConfigError, match=r"calibration needs at least 3 measurements, got 2"):
        calibrate(A100, [GemmMeasurement(64, 64, 64, "bf16", 1e-5)] * 2)


# --- GEMMs ---
@pytest.mark.parametrize("name", ACCELERATORS.names())
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_predictions_are_monotone_in_size(name, axis):
    # Multiples of 64 keep the alignment class fixed, so only size changes.
    model = device_model(name)
    times = []
    for size in range(64, 8192 + 1, 64):
        shape = [2048, 2048, 2048]
        shape[axis] = size
        times.append(predict_gemm(model, *shape))
    assert all(b >= a for a, b in itertools.pairwise(times))
    # 4096 -> 8192: compute-bound, twice the work (past the fixed launch a fitted model adds)
    launch = model.launch_s
    assert 1.8 < (times[-1] - launch) / (times[63] - launch) < 2.2


def test_large_aligned_gemm_runs_near_the_efficiency_times_peak():
    plan = plan_gemm(A100, 8192, 8192, 8192)
    assert plan.bound == "compute"
    assert plan.tile == (256, 128) and plan.wave_efficiency == pytest.approx(2048 / (19 * 108))
    assert 0.75 * 0.8 * 312 < plan.tflops <= 0.8 * 312


def test_small_gemms_are_memory_or_launch_bound():
    gemv = plan_gemm(A100, 1, 8192, 8192)
    assert gemv.bound == "memory"
    assert gemv.memory_s == pytest.approx((8192 * 8192 + 2 * 8192) * 2 / (2.039e12 * 0.85))
    tiny = plan_gemm(A100, 8, 8, 8)
    assert tiny.launch_s > 10 * max(tiny.compute_s, tiny.memory_s)


def test_one_past_a_tile_edge_costs_a_whole_extra_tile():
    # 128x128 tiles, alignment penalties off to isolate tile quantization; 108 tile rows so
    # every wave is full. n = 1025 needs a 9th tile column for one extra column of output.
    model = dataclasses.replace(single_tile(A100), misaligned_factor=1.0, coarse_aligned_factor=1.0)
    at_edge = plan_gemm(model, 128 * 108, 1024, 8192)
    past = plan_gemm(model, 128 * 108, 1025, 8192)
    assert at_edge.bound == past.bound == "compute"
    assert (at_edge.tiles, past.tiles) == (108 * 8, 108 * 9)
    assert past.time_s / at_edge.time_s == pytest.approx(9 / 8, rel=1e-3)  # work grew by 1/1024
    assert past.tile_efficiency == pytest.approx(1025 / (9 * 128))
    # 129 vs 128 doubles the tiles; compute-bound in fp32 (CUDA cores), so it doubles the time.
    narrow = plan_gemm(model, 128 * 108, 128, 8192, "fp32")
    wide = plan_gemm(model, 128 * 108, 129, 8192, "fp32")
    assert (narrow.bound, narrow.tiles, wide.tiles) == ("compute", 108, 216)
    assert wide.time_s / narrow.time_s == pytest.approx(2, rel=0.01)


def test_wave_quantization_one_tile_more_than_sms():
    model = single_tile(A100)
    full = plan_gemm(model, 128 * 108, 128, 8192, "fp32")  # 108 tiles on 108 SMs: one wave
    spill = plan_gemm(model, 128 * 109, 128, 8192, "fp32")  # 109 tiles: a second wave of one
    assert (full.tiles, full.waves, full.wave_efficiency) == (108, 1, 1.0)
    assert (spill.tiles, spill.waves) == (109, 2)
    assert spill.wave_efficiency == pytest.approx(109 / 216)
    assert spill.time_s / full.time_s > 1.9  # for 0.9% more work
    # With the whole tile catalogue the library dodges part of the cost, not all of it.
    assert (
        plan_gemm(A100, 128 * 109, 128, 8192, "fp32").tflops
        < 0.95 * plan_gemm(A100, 128 * 108, 128, 8192, "fp32").tflops
    )


def test_alignment_is_separate_from_tiles():
    aligned = plan_gemm(A100, 4096, 4096, 4096)
    coarse = plan_gemm(A100, 4096, 4096, 4040)  # a multiple of 8, not of 64
    odd = plan_gemm(A100, 4096, 4096, 4095)  # not a multiple of 8: fallback kernels
    assert (aligned.tile, aligned.tiles, aligned.waves) == (odd.tile, odd.tiles, odd.waves)
    assert odd.time_s > 1.4 * aligned.time_s
    assert aligned.time_s < coarse.time_s < odd.time_s  # the smaller penalty, despite less work
    assert (aligned.alignment_factor, coarse.alignment_factor, odd.alignment_factor) == (1.0, 0.9, 0.5)


# --- attention, memory ops and whole steps ---
def test_attention_prefers_head_dim_64_or_128():
    def time_per_flop(head_dim: int) -> float:
        call = AttentionCall("sdpa.fwd", 8, 32, 32, 4096, head_dim, 1)
        return predict_attention(A100, call) / call.causal_flops

    assert time_per_flop(128) == pytest.approx(time_per_flop(64), rel=1e-3)
    assert time_per_flop(120) / time_per_flop(128) == pytest.approx(1 / 0.85, rel=1e-3)


def test_memory_op_is_bytes_over_bandwidth():
    op = MemoryOp("norms", 10**9)
    assert predict_memory_op(A100, op) == pytest.approx(1e9 / (2.039e12 * 0.85) + 4e-6)


def test_step_prediction_totals_and_devices():
    kernels = step_kernels(preset("llama2-7b"), batch=1)
    h100 = predict_step(device_model("h100-sxm", fitted=False), kernels)  # the bare rooflines
    h200 = predict_step(device_model("h200", fitted=False), kernels)
    assert h100.modelled and h100.device["name"] == "NVIDIA H100 SXM5 80GB"
    assert [k.name for k in h100.kernels] == [x.name for x in (*kernels.gemms, *kernels.attention)]
    assert [k.name for k in h100.memory_ops] == [x.name for x in kernels.memory_ops]
    total = sum(k.total_s for k in h100.kernels) + sum(m.time_s for m in h100.memory_ops)
    assert h100.step_time_s == pytest.approx(total)
    assert h100.tokens_per_second == pytest.approx(4096 / h100.step_time_s)
    gemm = next(k for k in h100.kernels if k.name == "mlp_up.fwd")
    assert gemm.time_s == predict_gemm(device_model("h100-sxm", fitted=False), *kernels.gemms[6].shape)
    assert gemm.tflops == pytest.approx(kernels.gemms[6].flops / kernels.gemms[6].count / gemm.time_s / 1e12)
    # Same compute, more bandwidth: at 4096 tokens every GEMM and attention call is
    # compute-bound, so only the memory-bound kernels get faster.
    for a, b in zip(h100.kernels, h200.kernels, strict=True):
        assert b.time_s == pytest.approx(a.time_s, rel=1e-3)
    for a, b in zip(h100.memory_ops, h200.memory_ops, strict=True):
        assert b.time_s < 0.75 * a.time_s  # 3.35 -> 4.8 TB/s
    assert h200.step_time_s < h100.step_time_s
    assert h100.to_dict()["kernels"][0]["tflops"] == h100.kernels[0].tflops


def test_a_stored_profile_report_reads_back_as_it_was():
    # As a trial's profile stores it (JSON), with a measured step (a residual) and without.
    modelled = modelled_profile(preset("gpt2-small"), "h100-sxm", 4, "bf16", launches=200)
    for report in (modelled, modelled.with_measured_step(0.5, 9)):
        back = ProfileReport.from_dict(json.loads(json.dumps(report.to_dict())))
        assert back == report and back.breakdown() == report.breakdown()
    with pytest.raises(KeyError, match="kernels"):
        ProfileReport.from_dict({k: v for k, v in modelled.to_dict().items() if k != "kernels"})


def test_fp32_step_runs_faster_with_tf32():
    kernels = step_kernels(preset("gpt2-small"), batch=4, dtype="fp32")
    assert predict_step(A100, kernels, "tf32").step_time_s < 0.5 * predict_step(A100, kernels).step_time_s


# --- calibration ---
SHAPES = [
    (64, 64, 64), (256, 256, 256), (1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192),
    (1, 4096, 4096), (8, 8192, 8192), (16384, 64, 4096), (4096, 11008, 4096), (2048, 32000, 1024),
    (4096, 4096, 64), (3000, 5000, 704),
]  # fmt: skip


def test_calibration_recovers_catalogued_efficiencies():
    truth = device_model(
        "a100-80gb", compute_efficiency=0.62, bandwidth_efficiency=0.71, launch_overhead_s=7e-6
    )
    data = [GemmMeasurement(m, n, k, "bf16", predict_gemm(truth, m, n, k)) for m, n, k in SHAPES]
    fit = calibrate(A100, data)
    assert fit.fitted == "efficiency"
    assert fit.model.device == A100.device  # datasheet peaks kept
    assert fit.model.compute_efficiency == pytest.approx(0.62, rel=0.02)
    assert fit.model.bandwidth_efficiency == pytest.approx(0.71, rel=0.02)
    assert fit.model.launch_s == pytest.approx(7e-6, rel=0.05)
    assert fit.n_measurements == len(SHAPES) and fit.worst_error < 0.01


def test_calibration_of_the_local_cpu_predicts_unmeasured_shapes():
    base = local_cpu(cores=2)
    assert base.device.units == 2 and base.device.alignment_elements("fp32") == 16
    with pytest.raises(UnknownNameError, match=r"has no bf16 peak; valid: fp32"):
        predict_gemm(base, 64, 64, 64, "bf16")
    truth_device = dataclasses.replace(
        base.device, peak_tflops=(("fp32", 0.09),), memory_bandwidth=12e9, launch_overhead_s=3e-6
    )
    truth = dataclasses.replace(base, device=truth_device)

    def measure(shapes):
        return [GemmMeasurement(m, n, k, "fp32", predict_gemm(truth, m, n, k, "fp32")) for m, n, k in shapes]

    fit = calibrate(base, measure(SHAPES[:8]))
    assert fit.fitted == "peaks"
    assert fit.model.device.peak_flops("fp32") == pytest.approx(0.09e12, rel=0.02)
    assert fit.model.device.memory_bandwidth == pytest.approx(12e9, rel=0.02)
    assert fit.model.launch_s == pytest.approx(3e-6, rel=0.05)
    held_out = measure([(100, 300, 500), (2048, 512, 4096), (1, 1000, 3000), (777, 777, 777)])
    errors = prediction_errors(fit.model, held_out)
    assert len(errors) == 4 and statistics.median(errors) < 0.02 and max(errors) < 0.05
    # The uncalibrated placeholders are far off, so the fit did the work.
    assert max(prediction_errors(base, held_out)) > 0.3
