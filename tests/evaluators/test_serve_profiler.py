"""Measured serving time on the CPU: what `measure_serve` returns beside the times."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from archsearch.evaluators.serve_profiler import measure_serve
from archsearch.space.config import ArchConfig

TINY = ArchConfig(
    vocab_size=64, seq_len=32, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64
)


def test_the_decode_parts_split_the_measured_step_by_op_class():
    measured = measure_serve(TINY, "cpu", batch=2, context=16, dtype="fp32", min_run_time=0.01, parts=True)
    parts = measured.decode_parts
    assert set(parts) == {"gemm", "attention", "other"} and all(v > 0 for v in parts.values())
    assert sum(parts.values()) == pytest.approx(measured.decode_time_s)
    plain = measure_serve(TINY, "cpu", batch=2, context=16, dtype="fp32", min_run_time=0.01)
    assert plain.decode_parts is None and plain.to_dict()["decode_parts"] is None


def _local(streams, caches=()):
    from archsearch.evaluators.hardware import local_cpu
    from archsearch.evaluators.serve_profiler import LocalServeModel

    model = local_cpu(cores=1)
    return LocalServeModel(
        model=model, dtype="fp32", op_s=5e-6, peak_flops=model.device.peak_flops("fp32"),
        bandwidth=model.bandwidth, elementwise_bandwidth=20e9, calibration_error=0.05,
        stream_bandwidths=streams, cache_bandwidths=caches,
    )  # fmt: skip


def test_a_steps_operands_stream_at_the_bandwidth_measured_for_a_working_set_of_their_size():
    local = _local(((2**20, 40e9), (2**24, 20e9), (2**28, 8e9)))
    assert (
        local.stream_bandwidth(2**10) == 40e9 and local.stream_bandwidth(2**30) == 8e9
    )  # flat past the ends
    assert local.stream_bandwidth(2**22) == pytest.approx(30e9)  # halfway in log size
    assert local.stream_bandwidth(2**26) == pytest.approx(14e9)
    assert local.at_working_set(2**24).bandwidth == pytest.approx(20e9)
    assert _local(()).stream_bandwidth(2**30) == local.bandwidth  # unmeasured: the calibrated one


def test_a_decode_step_whose_weights_outgrow_the_caches_is_priced_at_the_streamed_bandwidth():
    measured = measure_serve(TINY, "cpu", batch=2, context=16, dtype="fp32", min_run_time=0.01)
    wide = ArchConfig(**{**TINY.to_dict(), "d_model": 1024, "d_ff": 4096, "n_heads": 64, "n_kv_heads": 64})
    hot, cold = _local(((2**20, 40e9), (2**28, 4e9))), _local(((2**20, 40e9), (2**28, 40e9)))
    for cfg in (TINY, wide):
        (_, streamed), (_, cached) = hot.predict(cfg, measured), cold.predict(cfg, measured)
        assert streamed.time_s >= cached.time_s
    # TINY's weights (a few kB) stay at the cached rate; the wide shape's ~100 MB stream at the rate
    # of a working set of their size, a fraction of it.
    assert hot.predict(TINY, measured)[1].time_s == pytest.approx(cold.predict(TINY, measured)[1].time_s)
    (_, streamed), (_, cached) = hot.predict(wide, measured), cold.predict(wide, measured)
    working_set = streamed.weight_bytes_read + streamed.cache_bytes_read + streamed.cache_bytes_written
    assert working_set > 50 * 2**20
    rate = hot.stream_bandwidth(working_set)
    assert rate < 15e9 and streamed.weights_read_s == pytest.approx(cached.weights_read_s * 40e9 / rate)


def test_the_op_counter_counts_the_bytes_of_memory_bound_ops_and_leaves_gemms_and_attention_to_flops():
    from archsearch.evaluators.serve_profiler import _count_ops

    a, b = torch.ones(1000), torch.ones(1000)
    w, x = torch.ones(64, 64), torch.ones(8, 64)
    q = torch.ones(1, 2, 16, 8)
    table, ids = torch.ones(256, 64), torch.tensor([[1, 2, 3]])
    assert _count_ops(lambda: a * b) == (1, 3 * 4000)  # two read, one written
    assert _count_ops(lambda: a.add_(b)) == (1, 2 * 4000)  # in place: the result is `a`
    assert _count_ops(lambda: x @ w) == (1, 0)
    assert _count_ops(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))[1] == 0
    assert _count_ops(lambda: torch.nn.functional.embedding(ids, table)) == (1, 2 * 3 * 64 * 4)
    assert _count_ops(lambda: a[:10] * 2)[1] == 2 * 40  # a slice counts its elements, not its storage
    # A batched linear is mm then `_unsafe_view`, which the dispatcher counts but which moves nothing.
    assert _count_ops(lambda: x.view(2, 4, 64) @ w) == (2, 0)


def _real_counts(cfg: ArchConfig, batch: int, context: int) -> tuple[int, int, int, int]:
    """The ops and bytes of `measure_serve`'s prefill and decode as they ran here, on the CPU."""
    from archsearch.evaluators.model import KVCache, ProxyLM
    from archsearch.evaluators.serve_profiler import _count_ops

    torch.manual_seed(0)
    model = ProxyLM(dataclasses.replace(cfg, seq_len=max(cfg.seq_len, context + 1))).eval()
    cache = KVCache(model.cfg, batch, context + 1)
    prompt = torch.randint(0, cfg.vocab_size, (batch, context))
    with torch.no_grad():
        prefill = _count_ops(lambda: model(prompt, cache, last_only=True))
        cache.length = context
        decode = _count_ops(lambda: model(prompt[:, -1:], cache, last_only=True))
    return (*prefill, *decode)


