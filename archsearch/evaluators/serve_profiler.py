"""Measured serving time on the device at hand: prefill and one decode step of the proxy model.

The proxy (`evaluators.model.ProxyLM`, random weights: time does not depend on their values)
prefills `batch` prompts of `context` tokens into a preallocated `KVCache`, then decodes one token
per sequence over a cache of `context` tokens. Each is timed as the profiler times kernels: one
call first, then `torch.utils.benchmark`'s blocked autorange for `min_run_time` seconds, median
(`profiler._median_seconds`); the cache is rewound before each call, so every call does the same
work on the same memory.

Beside it, the local device model's prediction (`local_serve_model`): `evaluators.hardware_serving` on
this CPU's model calibrated on a fixed set of GEMMs, with each call's weights and cache read at the
bandwidth measured for a working set of their size, SDPA at its measured prefill and decode rates,
the memory-bound ops' bytes (counted as the call runs them) at the measured rate of a gated
activation, and each eager op charged the seconds per op of a fixed reference shape whose decode
step is all overhead, times the ops this shape's calls really dispatch (`_OpCounter`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree

from archsearch.evaluators.catalogue import Accelerator
from archsearch.evaluators.counting import KernelCounter
from archsearch.evaluators.device import DeviceInfo, detect_device
from archsearch.evaluators.hardware import DeviceModel, local_cpu
from archsearch.evaluators.hardware_serving import ServeTime, predict_decode, predict_prefill
from archsearch.evaluators.model import KVCache, ProxyLM
from archsearch.evaluators.profiler import (
    AUTO,
    DEFAULT_MIN_RUN_TIME,
    TORCH_DTYPES,
    _check_dtype,
    _median_seconds,
    resolve_precision,
)
from archsearch.evaluators.step_kernels import AttentionCall
from archsearch.space.config import ArchConfig

# The reference shape whose decode step prices one eager op: one layer at width 16, where every
# GEMM and attention call is a few hundred FLOPs, so its time is the ops' dispatch alone.
REFERENCE = ArchConfig(
    vocab_size=64, seq_len=64, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=8, d_ff=32
)


@dataclass(frozen=True)
class MeasuredServe:
    """Prefill and a decode step of one shape, timed on the device at hand.

    Attributes:
        prefill_time_s: median seconds to prefill `batch` prompts of `context` tokens.
        decode_time_s: median seconds of one decode step (a token for each of `batch` sequences)
            over caches of `context` tokens.
        prefill_ops, decode_ops: ATen ops each call dispatches (eager kernels).
        decode_graph_time_s: the same decode step captured once in a CUDA graph and replayed (as
            serving engines run it: each kernel's launch costs the graph's, not the host's);
            None where not asked for or not on CUDA.
        graph_error: why the step could not be captured, where it could not.
        prefill_memory_bytes, decode_memory_bytes: bytes the ops other than GEMMs and attention
            (norms, activations, rope, residual adds, the cache write) read and write in each call,
            counted with the dispatcher as the ops run (`_OpCounter`).
        decode_parts: where asked for, on a CPU, `decode_time_s` split by the ops' share of the
            step's self time under `torch.profiler`: "gemm" (mm, addmm, bmm), "attention"
            (scaled dot-product attention) and "other" (everything else: the eager ops' dispatch,
            norms, activations, the cache write). The profiler's own cost falls on each op alike,
            so small ops' shares are somewhat inflated.
    """

    device: dict[str, Any]
    dtype: str
    batch: int
    context: int
    prefill_time_s: float
    decode_time_s: float
    prefill_ops: int
    decode_ops: int
    decode_graph_time_s: float | None = None
    graph_error: str | None = None
    decode_parts: dict[str, float] | None = None
    # Bytes the ops other than GEMMs and attention read and write in each call (`_OpCounter`).
    prefill_memory_bytes: int | None = None
    decode_memory_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _model(cfg: ArchConfig, context: int, info: DeviceInfo, torch_dtype: torch.dtype, seed: int) -> ProxyLM:
    """The proxy with room for `context + 1` positions (a longer learned table, rope angles)."""
    torch.manual_seed(seed)
    room = dataclasses.replace(cfg, seq_len=max(cfg.seq_len, context + 1))
    return ProxyLM(room).to(device=info.torch_device, dtype=torch_dtype).eval()


GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm"})
PROFILED_CALLS = 20  # decode steps profiled for `decode_parts`


def _parts(fn: Any, seconds: float) -> dict[str, float]:
    """`seconds` split by each op class's share of `fn`'s self CPU time under the profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(PROFILED_CALLS):
            fn()
    totals = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    for event in prof.key_averages():
        if event.key in GEMM_OPS:
            kind = "gemm"
        elif "scaled_dot_product" in event.key:
            kind = "attention"
        else:
            kind = "other"
        totals[kind] += event.self_cpu_time_total
    whole = sum(totals.values()) or 1.0
    return {kind: seconds * t / whole for kind, t in totals.items()}


class _OpCounter(KernelCounter):
    """The ops a call dispatches, and the bytes those other than GEMMs and attention read and
    write: each tensor argument and result once (an in-place op's result is its argument; a
    broadcast or a slice counts its elements, at most its storage; a lookup reads the rows it
    returns; `_unsafe_view`, a view the dispatcher does not mark as one, moves nothing). A fused
    kernel's stand-in (`counting.FusedRMSNorm`) adds its own bytes (`add_bytes`)."""

    def __init__(self) -> None:
        super().__init__()
        self.memory_bytes = 0

    def count_bytes(self, func: Any, name: str, args: tuple, kwargs: dict, out: object) -> None:
        if func.is_view or name in _NO_BYTES_OPS:
            return
        if name in _LOOKUP_OPS:
            tensors = [out, out]  # the rows read, then written
        elif name.endswith("_"):  # in place: the result is an argument
            tensors = [*pytree.tree_leaves((args, kwargs))]
        else:
            tensors = [*pytree.tree_leaves((args, kwargs)), *pytree.tree_leaves(out)]
        self.add_bytes(
            "elementwise",
            sum(
                min(t.numel() * t.element_size(), t.untyped_storage().nbytes())
                for t in tensors
                if isinstance(t, torch.Tensor)
            ),
        )

    def add_bytes(self, group: str, moved: int) -> None:
        self.memory_bytes += moved


_LOOKUP_OPS = frozenset({"embedding", "index_select"})
# Not views to the dispatcher, yet no kernel runs: matmul's reshape of its result. The training
# step's counter (`counting.KernelCounter`) still counts their bytes: its fitted GPU constants were
# fitted with them (7.7% of a small step's bytes), and change with a refit.
_NO_BYTES_OPS = frozenset({"_unsafe_view"})


def _count_ops(fn: Any) -> tuple[int, int]:
    """(ops dispatched, bytes the memory-bound ones moved) by one call of `fn`."""
    counter = _OpCounter()
    with counter:
        fn()
    return counter.kernels, counter.memory_bytes


@dataclass(frozen=True)
class CallCounts:
    """The ops and memory-bound bytes of the calls `measure_serve` times, counted without running
    them (`count_serve_calls`)."""

    prefill_ops: int
    prefill_memory_bytes: int
    decode_ops: int
    decode_memory_bytes: int


@functools.cache
def count_serve_calls(cfg: ArchConfig, batch: int, context: int, dtype: str = "bf16") -> CallCounts:
    """The prefill and decode step `measure_serve` times, counted as CUDA runs them eagerly, at any
    size and with no GPU: the model in `dtype` on the meta device (no memory, no arithmetic), each
    RMSNorm as CUDA's one fused kernel (`counting.FusedRMSNorm`; the CPU runs a dozen elementwise
    ops), attention as one kernel that moves no counted bytes (its cost is the attention model's;
    on the meta device SDPA would run as its unfused math). Used to model an eager call on a GPU
    that is not here (benchmarks/gpu_campaign_serve.py): the same op count as the H200 dispatched
    in each of the 78 calls it recorded (13 shapes, 3 scenarios, prefill and decode; 2026-11-27);
    on the CPU, where no kernel is fused, the same ops and bytes as the calls run here (tested).

    Raises:
        UnknownNameError: `dtype` is not fp32, bf16 or fp16.
    """
    from archsearch.evaluators.counting import count_norms_as_fused
    from archsearch.evaluators.model import Attention

    torch_dtype = TORCH_DTYPES[dtype]  # an unknown name: UnknownNameError, naming the valid ones
    room = dataclasses.replace(cfg, seq_len=max(cfg.seq_len, context + 1))
    counts = []
    for phase in ("prefill", "decode"):
        with torch.device("meta"):
            model = ProxyLM(room).to(torch_dtype).eval()
            cache = KVCache(room, batch, context + 1, torch_dtype, "meta")
        counter = _OpCounter()
        count_norms_as_fused(model, counter)

        def attend(q: torch.Tensor, *_: object, counter: _OpCounter = counter, **__: object) -> torch.Tensor:
            with counter.pause():
                y = torch.empty_like(q)
            counter.kernels += 1
            return y

        for module in model.modules():
            if isinstance(module, Attention):
                module.attend = attend
        tokens = context if phase == "prefill" else 1
        cache.length = 0 if phase == "prefill" else context
        idx = torch.zeros((batch, tokens), dtype=torch.long, device="meta")
        with torch.no_grad(), counter:
            model(idx, cache, last_only=True)
        counts += [counter.kernels, counter.memory_bytes]
    return CallCounts(*counts)


@torch.no_grad()
def measure_serve(
    cfg: ArchConfig,
    device: str = "cpu",
    batch: int = 1,
    context: int = 128,
    dtype: str = AUTO,
    min_run_time: float = DEFAULT_MIN_RUN_TIME,
    seed: int = 0,
    cuda_graph: bool = False,
    parts: bool = False,
) -> MeasuredServe:
    """Time prefill and one decode step of `cfg` on `device` (see the module docstring).

    Args:
        dtype: "fp32", "bf16", "fp16", or "auto": what training runs in there
            (`profiler.resolve_precision`).
        cuda_graph: on CUDA, also time the decode step replayed from a CUDA graph
            (`decode_graph_time_s`); ignored elsewhere.
        parts: on a CPU, also split the decode step's time by op class (`decode_parts`);
            ignored elsewhere.

    Raises:
        DeviceError: no such device here.
        ProfilerError: the dtype is not supported there.
        ConfigError: batch or context is not positive.
    """
    from archsearch.errors import ConfigError

    for name, value in (("batch", batch), ("context", context)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    info = detect_device(device)
    precision = resolve_precision(info, dtype)
    torch_dtype = _check_dtype(info, precision)
    model = _model(cfg, context, info, torch_dtype, seed)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    prompt = torch.randint(0, cfg.vocab_size, (batch, context), generator=gen).to(info.torch_device)
    token = prompt[:, -1:].clone()
    cache = KVCache(model.cfg, batch, context + 1, torch_dtype, info.torch_device)

    def prefill() -> object:
        cache.length = 0
        return model(prompt, cache, last_only=True)

    def decode() -> object:
        cache.length = context  # the same step each call: over `context` cached tokens
        return model(token, cache, last_only=True)

    prefill_s = _median_seconds(prefill, info, min_run_time)
    decode_s = _median_seconds(decode, info, min_run_time)
    graph_s, graph_error = None, None
    if cuda_graph and info.type == "cuda":
        try:
            graph_s = _median_seconds(_captured(decode, info), info, min_run_time)
        except RuntimeError as exc:  # an op the capture refuses: the eager times still stand
            graph_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    decode_parts = _parts(decode, decode_s) if parts and info.type == "cpu" else None
    (prefill_ops, prefill_bytes), (decode_ops, decode_bytes) = _count_ops(prefill), _count_ops(decode)
    return MeasuredServe(
        device=info.to_dict(), dtype=precision, batch=batch, context=context, prefill_time_s=prefill_s,
        decode_time_s=decode_s, prefill_ops=prefill_ops, decode_ops=decode_ops,
        decode_graph_time_s=graph_s, graph_error=graph_error, decode_parts=decode_parts,
        prefill_memory_bytes=prefill_bytes, decode_memory_bytes=decode_bytes,
    )  # fmt: skip


def _captured(fn: Any, info: DeviceInfo) -> Any:
    """`fn` (whose every call does the same work on the same memory) captured in a CUDA graph:
    warmed up on a side stream, as capture requires, and returned as the graph's replay."""
    with torch.cuda.device(info.index):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    return graph.replay


# GEMMs the local model is calibrated on (`hardware.calibrate`), fixed and shape-independent: m
# from a decode step's few rows to a prefill's thousands, n and k the tiny examples' widths.
CALIBRATION_GEMMS = tuple(
    (m, n, k)
    for m in (4, 64, 512, 2048)
    for n, k in ((64, 64), (192, 128), (128, 384), (768, 256), (256, 768), (1024, 256))
)
ELEMENTWISE_ELEMENTS = 1 << 18  # a prefill activation's size: 2048 tokens x 128 features
# The bandwidth a step's distinct bytes stream at, by how many there are: a decode step reads every
# weight once and the whole cache, which fit a core's caches for the tiniest shapes only, while the
# calibration GEMMs reread one hot operand (on the 2-core EPYC, 2026-11-26: 4 x 256 @ 256 x 1408 in
# 65 us hot, 10x that cycling 64 such weights). And between a layer's reads an eager step runs its
# other ops (norms, rope, SDPA, the cache write), whose code and tensors evict part of what the reads
# left in the caches: on the same CPU (2026-11-27) 4-row GEMMs over 6-12 MB of weights ran 1.4-2.2x
# slower with a layer's ops between them than back to back, and a 0.3-12 MB model's GEMMs inside
# its decode step 1.1-1.7x. So each working set is timed as a chain of reads over `STREAM_MATRICES`
# distinct operands that hold it, a decode step of `REFERENCE` (its ~50 eager ops) after every
# `LAYER_READS` of them, the chain's fixed costs and the reference steps' own time taken off:
# 4-row GEMMs for the weights (`_stream_bandwidths`), one-query SDPA calls for the cache
# (`_cache_bandwidths`).
STREAM_SET_BYTES = tuple(mb << 20 for mb in (1, 2, 4, 8, 12, 16, 32, 64, 256))
STREAM_MATRICES = 16
STREAM_REPEATS = 3  # each rate the median of 3 (`_interleaved_rate`)
# Seconds of repeats per timing of the local model's own measurements (`local_serve_model`): its
# GEMMs, streamed and attention rates; the elementwise rate and the reference step's op time twice it.
CALIBRATION_MIN_RUN_TIME = 0.05
# What `brief_calibration` measures the local model with: 0.01 s timings, the streamed rates at two
# small working sets once each, the decode step's parts from 4 profiled calls.
BRIEF_CALIBRATION = {
    "CALIBRATION_MIN_RUN_TIME": 0.01,
    "STREAM_SET_BYTES": (1 << 18, 1 << 20),
    "STREAM_REPEATS": 1,
    "PROFILED_CALLS": 4,
}
LAYER_READS = 4  # a decoder layer's weight matrices: fused QKV, output, gate+up, down
# The one-query SDPA calls the cache chain reads: 4 sequences of 4 heads of 32.
CACHE_CALL = (4, 4, 32)


@dataclass(frozen=True)
class LocalServeModel:
    """The device model of this machine for serving, and what it was measured from."""

    model: DeviceModel
    dtype: str
    op_s: float  # seconds per eager op: the reference shape's decode step over its ops
    peak_flops: float  # calibrated effective FLOP/s in `dtype`
    bandwidth: float  # calibrated effective bandwidth of GEMM operands, bytes/s
    elementwise_bandwidth: float  # bytes/s a gated activation (silu(a) * b) moves
    calibration_error: float  # median |error| of the calibrated model on its own GEMMs
    # (working set bytes, bytes/s) measured: what a step's weights (`stream_bandwidths`) and its
    # cache (`cache_bandwidths`) stream at, by the step's distinct bytes in all
    stream_bandwidths: tuple[tuple[int, float], ...] = ()
    cache_bandwidths: tuple[tuple[int, float], ...] = ()

    def predict(self, cfg: ArchConfig, measured: MeasuredServe) -> tuple[ServeTime, ServeTime]:
        """(prefill, decode) of `measured`'s calls, predicted with the ops they dispatched, each
        call's weights and cache read at the rates measured for a working set of their size."""
        b, c, d = measured.batch, measured.context, self.dtype
        calls = (
            (predict_prefill, measured.prefill_ops, measured.prefill_memory_bytes),
            (predict_decode, measured.decode_ops, measured.decode_memory_bytes),
        )
        times = []
        for predict, ops, moved in calls:
            kw = dict(
                kernel_s=self.op_s, kernels=ops, memory_op_bandwidth=self.elementwise_bandwidth,
                memory_op_bytes=moved,
            )  # fmt: skip
            first = predict(self.model, cfg, b, c, d, d, **kw)
            working_set = first.weight_bytes_read + first.cache_bytes_read + first.cache_bytes_written
            cache = self.cache_bandwidth(working_set)
            times.append(
                predict(self.at_working_set(working_set), cfg, b, c, d, d, **kw, cache_bandwidth=cache)
            )
        return times[0], times[1]

    def stream_bandwidth(self, working_set: float) -> float:
        """Bytes/s of the weights of a step whose distinct bytes total `working_set`: the measured
        chains, interpolated in log size, held flat past either end; the calibrated bandwidth
        without them."""
        return _interpolated(self.stream_bandwidths, working_set) or self.bandwidth

    def cache_bandwidth(self, working_set: float) -> float | None:
        """Bytes/s of the cache in such a step, as `stream_bandwidth`; None (the weights' rate)
        without a measured chain."""
        return _interpolated(self.cache_bandwidths, working_set)

    def at_working_set(self, working_set: float) -> DeviceModel:
        """The device model with its operands' bandwidth that of a `working_set`-byte step."""
        scale = self.stream_bandwidth(working_set) / self.model.bandwidth
        device = dataclasses.replace(
            self.model.device, memory_bandwidth=self.model.device.memory_bandwidth * scale
        )
        return dataclasses.replace(self.model, device=device)

    def with_op_time_now(self, device: str = "cpu") -> LocalServeModel:
        """This model with the seconds per eager op measured again on the reference shape: on a
        shared machine the host's speed drifts with the load, and an op's cost with it."""
        return self.with_op_s(_reference_op_s(device, self.dtype))

    def with_op_s(self, op_s: float) -> LocalServeModel:
        """This model with `op_s` seconds per eager op (another measurement's)."""
        model = dataclasses.replace(self.model, launch_overhead_s=op_s)
        return dataclasses.replace(self, model=model, op_s=op_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.model.device.name,
            "dtype": self.dtype,
            "op_s": self.op_s,
            "peak_flops": self.peak_flops,
            "bandwidth_bytes_per_s": self.bandwidth,
            "elementwise_bandwidth_bytes_per_s": self.elementwise_bandwidth,
            "calibration_gemms": len(CALIBRATION_GEMMS),
            "calibration_median_error": self.calibration_error,
            "stream_bandwidths": [list(pair) for pair in self.stream_bandwidths],
            "cache_bandwidths": [list(pair) for pair in self.cache_bandwidths],
            "attention_efficiency": self.model.attention_efficiency,
            "decode_attention_efficiency": self.model.decode_attention_efficiency,
        }


def local_serve_model(device: str = "cpu", dtype: str = "fp32", interleaved: bool = True) -> LocalServeModel:
    """This CPU's serving model in `dtype` (a storage dtype): `hardware.local_cpu` calibrated on
    the fixed `CALIBRATION_GEMMS` (`hardware.calibrate`: effective peak, bandwidth), the rates at
    which a step's weights and cache stream by working set (`_stream_bandwidths`,
    `_cache_bandwidths`), the bytes per second of a gated activation for the memory-bound ops, and
    seconds per eager op from the reference shape's decode step. Nothing is fitted to the shape
    predicted. Measured once per process and torch thread count. `interleaved` False: the model
    before 2026-11-27 (weights read back to back, the cache at their rate), which
    `benchmarks/serve_accuracy.py` scores beside it.

    Raises:
        ConfigError: `device` is not a CPU (a local GPU is measured, not yet modelled).
        DeviceError, ProfilerError: as `measure_serve`.
    """
    from archsearch.errors import ConfigError

    if detect_device(device).type != "cpu":
        raise ConfigError(f"the local serving model is a CPU's; {device!r} is measured without one")
    return _local_serve_model(device, dtype, torch.get_num_threads(), interleaved)


def _elementwise_bandwidth(info: DeviceInfo, torch_dtype: torch.dtype, min_run_time: float) -> float:
    """Bytes per second `silu(a) * b` moves: a and b read, the temporary written and read, the
    product written."""
    a, b = (torch.randn(ELEMENTWISE_ELEMENTS, dtype=torch_dtype, device=info.torch_device) for _ in "ab")
    seconds = _median_seconds(lambda: torch.nn.functional.silu(a) * b, info, min_run_time)
    return 5 * ELEMENTWISE_ELEMENTS * a.element_size() / seconds


def _interpolated(measured: tuple[tuple[int, float], ...], working_set: float) -> float | None:
    """`measured` (working set, bytes/s) at `working_set`, in log size, flat past either end."""
    if not measured:
        return None
    sizes, rates = zip(*measured, strict=True)
    return float(np.interp(np.log(max(working_set, 1.0)), np.log(sizes), rates))


def _layer_ops(info: DeviceInfo, torch_dtype: torch.dtype) -> Any:
    """A decoder layer's eager ops between its reads: one decode step of `REFERENCE`."""
    model = _model(REFERENCE, 16, info, torch_dtype, 0)
    cache = KVCache(model.cfg, 1, 17, torch_dtype, info.torch_device)
    token = torch.zeros(1, 1, dtype=torch.long, device=info.torch_device)

    def step() -> None:
        cache.length = 16
        model(token, cache, last_only=True)

    return step


@torch.no_grad()
def _interleaved_rate(
    reads: list[Any], moved: int, fixed_s: float, info: DeviceInfo, layer_ops: Any, min_run_time: float
) -> float:
    """Bytes/s of `reads` (calls that together read `moved` distinct bytes), `layer_ops` after
    every `LAYER_READS` of them, less `fixed_s` per read and the layer ops' own time; `layer_ops`
    None: the reads back to back. The median of `STREAM_REPEATS` measurements, each the chain and
    the ops alone timed one after the other: one timing disturbed by the host would otherwise put
    a dip or a spike in the curve that every shape of that size inherits."""
    between = len(reads) // LAYER_READS

    def chain() -> None:
        for i, read in enumerate(reads):
            read()
            if layer_ops is not None and i % LAYER_READS == LAYER_READS - 1:
                layer_ops()

    def ops_alone() -> None:
        for _ in range(between):
            layer_ops()

    rates = []
    for _ in range(STREAM_REPEATS):
        seconds = _median_seconds(chain, info, min_run_time)
        if layer_ops is not None:
            seconds -= _median_seconds(ops_alone, info, min_run_time)
        rates.append(moved / max(seconds - len(reads) * fixed_s, 1e-12))
    return float(np.median(rates))


def _stream_bandwidths(
    info: DeviceInfo,
    torch_dtype: torch.dtype,
    call_s: float,
    ceiling: float,
    min_run_time: float,
    interleaved: bool = True,
) -> tuple[tuple[int, float], ...]:
    """(working set, bytes/s) for each of `STREAM_SET_BYTES`: 4-row GEMMs over `STREAM_MATRICES`
    distinct (512 x n) matrices holding it, as a decode step reads its weights, a layer's ops
    between every `LAYER_READS` (`_interleaved_rate`), `call_s` (the calibrated fixed cost of a GEMM
    call) taken off each; at most `ceiling` (the calibrated, hot bandwidth), at least a twentieth.
    `interleaved` False: the GEMMs back to back (the model before 2026-11-27)."""
    size = torch.empty((), dtype=torch_dtype).element_size()
    layer_ops = _layer_ops(info, torch_dtype) if interleaved else None
    x = torch.randn(4, 512, dtype=torch_dtype, device=info.torch_device)
    out = []
    for total in STREAM_SET_BYTES:
        n = max(1, total // (STREAM_MATRICES * 512 * size))
        weights = [
            torch.randn(512, n, dtype=torch_dtype, device=info.torch_device) for _ in range(STREAM_MATRICES)
        ]
        reads = [lambda w=w: x @ w for w in weights]
        moved = STREAM_MATRICES * 512 * n * size
        rate = _interleaved_rate(reads, moved, call_s, info, layer_ops, min_run_time)
        out.append((moved, min(ceiling, max(ceiling / 20, rate))))
    return tuple(out)


def _cache_bandwidths(
    info: DeviceInfo, torch_dtype: torch.dtype, ceiling: float, min_run_time: float
) -> tuple[tuple[int, float], ...]:
    """(working set, bytes/s) for each of `STREAM_SET_BYTES`: one-query SDPA calls (`CACHE_CALL`)
    over `STREAM_MATRICES` distinct K/V caches holding it, as a decode step reads its cache, a
    layer's ops between every `LAYER_READS` (`_interleaved_rate`), the cost of a call over a
    one-token cache taken off each; at most `ceiling` (the calibrated, hot bandwidth: below a few
    MB a call is nearly all its fixed cost, and what is left after taking it off is noise), at
    least a twentieth of it."""
    b, h, d = CACHE_CALL
    size = torch.empty((), dtype=torch_dtype).element_size()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q = torch.randn(b, h, 1, d, dtype=torch_dtype, device=info.torch_device)
    one = torch.randn(b, h, 1, d, dtype=torch_dtype, device=info.torch_device)
    with torch.no_grad():
        fixed_s = _median_seconds(lambda: sdpa(q, one, one), info, min_run_time)
    layer_ops = _layer_ops(info, torch_dtype)
    out = []
    for total in STREAM_SET_BYTES:
        tokens = max(1, total // (STREAM_MATRICES * 2 * b * h * d * size))
        caches = [
            [torch.randn(b, h, tokens, d, dtype=torch_dtype, device=info.torch_device) for _ in "kv"]
            for _ in range(STREAM_MATRICES)
        ]
        reads = [lambda k=k, v=v: sdpa(q, k, v) for k, v in caches]
        moved = STREAM_MATRICES * 2 * b * h * tokens * d * size
        rate = _interleaved_rate(reads, moved, fixed_s, info, layer_ops, min_run_time)
        out.append((moved, min(ceiling, max(ceiling / 20, rate))))
    return tuple(out)


# The SDPA calls the local model's attention rates are measured on: 4 sequences of 4 heads of 32
# over 512 tokens, a prefill (causal) and a decode step (one query a head over the 512).
ATTENTION_CALL = (4, 4, 512, 32)


def _attention_efficiencies(
    info: DeviceInfo, torch_dtype: torch.dtype, gemm_rate: float, min_run_time: float
) -> tuple[float, float]:
    """(prefill, decode) SDPA FLOP rates over `gemm_rate` (the calibrated GEMMs'), FLOPs counted
    as `evaluators.hardware_serving` counts them: a CPU's flash kernel runs well below its GEMMs, and its
    decode kernel (one query a head) below that."""
    b, h, s, d = ATTENTION_CALL
    q, k, v = (torch.randn(b, h, s, d, dtype=torch_dtype, device=info.torch_device) for _ in "qkv")
    one = q[:, :, -1:].contiguous()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    prefill_s = _median_seconds(lambda: sdpa(q, k, v, is_causal=True), info, min_run_time)
    decode_s = _median_seconds(lambda: sdpa(one, k, v), info, min_run_time)
    prefill_flops = AttentionCall("sdpa.fwd", b, h, h, s, d, 1).causal_flops
    decode_flops = 4 * b * h * s * d  # one query a head, as `hardware_serving` counts a decode step's
    return prefill_flops / prefill_s / gemm_rate, decode_flops / decode_s / gemm_rate


def _reference_op_s(device: str, dtype: str) -> float:
    """Seconds per eager op: the reference shape's decode step over the ops it dispatches."""
    reference = measure_serve(
        REFERENCE, device, batch=1, context=16, dtype=dtype, min_run_time=2 * CALIBRATION_MIN_RUN_TIME
    )
    return reference.decode_time_s / reference.decode_ops


@functools.lru_cache(maxsize=8)
def _local_serve_model(device: str, dtype: str, threads: int, interleaved: bool = True) -> LocalServeModel:
    """The model with its streamed rates (`interleaved` or back to back) on the shared calibration."""
    calibrated, call_s, ceiling = _calibrated(device, dtype, threads)
    info = detect_device(device)
    torch_dtype = _check_dtype(info, dtype)
    seconds = CALIBRATION_MIN_RUN_TIME
    streams = _stream_bandwidths(info, torch_dtype, call_s, ceiling, seconds, interleaved=interleaved)
    caches = _cache_bandwidths(info, torch_dtype, ceiling, seconds) if interleaved else ()
    return dataclasses.replace(calibrated, stream_bandwidths=streams, cache_bandwidths=caches)


@functools.lru_cache(maxsize=8)
def _calibrated(device: str, dtype: str, threads: int) -> tuple[LocalServeModel, float, float]:
    """(the model without streamed rates, the calibrated seconds per GEMM call, the calibrated hot
    bandwidth): one calibration, whichever streamed rates are measured on it."""
    from archsearch.evaluators.hardware import GemmMeasurement, calibrate
    from archsearch.evaluators.profiler import time_gemm

    info = detect_device(device)
    torch_dtype = _check_dtype(info, dtype)
    seconds = CALIBRATION_MIN_RUN_TIME
    gemms = [
        GemmMeasurement(m, n, k, dtype, time_gemm(m, n, k, info, dtype, min_run_time=seconds))
        for m, n, k in CALIBRATION_GEMMS
    ]
    base = local_cpu(cores=info.threads)
    base = dataclasses.replace(base, device=dataclasses.replace(base.device, peak_tflops=((dtype, 0.05),)))
    fit = calibrate(base, gemms)
    op_s = _reference_op_s(device, dtype)
    fitted: Accelerator = dataclasses.replace(
        fit.model.device,
        launch_overhead_s=op_s,
        source=f"measured here: {len(gemms)} calibration GEMMs ({dtype}), eager op time",
    )
    rate = fitted.peak_flops(dtype) * fit.model.compute_efficiency
    prefill_eff, decode_eff = _attention_efficiencies(info, torch_dtype, rate, seconds)
    model = dataclasses.replace(
        fit.model, device=fitted, launch_overhead_s=op_s, attention_efficiency=prefill_eff,
        decode_attention_efficiency=decode_eff, other_head_dim_factor=1.0,  # measured at head_dim 32
    )  # fmt: skip
    elementwise = _elementwise_bandwidth(info, torch_dtype, 2 * seconds)
    calibrated = LocalServeModel(
        model=model, dtype=dtype, op_s=op_s, peak_flops=fitted.peak_flops(dtype),
        bandwidth=fitted.memory_bandwidth, elementwise_bandwidth=elementwise,
        calibration_error=fit.median_error,
    )  # fmt: skip
    return calibrated, fit.model.launch_s, fit.model.bandwidth


@contextlib.contextmanager
def brief_calibration() -> Iterator[None]:
    """Inside the block, the local serving model is measured briefly (`BRIEF_CALIBRATION`): for
    checking what the model and `profile --serve` report (smoke runs, tests), not how well it
    predicts. The process's measured models are dropped on entering and on leaving, so nothing
    outside the block reads a brief one."""
    saved = {name: globals()[name] for name in BRIEF_CALIBRATION}
    _local_serve_model.cache_clear()
    globals().update(BRIEF_CALIBRATION)
    try:
        yield
    finally:
        globals().update(saved)
        _local_serve_model.cache_clear()
