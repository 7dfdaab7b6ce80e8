"""The CUDA code paths of the evaluators: device description, profiler timing, model, data, trainer.

Skipped (with the reason shown by `-ra`) where torch sees no CUDA device, as on CI. The speed
checks are loose bounds that hold on any recent data-centre GPU; their point is to catch a timer
that does not wait for the device (absurdly high TFLOP/s) or a kernel that never ran on it.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from archsearch.evaluators.data import load_dataset
from archsearch.evaluators.device import detect_device
from archsearch.evaluators.model import ProxyLM
from archsearch.evaluators.profiler import (
    InMemoryCache,
    measure_bandwidth,
    profile_step,
    time_gemm,
)
from archsearch.evaluators.step_kernels import step_kernels
from archsearch.evaluators.trainer import TrainSettings, train
from archsearch.space import ArchConfig, flop_counts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)")

TINY = ArchConfig(
    vocab_size=256, seq_len=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128
)
# Above any GPU's dense bf16 peak (B200: 2.25 PFLOP/s): a faster measurement did not wait for the GPU.
IMPOSSIBLE_TFLOPS = 5000


def test_cuda_device_info():
    info = detect_device("cuda")
    assert info.type == "cuda" and info.index == torch.cuda.current_device()
    assert info.name == torch.cuda.get_device_name(info.index)
    assert info.units == torch.cuda.get_device_properties(info.index).multi_processor_count > 0
    assert re.fullmatch(r"sm_\d+", info.capability)
    assert info.memory_bytes > 2**30 and info.cuda_version == torch.version.cuda
    assert info.torch_device == torch.device("cuda", info.index)
    assert detect_device("cuda:0").fingerprint == detect_device("cuda").fingerprint


def test_cuda_gemm_timing_waits_for_the_device():
    n = 4096
    seconds = time_gemm(n, n, n, "cuda", "bf16", min_run_time=0.05)
    tflops = 2 * n**3 / seconds / 1e12
    assert 1 < tflops < IMPOSSIBLE_TFLOPS


def test_cuda_bandwidth_is_plausible():
    bandwidth = measure_bandwidth("cuda", min_run_time=0.05)
    assert 50e9 < bandwidth < 20e12  # bytes/s: above PCIe, below any HBM


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_cuda_profile_step(dtype):
    cache = InMemoryCache()
    report = profile_step(TINY, 4, device="cuda", dtype=dtype, cache=cache, min_run_time=0.01)
    step = step_kernels(TINY, 4, dtype)
    assert report.device["type"] == "cuda" and not report.modelled
    assert [k.name for k in report.kernels] == [x.name for x in (*step.gemms, *step.attention)]
    assert all(math.isfinite(k.time_s) and k.time_s > 0 for k in report.kernels)
    assert all(k.tflops < IMPOSSIBLE_TFLOPS for k in report.kernels)
    assert report.bandwidth_bytes_per_s > 50e9
    assert report.step_time_s > 0
    assert len(cache) == len({(k.kind, k.shape) for k in report.kernels}) + 1  # + the bandwidth copy


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_cuda_flop_counter_matches_the_cost_model(autocast):
    """FlopCounterMode knows the CUDA SDPA kernels (flash, memory-efficient, cuDNN) too."""
    cfg = ArchConfig(
        vocab_size=256, seq_len=128, d_model=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=512
    )
    model = ProxyLM(cfg).cuda()
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), device="cuda")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            model(idx)
    assert counter.get_total_flops() == flop_counts(cfg).forward * cfg.seq_len * 2


def test_cuda_model_matches_cpu():
    torch.manual_seed(0)
    model = ProxyLM(TINY)
    idx = torch.randint(0, TINY.vocab_size, (2, TINY.seq_len))
    with torch.no_grad():
        expected = model(idx)
        got = model.cuda()(idx.cuda()).cpu()
    assert torch.allclose(got, expected, atol=1e-3, rtol=1e-3)


def test_cuda_batches_equal_cpu_batches():
    data = load_dataset(None, max_corpus_bytes=300_000)
    cpu = next(data.train_batches(4, 32, seed=3, device="cpu"))
    gpu = next(data.train_batches(4, 32, seed=3, device="cuda"))
    for a, b in zip(cpu, gpu, strict=True):
        assert b.device.type == "cuda" and b.dtype == torch.int64
        assert torch.equal(a, b.cpu())
    val = data.val_batches(4, 32, count=2, device="cuda")
    assert all(x.device.type == "cuda" for pair in val for x in pair)


def test_cuda_training_runs_and_reports_mfu():
    data = load_dataset(None, max_corpus_bytes=300_000)
    settings = TrainSettings(tokens=50_000, device="cuda", batch_size=8, evals=2, eval_batches=2)
    result = train(TINY, data, settings)
    assert result.status == "complete", result.reason
    assert result.precision == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")
    assert "cuda" in result.device
    assert result.val_loss < math.log(256) - 1.0
    assert 0 < result.mfu < 1
    assert result.peak_flops_per_second / 1e12 < IMPOSSIBLE_TFLOPS


def test_a_recorded_cuda_step_waits_for_the_gpu_and_names_the_attention_kernels():
    # benchmarks/gpu_campaign.py part 1's measurement on the device it is for (the CPU runs it in
    # tests/evaluators/test_step_record.py).
    from archsearch.evaluators import step_record

    cfg = ArchConfig(vocab_size=256, seq_len=1024, d_model=1024, n_layers=4, n_heads=16, n_kv_heads=4,
                     head_dim=64, d_ff=4096)  # fmt: skip
    entry = step_record.measure_shape("cuda", cfg, 8, "cuda", InMemoryCache(), 0.02, "bf16", train_steps=3)
    flops = sum(g.flops for g in step_kernels(cfg, 8).gemms)
    assert flops / entry["train_step_s"] / 1e12 < IMPOSSIBLE_TFLOPS  # the step clock waited
    assert entry["train_step_s"] >= entry["report"]["kernel_time_s"] * 0.5  # the kernels ran in the step
    assert entry["attention_kernels"] and all(isinstance(name, str) for name in entry["attention_kernels"])