@pytest.mark.parametrize("placement", ["pre", "sandwich"])
def test_calls_counted_on_the_meta_device_equal_the_calls_run_here_where_no_kernel_is_fused(placement):
    from archsearch.evaluators.serve_profiler import count_serve_calls

    # LayerNorm is one kernel on the CPU and on CUDA: only RMSNorm is fused on CUDA alone.
    cfg = dataclasses.replace(TINY, norm="layernorm", norm_placement=placement, activation="swiglu")
    counted = count_serve_calls(cfg, 3, 24, "fp32")
    assert dataclasses.astuple(counted) == _real_counts(cfg, 3, 24)
    assert counted.prefill_memory_bytes > 20 * counted.decode_memory_bytes > 0  # 24 tokens against 1


def test_an_rmsnorm_is_counted_as_the_one_fused_kernel_cuda_runs_and_bytes_grow_with_the_tokens():
    from archsearch.evaluators.serve_profiler import count_serve_calls

    rms, layer = TINY, dataclasses.replace(TINY, norm="layernorm")
    norms = 2 * TINY.n_layers + 1  # pre-norm: two a layer and the final one
    assert count_serve_calls(rms, 2, 16).prefill_ops == count_serve_calls(layer, 2, 16).prefill_ops
    real_ops = _real_counts(rms, 2, 16)[0]  # the CPU runs each RMSNorm as several elementwise ops
    assert real_ops > count_serve_calls(rms, 2, 16, "fp32").prefill_ops + norms
    # An activation-sized op's bytes scale with batch x tokens; a 1M-token prefill counts instantly.
    small, big = count_serve_calls(rms, 2, 16), count_serve_calls(rms, 64, 16_384)
    assert big.prefill_memory_bytes / small.prefill_memory_bytes == pytest.approx(64 * 16_384 / 32, rel=0.05)


def test_a_steps_cache_is_read_at_the_cache_rate_measured_for_its_working_set():
    long_context = measure_serve(TINY, "cpu", batch=2, context=16, dtype="fp32", min_run_time=0.01)
    long_context = dataclasses.replace(long_context, context=4096)  # the prediction's context
    streams = ((2**20, 40e9), (2**28, 40e9))
    same, slow = _local(streams), _local(streams, caches=((2**20, 10e9), (2**28, 10e9)))
    assert same.cache_bandwidth(2**24) is None and slow.cache_bandwidth(2**24) == 10e9
    (p_same, d_same), (p_slow, d_slow) = same.predict(TINY, long_context), slow.predict(TINY, long_context)
    assert d_slow.cache_read_s == pytest.approx(4 * d_same.cache_read_s)  # 40 GB/s against 10
    assert d_slow.weights_read_s == d_same.weights_read_s and d_slow.time_s > d_same.time_s
    assert p_slow.time_s == p_same.time_s  # prefill writes the cache, its attention reads no cache


def test_the_streamed_rates_are_measured_with_a_layers_eager_ops_between_every_4_reads(monkeypatch):
    from archsearch.evaluators import serve_profiler as sp
    from archsearch.evaluators.device import detect_device

    info = detect_device("cpu")
    calls = []
    reads = [lambda i=i: calls.append(i) for i in range(8)]
    rate = sp._interleaved_rate(reads, 10**6, 0.0, info, lambda: calls.append("ops"), 0.001)
    cycle = calls[: calls.index(7) + 2]  # one call of the chain: every read, the ops after each 4
    assert cycle[-10:] == [0, 1, 2, 3, "ops", 4, 5, 6, 7, "ops"] and rate > 0
    monkeypatch.setattr(sp, "STREAM_SET_BYTES", (1 << 16, 1 << 18))  # small sets: a quick test
    monkeypatch.setattr(sp, "STREAM_REPEATS", 1)
    ceiling = 20e9
    streams = sp._stream_bandwidths(info, torch.float32, 1e-6, ceiling, 0.005)
    caches = sp._cache_bandwidths(info, torch.float32, ceiling, 0.005)
    for measured in (streams, caches):
        assert [size for size, _ in measured] == [1 << 16, 1 << 18]
        assert all(ceiling / 20 <= rate <= ceiling for _, rate in measured)
    back_to_back = sp._stream_bandwidths(info, torch.float32, 1e-6, ceiling, 0.005, interleaved=False)
    assert [size for size, _ in back_to_back] == [1 << 16, 1 << 18]


def test_a_brief_calibration_measures_the_local_model_briefly_inside_the_block_only():
    from archsearch.evaluators import serve_profiler

    full = {name: getattr(serve_profiler, name) for name in serve_profiler.BRIEF_CALIBRATION}
    assert full != serve_profiler.BRIEF_CALIBRATION
    with serve_profiler.brief_calibration():
        brief = serve_profiler.local_serve_model("cpu", "fp32")
        assert {name: getattr(serve_profiler, name) for name in full} == serve_profiler.BRIEF_CALIBRATION
        # Its streamed rates at the brief working sets, and measured once in the block.
        assert [size for size, _ in brief.stream_bandwidths] == [1 << 18, 1 << 20]
        assert serve_profiler.local_serve_model("cpu", "fp32") is brief
    assert {name: getattr(serve_profiler, name) for name in full} == full
    # Outside, the brief model is gone: the next caller measures the full one, not the brief one.
    assert serve_profiler._local_serve_model.cache_info().currsize == 0
