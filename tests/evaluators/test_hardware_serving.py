"""The modelled serving time: prefill and decode on catalogued GPUs (evaluators.hardware_serving)."""

from __future__ import annotations

import dataclasses

import pytest

from archsearch.errors import ConfigError, UnknownNameError
from archsearch.evaluators.catalogue import ACCELERATORS
from archsearch.evaluators.hardware import device_model
from archsearch.evaluators.hardware_serving import (
    GRAPH_KERNEL_S,
    modelled_serve,
    predict_decode,
    predict_prefill,
    serve_kernels,
)
from archsearch.space import param_counts, preset
from archsearch.space.costs import kv_cache_bytes, max_serve_batch

LLAMA2 = preset("llama2-7b")
H100 = device_model("h100-sxm")


def test_llama2_7b_decode_on_an_h100_is_within_1_6x_of_the_bandwidth_floor():
    step = predict_decode(H100, LLAMA2, batch=1, context=4096)
    # The floor: the weights the GEMMs multiply (not the embedding table, which is looked up, nor
    # the norms' scales) and one 4096-token cache (2 GiB), over the datasheet's 3.35 TB/s.
    params = param_counts(LLAMA2)
    assert step.weight_bytes_read == 2 * (params.attention + params.mlp + params.head)
    assert step.cache_bytes_read == kv_cache_bytes(LLAMA2, 4096) == 2 * 2**30
    assert step.floor_s == pytest.approx((step.weight_bytes_read + 2 * 2**30) / 3.35e12)
    assert 4.5e-3 < step.floor_s < 4.7e-3
    assert 1.0 <= step.time_s / step.floor_s <= 1.6
    assert step.bound == "memory"
    # The parts: bytes at the fitted achieved bandwidth, launches of a graph of fused kernels.
    bandwidth = 3.35e12 * H100.bandwidth_efficiency
    assert step.weights_read_s == pytest.approx(step.weight_bytes_read / bandwidth)
    assert step.cache_read_s == pytest.approx(2 * 2**30 / bandwidth)
    assert step.kernels == serve_kernels(LLAMA2) == 32 * 12 + 4
    assert step.launch_s == pytest.approx(step.kernels * GRAPH_KERNEL_S)
    parts = step.weights_read_s + step.cache_read_s + step.other_memory_s + step.launch_s
    assert step.time_s >= parts * (1 - 1e-9)
    assert step.compute_s < 0.01 * step.time_s
    kernels = step.gemm_s + step.attention_s + step.other_memory_s + step.launch_s
    assert step.time_s == pytest.approx(kernels) and step.gemm_s > step.attention_s > 0


@pytest.mark.parametrize("device", ["h100-sxm", "a100-80gb", "l4"])
@pytest.mark.parametrize("batch", [1, 8, 64])
def test_at_long_context_mqa_decodes_no_slower_than_gqa_and_gqa_than_mha(device, batch):
    model = device_model(device)
    times = [
        predict_decode(model, dataclasses.replace(LLAMA2, n_kv_heads=kv), batch, 32768).time_s
        for kv in (1, 8, 32)
    ]
    assert times[0] <= times[1] <= times[2]
    assert times[0] < times[2] / 1.5  # the cache, not the weights, decides it there


def test_the_cache_read_grows_with_context_and_batch_the_weight_read_does_not():
    short, long = (predict_decode(H100, LLAMA2, 4, c) for c in (1024, 2048))
    assert long.cache_read_s == pytest.approx(2 * short.cache_read_s)
    assert long.weights_read_s == short.weights_read_s
    wide = predict_decode(H100, LLAMA2, 8, 1024)
    assert wide.cache_read_s == pytest.approx(2 * short.cache_read_s)
    assert wide.weight_bytes_read == short.weight_bytes_read


def test_batch_buys_decode_throughput_until_compute_bound():
    rates = [predict_decode(H100, LLAMA2, b, 16).tokens_per_second for b in (1, 4, 16, 64, 256)]
    assert rates == sorted(rates) and rates[-1] > 50 * rates[0]
    # Past peak FLOP/s over bandwidth (about 300 in bf16 on an H100) the step is compute-bound.
    big = predict_decode(H100, LLAMA2, 1024, 16)
    assert big.compute_s > big.weights_read_s and big.bound == "compute"


def test_every_step_is_at_least_its_floor():
    for cfg in (LLAMA2, preset("gpt2-small"), preset("byte-1m"), preset("gemma-7b")):
        for batch in (1, 7, 128):
            for context in (1, 100, 4096):
                for fn in (predict_decode, predict_prefill):
                    t = fn(H100, cfg, batch, context)
                    assert t.time_s >= t.floor_s > 0, (cfg.describe(), batch, context, fn.__name__)


def test_prefill_of_a_long_prompt_is_compute_bound_and_scales_with_tokens():
    one = predict_prefill(H100, LLAMA2, 1, 2048)
    assert one.bound == "compute"
    assert one.cache_bytes_read == 0 and one.cache_bytes_written == kv_cache_bytes(LLAMA2, 2048)
    assert 1.0 <= one.floor_ratio <= 2.0
    two = predict_prefill(H100, LLAMA2, 2, 2048)
    assert two.time_s == pytest.approx(2 * one.time_s, rel=0.1)
    # Every layer's GEMMs on 2048 tokens, the head on the last one only, causal attention.
    params = param_counts(LLAMA2)
    attention = 32 * 2048 * 2 * 2049 * 4096  # layers x T tokens x 4 q_dim (T + 1) / 2 (costs.py)
    assert one.flops == 2 * 2048 * (params.attention + params.mlp) + 2 * params.head + attention


