"""Step time means a real training step.

The trainer times its own optimizer steps; a local profile is that step's breakdown, with a
residual line so its parts add up; profiles and MFU use the precision training used; MFU never
exceeds 1. Nothing here asserts a speed: times on these shared CPUs are noise.
"""

from __future__ import annotations

import logging
import math

import pytest

from archsearch.errors import ConfigError
from archsearch.evaluators import profiler, trainer
from archsearch.evaluators.counting import eager_host_ops, eager_kernel_count, eager_memory_ops
from archsearch.evaluators.data import load_dataset
from archsearch.evaluators.device import DeviceError, detect_device
from archsearch.evaluators.hardware import device_model, predict_step
from archsearch.evaluators.profiler import (
    PEAK_KIND,
    InMemoryCache,
    model_flops_utilisation,
    peak_matmul_flops,
    profile_step,
    resolve_precision,
)
from archsearch.evaluators.step_kernels import step_kernels
from archsearch.evaluators.step_time import step_profile
from archsearch.evaluators.trainer import STEP_WARMUP, TrainSettings, measure_step, train
from archsearch.space import ArchConfig
from archsearch.storage.measurement_cache import KernelCache

TINY = ArchConfig(
    vocab_size=256, seq_len=32, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64
)
FAST = dict(batch_size=4, evals=2, eval_batches=1, device="cpu")


@pytest.fixture(scope="module")
def corpus():
    return load_dataset(None, max_corpus_bytes=300_000)


@pytest.fixture
def no_native_bf16(monkeypatch):
    """A CPU without native bf16, whatever the host: the case the issue measured (AVX2 only)."""
    monkeypatch.setenv(profiler.CPU_BF16_ENV, "none")


# --- one step time, measured or modelled (`step_time.step_profile`) ------------------------------


def test_a_catalogued_gpu_is_modelled_and_a_local_device_measured_by_the_same_call():
    modelled = step_profile(TINY, "h100-sxm", 4, "auto")
    assert modelled.modelled and modelled.dtype == "bf16" and modelled.residual_s is None
    launches = eager_kernel_count(TINY)
    inventory = step_kernels(TINY, 4, "bf16", eager_memory_ops(TINY, 4, "bf16"))  # the eager step's bytes
    host_ops = eager_host_ops(TINY)  # the launches and the autograd graph's nodes
    assert modelled == predict_step(device_model("h100-sxm"), inventory, "bf16", launches, host_ops)
    assert modelled.launches == launches > 0 and modelled.overhead_s > 0  # H100 has fitted constants
    kernels_only = step_profile(TINY, "cpu", 4, "fp32", steps=0, min_run_time=0.002)
    assert not kernels_only.modelled and kernels_only.measured_step_s is None
    trained = step_profile(TINY, "cpu", 4, "fp32", trained=(0.25, 7), min_run_time=0.002)
    assert (trained.measured_step_s, trained.measured_steps, trained.step_time_s) == (0.25, 7, 0.25)
    timed = step_profile(TINY, "cpu", 4, "fp32", steps=2, min_run_time=0.002)
    assert timed.measured_steps >= 2 and timed.step_time_s == timed.measured_step_s > 0


@pytest.mark.parametrize(("device", "error"), [("tpu-v5", ConfigError), ("cuda:99", DeviceError)])
def test_a_device_neither_here_nor_catalogued_is_refused(device, error):
    with pytest.raises(error):
        step_profile(TINY, device, 4, "auto", steps=0)


# --- the residual line ----------------------------------------------------------------------------


