"""Measured serving time on the device at hand: prefill and one decode step of the proxy model.

The proxy (`evaluators.model.ProxyLM`, random weights: time does not depend on their values)
prefills `batch` prompts of `context` tokens into a preallocated `KVCache`, then decodes one token
per sequence over a cache of `context` tokens. Each is timed as the profiler times kernels: one
call first, then `torch.utils.benchmark`'s blocked autorange for `min_run_time` seconds, median
(`profiler._median_seconds`); the cache is rewound before each call, so every call does the same
work on the same memory.

Beside it, the local device model's prediction (`local_serve_model`): `evaluators.serving` on
this CPU's measured peak FLOP/s and copy bandwidth, with each eager op charged the seconds per op
of a fixed reference shape whose decode step is all overhead, times the ops this shape's calls
really dispatch (counted with `model._KernelCounter`).
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
    measure_bandwidth,
    peak_matmul_flops,
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
    """

    device: dict[str, Any]
    dtype: str
    batch: int
    context: int
    prefill_time_s: float
    decode_time_s: float
    prefill_ops: int
    decode_ops: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _model(cfg: ArchConfig, context: int, info: DeviceInfo, torch_dtype: torch.dtype, seed: int) -> ProxyLM:
    """The proxy with room for `context + 1` positions (a longer learned table, rope angles)."""
    torch.manual_seed(seed)
    room = dataclasses.replace(cfg, seq_len=max(cfg.seq_len, context + 1))
    return ProxyLM(room).to(device=info.torch_device, dtype=torch_dtype).eval()


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
) -> MeasuredServe:
    """Time prefill and one decode step of `cfg` on `device` (see the module docstring).

    Args:
        dtype: "fp32", "bf16", "fp16", or "auto": what training runs in there
            (`profiler.resolve_precision`).

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
    return MeasuredServe(
        device=info.to_dict(), dtype=precision, batch=batch, context=context, prefill_time_s=prefill_s,
        decode_time_s=decode_s, prefill_ops=_count_ops(prefill), decode_ops=_count_ops(decode),
    )  # fmt: skip


@dataclass(frozen=True)
class LocalServeModel:
    """The device model of this machine for serving, and what it was measured from."""

    model: DeviceModel
    dtype: str
    op_s: float  # seconds per eager op: the reference shape's decode step over its ops
    peak_flops: float  # measured matmul FLOP/s in `dtype`
    bandwidth: float  # measured copy bandwidth, bytes/s

    def predict(self, cfg: ArchConfig, measured: MeasuredServe) -> tuple[ServeTime, ServeTime]:
        """(prefill, decode) of `measured`'s calls, predicted with the ops they dispatched."""
        b, c, d = measured.batch, measured.context, self.dtype
        prefill = predict_prefill(self.model, cfg, b, c, d, d, self.op_s, measured.prefill_ops)
        decode = predict_decode(self.model, cfg, b, c, d, d, self.op_s, measured.decode_ops)
        return prefill, decode

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.model.device.name,
            "dtype": self.dtype,
            "op_s": self.op_s,
            "peak_flops": self.peak_flops,
            "bandwidth_bytes_per_s": self.bandwidth,
        }


def local_serve_model(device: str = "cpu", dtype: str = "fp32") -> LocalServeModel:
    """This CPU's serving model in `dtype` (a storage dtype): peak and bandwidth measured
    (`profiler.peak_matmul_flops`, `measure_bandwidth`), seconds per op from the reference shape.
    Measured once per process and torch thread count.

    Raises:
        ConfigError: `device` is not a CPU (a local GPU is measured, not yet modelled).
        DeviceError, ProfilerError: as `measure_serve`.
    """
    from archsearch.errors import ConfigError

    if detect_device(device).type != "cpu":
        raise ConfigError(f"the local serving model is a CPU's; {device!r} is measured without one")
    return _local_serve_model(device, dtype, torch.get_num_threads())


@functools.lru_cache(maxsize=8)
def _local_serve_model(device: str, dtype: str, threads: int) -> LocalServeModel:
    info = detect_device(device)
    peak = peak_matmul_flops(info, dtype, size=512)
    bandwidth = measure_bandwidth(info)
    reference = measure_serve(REFERENCE, device, batch=1, context=16, dtype=dtype)
    op_s = reference.decode_time_s / reference.decode_ops
    base = local_cpu(cores=info.threads)
    accelerator: Accelerator = dataclasses.replace(
        base.device,
        peak_tflops=((dtype, peak / 1e12),),
        memory_bandwidth=bandwidth,
        launch_overhead_s=op_s,
        source=f"measured here: {dtype} matmul peak, copy bandwidth, eager op time",
    )
    return LocalServeModel(dataclasses.replace(base, device=accelerator), dtype, op_s, peak, bandwidth)