def test_modelled_serve_reports_the_scenario_and_the_largest_batch():
    report = modelled_serve(LLAMA2, "h100-sxm", batch=1, prompt=4000, gen_len=192, max_batch=30)
    assert report.decode.context == 4000 + 96 + 1
    assert report.decode_at_max_batch is not None and report.decode_at_max_batch.batch == 30
    # At 4k context each sequence's 2 GiB cache, not the shared weights, dominates a step.
    assert 5 < report.decode_at_max_batch.tokens_per_second / report.decode.tokens_per_second < 30
    out = report.to_dict()
    assert out["prefill_time_s"] == report.prefill.time_s and out["decode_time_s"] == report.decode.time_s
    assert out["generation_time_s"] == pytest.approx(report.prefill.time_s + 191 * report.decode.time_s)
    assert (
        out["decode_at_max_batch"]["batch"]
        == 30
        == max_serve_batch(LLAMA2, 4096, ACCELERATORS["h100-sxm"].memory_bytes)
    )
    assert "max_batch" not in out  # the memory figures' (ServeCosts): 0 where none fits, None unlimited
    assert set(out["decode"]) >= {"weights_read_s", "cache_read_s", "compute_s", "launch_s", "floor_s"}


def test_bad_sizes_and_dtypes_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"batch must be a positive integer up to 2\*\*31 - 1, got 0"):
        predict_decode(H100, LLAMA2, 0, 16)
    with pytest.raises(ConfigError, match="context must be a positive integer"):
        predict_decode(H100, LLAMA2, 1, 0)
    with pytest.raises(UnknownNameError, match="has no fp8 peak"):
        predict_decode(device_model("a100-80gb"), LLAMA2, 1, 16, weight_dtype="fp8")
    with pytest.raises(UnknownNameError, match="unknown dtype 'int4'"):
        predict_decode(H100, LLAMA2, 1, 16, cache_dtype="int4")
    with pytest.raises(UnknownNameError, match="unknown accelerator 'tpu'"):
        modelled_serve(LLAMA2, "tpu", 1, 16, 16)


def test_a_decode_attention_rate_of_its_own_prices_decode_and_leaves_prefill_alone():
    cfg = preset("llama2-7b")
    base = device_model("l4")
    slow = dataclasses.replace(base, decode_attention_efficiency=0.001)  # compute-bound decode attention
    assert predict_prefill(slow, cfg, 4, 2048).time_s == predict_prefill(base, cfg, 4, 2048).time_s
    fast, slowed = predict_decode(base, cfg, 4, 2048), predict_decode(slow, cfg, 4, 2048)
    assert slowed.attention_s > 2 * fast.attention_s and slowed.gemm_s == fast.gemm_s
    with pytest.raises(ConfigError, match="decode_attention_efficiency must be a positive number, got 0"):
        device_model("l4", decode_attention_efficiency=0)


def test_a_cache_bandwidth_of_its_own_prices_the_decode_cache_read_and_leaves_the_weights_alone():
    bandwidth = 3.35e12 * H100.bandwidth_efficiency
    plain = predict_decode(H100, LLAMA2, 8, 32768)
    slow = predict_decode(H100, LLAMA2, 8, 32768, cache_bandwidth=bandwidth / 4)
    assert slow.cache_read_s == pytest.approx(4 * plain.cache_read_s)
    assert slow.weights_read_s == plain.weights_read_s and slow.gemm_s == plain.gemm_s
    # At 8 x 32k tokens decode attention is the cache read: it takes 4x as long.
    assert slow.attention_s == pytest.approx(4 * plain.attention_s, rel=1e-3)
    assert slow.floor_s == plain.floor_s  # the floor is the peak bandwidth's, whatever is achieved
    prefill = predict_prefill(H100, LLAMA2, 4, 2048)
    assert predict_prefill(H100, LLAMA2, 4, 2048, cache_bandwidth=bandwidth / 4).time_s == prefill.time_s


def test_an_eager_call_waits_on_the_host_a_replayed_graph_does_not():
    # An eager call (the campaign's measured calls) is at least its launches at the fitted host
    # time each (catalogue.FITTED, fitted on training steps); a serving engine's graph replays
    # them without the host, whatever its gap a kernel.
    small = preset("gpt2-small")
    eager = predict_decode(H100, small, 1, 512, kernel_s=H100.eager_kernel_s, kernels=300, eager=True)
    assert eager.host_s == pytest.approx(300 * H100.host_kernel_s) and eager.time_s == eager.host_s
    assert eager.bound == "host" and eager.to_dict()["host_s"] == eager.host_s
    graph = predict_decode(H100, small, 1, 512, kernel_s=GRAPH_KERNEL_S, kernels=300)
    assert graph.host_s == 0.0 and graph.time_s < eager.time_s and graph.bound != "host"
    # A long prompt's kernels outlast the host: the GPU's time.
    long = predict_prefill(H100, LLAMA2, 8, 4096, kernel_s=H100.eager_kernel_s, kernels=300, eager=True)
    assert long.time_s > long.host_s > 0 and long.bound == "compute"
    # No host time fitted (a bare model, the CPU's): nothing changes.
    bare = device_model("h100-sxm", fitted=False)
    assert predict_decode(bare, small, 1, 512, kernel_s=1e-5, kernels=300, eager=True).host_s == 0.0