@pytest.mark.parametrize("measured", [1.0, 3.7e-3, 1e-9], ids=["long", "short", "below-the-kernel-sum"])
def test_the_residual_line_makes_the_report_add_up_to_the_measured_step(measured):
    kernels = predict_step(device_model("h100-sxm"), step_kernels(TINY, 4))
    assert kernels.residual_s is None and kernels.step_time_s == kernels.kernel_sum_s  # nothing measured
    report = kernels.with_measured_step(measured, 12)
    assert report.step_time_s == measured
    lines = report.kernel_time_s + report.memory_time_s + report.residual_s
    assert lines == pytest.approx(measured, rel=1e-12)
    assert report.tokens_per_second == pytest.approx(report.tokens / measured)
    data = report.to_dict()
    assert (data["measured_step_s"], data["measured_steps"], data["step_time_s"]) == (measured, 12, measured)
    assert data["kernel_sum_s"] + data["residual_s"] == pytest.approx(data["step_time_s"], rel=1e-12)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_a_measured_step_must_be_a_positive_time(bad):
    with pytest.raises(ValueError, match="positive number of seconds"):
        predict_step(device_model("h100-sxm"), step_kernels(TINY, 4)).with_measured_step(bad, 1)


# --- the trainer's own step ------------------------------------------------------------------------


def test_the_trainer_reports_the_median_of_its_steady_state_steps(corpus):
    result = train(TINY, corpus, TrainSettings(tokens=40 * 128, precision="fp32", **FAST))
    assert result.status == "complete" and result.steps == 40
    assert result.step_time_steps == result.steps - STEP_WARMUP
    assert 0 < result.step_time_s < result.wall_time_s
    # Half the steady steps last at least the median, and all of them fit in the wall time.
    assert result.step_time_s <= 2 * result.wall_time_s / result.step_time_steps
    assert result.to_dict()["step_time_s"] == result.step_time_s


def test_a_short_run_still_reports_a_step(corpus):
    result = train(TINY, corpus, TrainSettings(tokens=2 * 128, precision="fp32", **FAST))
    assert result.steps == 2 and result.step_time_steps == 1 and result.step_time_s > 0


def test_measure_step_times_the_training_step_on_random_tokens():
    seconds, steps = measure_step(TINY, 2, "cpu", "fp32", steps=4)
    assert seconds > 0 and steps == 4


# --- precision: what training runs is what is profiled ----------------------------------------------


def test_without_native_bf16_auto_is_fp32_everywhere(no_native_bf16, corpus):
    cpu = detect_device("cpu")
    assert resolve_precision(cpu, "auto") == "fp32"
    assert trainer.choose_precision(cpu, "auto") == "fp32"
    result = train(TINY, corpus, TrainSettings(tokens=4 * 128, **FAST))  # precision "auto"
    report = profile_step(TINY, 4, min_run_time=0.002)  # dtype "auto"
    assert result.precision == report.dtype == "fp32"
    assert {row.dtype for row in report.kernels} == {"fp32"}


def test_an_explicit_bf16_is_honoured_even_when_emulated(no_native_bf16):
    assert resolve_precision(detect_device("cpu"), "bf16") == "bf16"
    report = profile_step(TINY, 2, dtype="bf16", min_run_time=0.002)
    assert report.dtype == "bf16"


@pytest.mark.parametrize(("bf16_faster", "expected"), [(True, "bf16"), (False, "fp32")], ids=["fast", "slow"])
def test_with_native_bf16_auto_keeps_the_faster_precision(monkeypatch, bf16_faster, expected):
    monkeypatch.delenv(profiler.CPU_BF16_ENV, raising=False)  # the hardware's answer, then measured
    monkeypatch.setattr(profiler, "native_bf16", lambda device: True)
    rates = {"bf16": 2.0 if bf16_faster else 0.5, "fp32": 1.0}
    monkeypatch.setattr(profiler, "peak_matmul_flops", lambda device, p, cache=None, **kw: rates[p])
    assert resolve_precision(detect_device("cpu"), "auto") == expected


@pytest.mark.parametrize(("value", "native", "auto"), [("none", False, "fp32"), ("native", True, "bf16")])
def test_the_switch_decides_the_cpus_bf16_whatever_the_host(monkeypatch, value, native, auto):
    def unmeasured(*args, **kwargs):
        raise AssertionError("the switch decides: nothing is measured")

    monkeypatch.setattr(profiler, "peak_matmul_flops", unmeasured)
    monkeypatch.setenv(profiler.CPU_BF16_ENV, f" {value.upper()} ")  # case and spaces forgiven
    cpu = detect_device("cpu")
    assert profiler.native_bf16(cpu) is native
    assert resolve_precision(cpu, "auto") == trainer.choose_precision(cpu, "auto") == auto
    assert resolve_precision(cpu, "fp32") == "fp32"  # an explicit request is still honoured


