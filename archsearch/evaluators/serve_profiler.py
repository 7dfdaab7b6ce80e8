"""Measured serving time on the device at hand: prefill and one decode step of the proxy model.

The proxy (`evaluators.model.ProxyLM`, random weights: time does not depend on their values)
prefills `batch` prompts of `context` tokens into a preallocated `KVCache`, then decodes one token
per sequence over a cache of `context` tokens. Each is timed as the profiler times kernels: one
call first, then `torch.utils.benchmark`'s blocked autorange for `min_run_time` seconds, median
(`profiler._median_seconds`); the cache is rewound before each call, so every call does the same
work on the same memory.

Beside it, the local device model's prediction (`local_serve_model`): `evaluators.serving` on
this CPU's model calibrated on a fixed set of GEMMs, with the memory-bound ops at the measured
rate of a gated activation and each eager op charged the seconds per op of a fixed reference
shape whose decode step is all overhead, times the ops this shape's calls really dispatch
(counted with `model._KernelCounter`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import torch

from archsearch.evaluators.catalogue import Accelerator
from archsearch.evaluators.device import DeviceInfo, detect_device
from archsearch.evaluators.hardware import DeviceModel, local_cpu
from archsearch.evaluators.model import KVCache, ProxyLM, _KernelCounter
from archsearch.evaluators.profiler import (
    AUTO,
    DEFAULT_MIN_RUN_TIME,
    _check_dtype,
    _median_seconds,
    resolve_precision,
)
from archsearch.evaluators.serving import ServeTime, predict_decode, predict_prefill
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


def _count_ops(fn: Any) -> int:
    counter = _KernelCounter()
    with counter:
        fn()
    return counter.kernels


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
    return MeasuredServe(
        device=info.to_dict(), dtype=precision, batch=batch, context=context, prefill_time_s=prefill_s,
        decode_time_s=decode_s, prefill_ops=_count_ops(prefill), decode_ops=_count_ops(decode),
        decode_graph_time_s=graph_s, graph_error=graph_error, decode_parts=decode_parts,
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

    def predict(self, cfg: ArchConfig, measured: MeasuredServe) -> tuple[ServeTime, ServeTime]:
        """(prefill, decode) of `measured`'s calls, predicted with the ops they dispatched."""
        b, c, d = measured.batch, measured.context, self.dtype
        kw = dict(kernel_s=self.op_s, memory_op_bandwidth=self.elementwise_bandwidth)
        prefill = predict_prefill(self.model, cfg, b, c, d, d, kernels=measured.prefill_ops, **kw)
        decode = predict_decode(self.model, cfg, b, c, d, d, kernels=measured.decode_ops, **kw)
        return prefill, decode

    def with_op_time_now(self, device: str = "cpu") -> LocalServeModel:
        """This model with the seconds per eager op measured again on the reference shape: on a
        shared machine the host's speed drifts with the load, and an op's cost with it."""
        op_s = _reference_op_s(device, self.dtype)
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
        }


def local_serve_model(device: str = "cpu", dtype: str = "fp32") -> LocalServeModel:
    """This CPU's serving model in `dtype` (a storage dtype): `hardware.local_cpu` calibrated on
    the fixed `CALIBRATION_GEMMS` (`hardware.calibrate`: effective peak, bandwidth), the bytes per
    second of a gated activation for the memory-bound ops, and seconds per eager op from the
    reference shape's decode step. Nothing is fitted to the shape predicted. Measured once per
    process and torch thread count.

    Raises:
        ConfigError: `device` is not a CPU (a local GPU is measured, not yet modelled).
        DeviceError, ProfilerError: as `measure_serve`.
    """
    from archsearch.errors import ConfigError

    if detect_device(device).type != "cpu":
        raise ConfigError(f"the local serving model is a CPU's; {device!r} is measured without one")
    return _local_serve_model(device, dtype, torch.get_num_threads())


def _elementwise_bandwidth(info: DeviceInfo, torch_dtype: torch.dtype, min_run_time: float) -> float:
    """Bytes per second `silu(a) * b` moves: a and b read, the temporary written and read, the
    product written."""
    a, b = (torch.randn(ELEMENTWISE_ELEMENTS, dtype=torch_dtype, device=info.torch_device) for _ in "ab")
    seconds = _median_seconds(lambda: torch.nn.functional.silu(a) * b, info, min_run_time)
    return 5 * ELEMENTWISE_ELEMENTS * a.element_size() / seconds


def _reference_op_s(device: str, dtype: str) -> float:
    """Seconds per eager op: the reference shape's decode step over the ops it dispatches."""
    reference = measure_serve(REFERENCE, device, batch=1, context=16, dtype=dtype)
    return reference.decode_time_s / reference.decode_ops


@functools.lru_cache(maxsize=8)
def _local_serve_model(device: str, dtype: str, threads: int) -> LocalServeModel:
    from archsearch.evaluators.hardware import GemmMeasurement, calibrate
    from archsearch.evaluators.profiler import time_gemm

    info = detect_device(device)
    torch_dtype = _check_dtype(info, dtype)
    gemms = [
        GemmMeasurement(m, n, k, dtype, time_gemm(m, n, k, info, dtype, min_run_time=0.05))
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
    model = dataclasses.replace(fit.model, device=fitted, launch_overhead_s=op_s)
    elementwise = _elementwise_bandwidth(info, torch_dtype, 0.1)
    return LocalServeModel(
        model=model, dtype=dtype, op_s=op_s, peak_flops=fitted.peak_flops(dtype),
        bandwidth=fitted.memory_bandwidth, elementwise_bandwidth=elementwise,
        calibration_error=fit.median_error,
    )  # fmt: skip