def test_unset_or_detect_asks_the_hardware(monkeypatch):
    import torch

    hardware = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    for value in (None, "detect", ""):
        if value is None:
            monkeypatch.delenv(profiler.CPU_BF16_ENV, raising=False)
        else:
            monkeypatch.setenv(profiler.CPU_BF16_ENV, value)
        assert profiler.cpu_bf16_override() is None
        assert profiler.native_bf16(detect_device("cpu")) is hardware


def test_a_bad_switch_value_is_one_line_naming_the_choices(monkeypatch):
    monkeypatch.setenv(profiler.CPU_BF16_ENV, "yes")
    with pytest.raises(DeviceError, match=r"^ARCHSEARCH_CPU_BF16='yes' is not one of detect, native, none$"):
        resolve_precision(detect_device("cpu"), "auto")


# --- the matmul peak and MFU ----------------------------------------------------------------------


def test_the_peak_is_timed_once_per_device_and_precision_and_cached(monkeypatch):
    timed = []
    real = profiler._best_seconds

    def spy(fn, info, min_run_time, repeats):
        timed.append(repeats)
        return real(fn, info, min_run_time, repeats)

    monkeypatch.setattr(profiler, "_best_seconds", spy)
    cpu, cache = detect_device("cpu"), KernelCache()
    first = peak_matmul_flops(cpu, "fp32", cache, size=128, min_run_time=0.01)
    assert peak_matmul_flops(cpu, "fp32", cache, size=128, min_run_time=0.01) == first
    assert timed == [profiler.PEAK_REPEATS]  # best of several rounds, timed once
    (row,) = cache.new  # one row for the trial database's kernel table
    assert (row["kind"], row["dtype"], row["shape"], row["fingerprint"]) == (
        PEAK_KIND, "fp32", "128x128x128", cpu.fingerprint
    )  # fmt: skip
    assert first == pytest.approx(2 * 128**3 / row["seconds"])


def test_the_peak_is_the_best_block_not_the_median(monkeypatch):
    class Timed:
        times = (3.0, 1.0, 2.0)  # seconds per call of each block

    monkeypatch.setattr(profiler.benchmark.Timer, "blocked_autorange", lambda self, min_run_time: Timed())
    n = 64
    peak = peak_matmul_flops(detect_device("cpu"), "fp32", InMemoryCache(), size=n)
    assert peak == 2 * n**3 / 1.0


@pytest.mark.parametrize(("achieved", "peak", "mfu"), [(0.5, 1.0, 0.5), (1.0, 1.0, 1.0), (1.083, 1.0, 1.0)])
def test_mfu_is_never_above_one(achieved, peak, mfu, caplog):
    with caplog.at_level(logging.WARNING, logger=profiler.__name__):
        assert model_flops_utilisation(achieved, peak) == mfu
    assert ("clamped to 1" in caplog.text) == (achieved > peak)


def test_an_under_measured_peak_gives_mfu_one_not_more(monkeypatch, corpus, caplog):
    """An MFU of 1.083 was once reported: a peak measured low (say, while another worker loaded the cores)."""
    monkeypatch.setattr(trainer, "peak_matmul_flops", lambda device, precision, cache=None: 1.0)  # 1 FLOP/s
    with caplog.at_level(logging.WARNING, logger=profiler.__name__):
        result = train(TINY, corpus, TrainSettings(tokens=4 * 128, precision="fp32", **FAST))
    assert result.achieved_flops_per_second > result.peak_flops_per_second == 1.0
    assert result.mfu == 1.0
    assert "MFU clamped to 1" in caplog.text
