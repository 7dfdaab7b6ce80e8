"""Time the kernels of one training step on the device at hand.

FLOPs alone do not rank shapes by speed: alignment, tile and wave quantization and the roofline
make the same FLOPs run at very different rates. So the profiler takes the step's kernel
inventory (`evaluators.step_kernels.step_kernels`: the GEMMs, the SDPA calls and the memory-bound
ops) and measures it here, on CPU or CUDA through the same code path:

- every distinct GEMM `(m x k) @ (k x n)` is timed as `torch.mm` with
  `torch.utils.benchmark.Timer.blocked_autorange` (an explicit warm-up call, the Timer's own
  block-size warm-up, device synchronisation around each block, repeats), taking the median;
- each SDPA call is timed forward (`sdpa.fwd`) and backward (`sdpa.bwd`, `torch.autograd.grad`
  on one retained forward graph, so only the backward kernels are in the measurement);
- memory-bound ops (norms, activations, optimizer, ...) are not run one by one: their bytes are
  divided by the device's copy bandwidth, measured once per device.

Measurements go through a `MeasurementCache` keyed by (device fingerprint, dtype, kernel kind,
shape), so a search never times the same kernel twice; identical shapes within one step (the
same `(m, n, k)` serving two projections) are timed once even without a cache.

Units: seconds per single call, FLOP/s as 1e12 (TFLOP/s), bytes. Inputs are seeded, so the same
tensors are timed every run; the times themselves are measurements and vary run to run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch.utils import benchmark

from archsearch.errors import quoted
from archsearch.evaluators.device import (
    DeviceError,
    DeviceInfo,
    available_memory_bytes,
    detect_device,
    is_memory_error,
)
from archsearch.evaluators.step_kernels import (
    AttentionCall,
    Gemm,
    KernelRow,
    MemoryRow,
    ProfileReport,
    step_kernels,
)
from archsearch.fileio import read_json, write_atomic
from archsearch.registry import Registry
from archsearch.space.config import ArchConfig
from archsearch.space.costs import DTYPE_BYTES

logger = logging.getLogger(__name__)

# The dtypes the profiler can time. fp8 is in DTYPE_BYTES for the cost model, but torch.mm has no
# fp8 kernel (scaled-mm is a different API), so it cannot be measured here.
TORCH_DTYPES: Registry[torch.dtype] = Registry("profiler dtype")
TORCH_DTYPES.register("fp32", torch.float32)
TORCH_DTYPES.register("bf16", torch.bfloat16)
TORCH_DTYPES.register("fp16", torch.float16)

DEFAULT_MIN_RUN_TIME = 0.1  # seconds of repeats per kernel: a whole small step profiles in seconds
MAX_MIN_RUN_TIME = 60.0  # per kernel: an unbounded 1e308 would run without end
# Fraction of the memory free at profile time one kernel may use: the rest is left to the
# process itself, the allocator's fragmentation and other workers on the same machine.
MEMORY_FRACTION = 0.5
# Copy buffer for the bandwidth measurement: well past the last-level cache (32 MiB per EPYC CCD,
# 50 MiB of L2 on an H100), so the copy streams from DRAM / HBM rather than from cache.
BANDWIDTH_BYTES = 1 << 27
PROGRESS_MIN_KERNELS = 5  # show a progress bar only when more kernels than this need timing
CACHE_FORMAT_VERSION = 1


class ProfilerError(DeviceError):
    """A profile cannot be taken: dtype unsupported on the device, a kernel too large for the
    device's memory, or an unreadable measurement cache. The message names what and why. A device
    that does not exist is a `DeviceError`, this class's base."""


# ------------------------------------------------------------------------------------------------
# The measurement cache
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MeasurementKey:
    """What identifies one measurement: the same key means the same kernel on the same device.

    Attributes:
        fingerprint: `DeviceInfo.fingerprint` of the device measured.
        dtype: "fp32", "bf16" or "fp16"; "bytes" for the bandwidth copy.
        kind: "gemm", "sdpa.fwd", "sdpa.bwd" or "copy".
        shape: gemm (m, n, k); sdpa (batch, n_heads, n_kv_heads, seq_len, head_dim); copy (bytes,).
    """

    fingerprint: str
    dtype: str
    kind: str
    shape: tuple[int, ...]

    def to_str(self) -> str:
        """A flat string form, e.g. "3f2a.../bf16/gemm/1024x1024x1024", for file and SQL keys."""
        return f"{self.fingerprint}/{self.dtype}/{self.kind}/{'x'.join(map(str, self.shape))}"


@runtime_checkable
class MeasurementCache(Protocol):
    """Where measured kernel times persist, so no kernel is timed twice on one device.

    Values are seconds per single call (the median of the repeats). Implementations: this
    module's `InMemoryCache` and `JsonFileCache`; the SQL storage implements the same two methods.
    """

    def get(self, key: MeasurementKey) -> float | None:
        """The stored seconds for `key`, or None if it was never measured."""
        ...

    def put(self, key: MeasurementKey, seconds: float, device: DeviceInfo) -> None:
        """Store `seconds` for `key`, measured on `device` (kept so a reader can tell where)."""
        ...


class InMemoryCache:
    """A `MeasurementCache` that lives as long as the process: one search, one device."""

    def __init__(self) -> None:
        self._seconds: dict[MeasurementKey, float] = {}

    def get(self, key: MeasurementKey) -> float | None:
        return self._seconds.get(key)

    def put(self, key: MeasurementKey, seconds: float, device: DeviceInfo) -> None:
        self._seconds[key] = seconds

    def __len__(self) -> int:
        return len(self._seconds)


class JsonFileCache:
    """A `MeasurementCache` in one JSON file, shared by runs on the same machine.

    The file is `{"version": 1, "entries": {key string: {"seconds": s, "device": {...}}}}`. A
    missing file is an empty cache. Each `put` re-reads the file, merges its entry and replaces the
    file atomically (temporary file in the same folder, then `os.replace`), so a crash never leaves
    a half-written file and sequential runs never lose each other's entries. Concurrent writers can
    still lose an update (last writer wins): many workers should share the SQL storage instead.

    Args:
        path: the JSON file; its folder is created on the first `put`.

    Raises:
        ProfilerError: the file exists but is not a cache this class wrote (bad JSON or layout).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._entries = self._load()

    def _load(self) -> dict[str, dict[str, Any]]:
        if not self.path.exists():  # a first run: the first `put` makes it
            return {}
        # read_text takes regular files only: opening a FIFO to read waited for a writer without end.
        data = read_json(
            self.path, "measurement cache", ProfilerError, "a cache", "; delete it to start afresh"
        )
        entries = data.get("entries") if isinstance(data, dict) else None
        valid = (
            isinstance(data, dict)
            and data.get("version") == CACHE_FORMAT_VERSION
            and isinstance(entries, dict)
            and all(
                isinstance(e, dict)
                and isinstance(e.get("seconds"), int | float)
                and math.isfinite(e["seconds"])
                and e["seconds"] > 0
                for e in entries.values()
            )
        )
        if not valid:
            raise ProfilerError(
                f"measurement cache {self.path} is not a version-{CACHE_FORMAT_VERSION} archsearch cache "
                "({'version': 1, 'entries': {key: {'seconds': positive number, ...}}}); "
                "delete it to start afresh"
            )
        return entries

    def get(self, key: MeasurementKey) -> float | None:
        entry = self._entries.get(key.to_str())
        return float(entry["seconds"]) if entry is not None else None

    def put(self, key: MeasurementKey, seconds: float, device: DeviceInfo) -> None:
        self._entries = {**self._load(), key.to_str(): {"seconds": seconds, "device": device.to_dict()}}
        payload = json.dumps({"version": CACHE_FORMAT_VERSION, "entries": self._entries}, indent=1)
        write_atomic(self.path, payload.encode("utf-8"))

    def __len__(self) -> int:
        return len(self._entries)


# ------------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------------


def _median_seconds(fn: Callable[[], object], info: DeviceInfo, min_run_time: float) -> float:
    """Median seconds of one `fn()` call on `info`'s device.

    One explicit call first (lazy initialisation, oneDNN / cuBLAS plan creation), then
    `blocked_autorange`, which warms up again while sizing its blocks, synchronises the
    accelerator around every block and repeats for at least `min_run_time` seconds. The Timer
    runs on the process's torch thread count: its default of one thread would time a CPU the
    step never runs on.
    """
    device_ctx = torch.cuda.device(info.index) if info.type == "cuda" else contextlib.nullcontext()
    with device_ctx:  # the Timer synchronises the *current* accelerator: make it this one
        fn()
        timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
        return float(timer.blocked_autorange(min_run_time=min_run_time).median)


def _generator(dev: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=dev).manual_seed(seed)


def _gemm_fn(
    m: int, n: int, k: int, dev: torch.device, dtype: torch.dtype, seed: int
) -> Callable[[], object]:
    # Row-major operands. The backward GEMMs really read a transposed operand; BLAS libraries take
    # that as a flag of the same kernel family, so the plain layout stands for all three passes.
    g = _generator(dev, seed)
    a = torch.randn(m, k, generator=g, device=dev, dtype=dtype)
    b = torch.randn(k, n, generator=g, device=dev, dtype=dtype)
    # A preallocated output keeps allocator behaviour (page faults of fresh CPU buffers) out of
    # the kernel time; the training step's caching allocator reuses its buffers too.
    c = torch.empty(m, n, device=dev, dtype=dtype)
    return lambda: torch.mm(a, b, out=c)


def _sdpa_fn(call: AttentionCall, dev: torch.device, dtype: torch.dtype, seed: int) -> Callable[[], object]:
    g = _generator(dev, seed)

    def make(heads: int) -> torch.Tensor:
        shape = (call.batch, heads, call.seq_len, call.head_dim)  # (B, H, T, D)
        return torch.randn(shape, generator=g, device=dev, dtype=dtype).requires_grad_()

    q, k, v = make(call.n_heads), make(call.n_kv_heads), make(call.n_kv_heads)
    gqa = call.n_kv_heads != call.n_heads

    def forward() -> torch.Tensor:
        # Grad enabled, as in training: the forward kernel then also saves what backward needs.
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    if call.name == "sdpa.fwd":
        return forward
    # Backward alone: one forward graph, retained, differentiated again on every call. Subtracting
    # a forward time from a forward+backward time would mix two noisy medians (and can go negative).
    out = forward()
    grad_out = torch.randn(out.shape, generator=g, device=dev, dtype=dtype)
    return lambda: torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)


def _copy_fn(nbytes: int, dev: torch.device) -> Callable[[], object]:
    src = torch.ones(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


@contextlib.contextmanager
def _memory_errors(what: str, info: DeviceInfo) -> Iterator[None]:
    """Turn an allocation failure while timing `what` into a ProfilerError naming it."""
    try:
        yield
    except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        if not is_memory_error(exc):
            raise
        if info.type == "cuda":
            torch.cuda.empty_cache()  # give the failed allocation's blocks back before going on
        raise ProfilerError(
            f"{what} does not fit in {info.type} memory ({info.name}): {str(exc).splitlines()[0]}; "
            "lower the batch size"
        ) from exc


def _check_dtype(info: DeviceInfo, dtype: str) -> torch.dtype:
    """The torch dtype for `dtype`, after one tiny GEMM and SDPA prove the device runs it.

    Raises:
        ProfilerError: `dtype` is not timeable here, or the device has no kernel for it.
    """
    if dtype not in TORCH_DTYPES:
        raise ProfilerError(
            f"dtype {dtype!r} cannot be profiled; profiled dtypes: {', '.join(TORCH_DTYPES.names())}"
        )
    torch_dtype = TORCH_DTYPES[dtype]
    dev = info.torch_device
    try:
        x = torch.ones(1, 1, 8, 8, device=dev, dtype=torch_dtype)
        torch.mm(x[0, 0], x[0, 0])
        F.scaled_dot_product_attention(x, x, x, is_causal=True)
    except (RuntimeError, NotImplementedError) as exc:
        raise ProfilerError(
            f"dtype {dtype!r} is not supported on {info.type} ({info.name}): {str(exc).splitlines()[0]}"
        ) from exc
    return torch_dtype


# ------------------------------------------------------------------------------------------------
# Public timing functions
# ------------------------------------------------------------------------------------------------


def time_gemm(
    m: int,
    n: int,
    k: int,
    device: str | DeviceInfo = "cpu",
    dtype: str = "bf16",
    min_run_time: float = DEFAULT_MIN_RUN_TIME,
    seed: int = 0,
) -> float:
    """Median seconds of one `(m x k) @ (k x n)` `torch.mm` on `device`; uncached.

    Raises:
        ProfilerError: bad device or dtype, or the operands do not fit in memory.
    """
    info = device if isinstance(device, DeviceInfo) else detect_device(device)
    torch_dtype = _check_dtype(info, dtype)
    with _memory_errors(f"gemm {m}x{n}x{k} ({dtype})", info):
        return _median_seconds(_gemm_fn(m, n, k, info.torch_device, torch_dtype, seed), info, min_run_time)


# ------------------------------------------------------------------------------------------------
# Precision and the matmul peak (the MFU denominator)
# ------------------------------------------------------------------------------------------------

AUTO = "auto"  # a precision (or profile dtype) resolved by `resolve_precision`: what training runs
# The peak GEMM: square, big enough that the BLAS library reaches its best rate (blocking,
# threading and packing amortised), small enough to take well under a second per call. 8192 on a
# GPU (1.1 TFLOP a call, ms on an H100); 512 on a CPU (0.27 GFLOP): on 1 and 2 AVX512 cores its
# fp32 rate matched or beat 1024's (whose operands no longer fit the caches), and a bf16 call,
# emulated where the CPU lacks AMX, takes about 0.4 s against 1024's 3.4 s.
PEAK_SIZE = {"cuda": 8192, "cpu": 512}
PEAK_REPEATS = 3  # independent rounds of timing blocks; the best block of all of them wins
PEAK_MIN_RUN_TIME = 0.2  # seconds per round
PEAK_KIND = "peak"  # the MeasurementKey kind of a peak: a best-of time, not a median


# The one switch over the CPU's bf16 support, read by `cpu_bf16_override` alone: "native" makes
# archsearch treat any CPU as running bf16 natively (and "auto" train in it), "none" as lacking it,
# unset or "detect" asks oneDNN. It lets both precision paths run on any host (the test suite runs
# each under both), and lets a user pin what a search on a mixed fleet of CPUs trains in.
CPU_BF16_ENV = "ARCHSEARCH_CPU_BF16"
CPU_BF16_CHOICES = ("detect", "native", "none")


def cpu_bf16_override() -> bool | None:
    """What `ARCHSEARCH_CPU_BF16` says of the CPU's bf16: True (native), False (none) or None
    (unset or "detect": ask the hardware). Another value is a `DeviceError` naming the choices."""
    value = os.environ.get(CPU_BF16_ENV, "detect").strip().lower() or "detect"
    if value not in CPU_BF16_CHOICES:
        raise DeviceError(f"{CPU_BF16_ENV}={quoted(value)} is not one of {', '.join(CPU_BF16_CHOICES)}")
    return {"native": True, "none": False}.get(value)


def native_bf16(device: DeviceInfo) -> bool:
    """Whether `device` runs bf16 matmuls natively rather than by emulation through fp32.

    CUDA: `torch.cuda.is_bf16_supported()`. CPU: `ARCHSEARCH_CPU_BF16` where it is set
    (`cpu_bf16_override`), else oneDNN's bf16 support check (AVX512-BF16, AMX or AVX512 cores); an
    AVX2-only CPU converts every bf16 operand and runs far below its fp32 rate, so bf16 there is
    never a default.
    """
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    override = cpu_bf16_override()
    if override is not None:
        return override
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve_precision(device: DeviceInfo, requested: str, cache: MeasurementCache | None = None) -> str:
    """The precision training runs in, and so the one its kernels are profiled and its MFU taken in.

    "auto": bf16 on a CUDA device that supports it, else fp32. On CPU, bf16 only with native
    support (`native_bf16`) and only where a matmul measures faster in bf16 than in fp32 (about 4x
    on AMX machines; native but slow elsewhere); `ARCHSEARCH_CPU_BF16=native` skips that
    measurement and chooses bf16, `=none` chooses fp32. Any other value is returned as asked: an
    explicit request is honoured, even for emulated bf16.
    """
    if requested != AUTO:
        return requested
    if device.type == "cuda":
        return "bf16" if native_bf16(device) else "fp32"
    if not native_bf16(device):
        return "fp32"
    if cpu_bf16_override():
        return "bf16"
    bf16, fp32 = (peak_matmul_flops(device, p, cache, size=512) for p in ("bf16", "fp32"))
    return "bf16" if bf16 > fp32 else "fp32"


def _best_seconds(fn: Callable[[], object], info: DeviceInfo, min_run_time: float, repeats: int) -> float:
    """The fastest timing block of `repeats` rounds of `blocked_autorange`: seconds per call.

    A peak is a maximum rate, so the best block, not the median, estimates it: on a shared machine
    every disturbance (another process, a frequency dip) only ever makes a block slower.
    """
    device_ctx = torch.cuda.device(info.index) if info.type == "cuda" else contextlib.nullcontext()
    best = math.inf
    with device_ctx:
        fn()
        for _ in range(repeats):
            timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
            best = min(best, min(timer.blocked_autorange(min_run_time=min_run_time).times))
    return float(best)


# Per process, for callers without a cache: every run in one process divides by the same peak.
_PEAKS = InMemoryCache()


def peak_matmul_flops(
    device: DeviceInfo,
    precision: str,
    cache: MeasurementCache | None = None,
    *,
    size: int | None = None,
    repeats: int = PEAK_REPEATS,
    min_run_time: float = PEAK_MIN_RUN_TIME,
) -> float:
    """Measured FLOP/s of a large square `torch.mm` in `precision`: the MFU denominator.

    The best block of `repeats` rounds (see `_best_seconds`), cached under
    (fingerprint, precision, "peak", (n, n, n)): in `cache` when given (the trial database's kernel
    table through `storage.KernelCache`, so all trials and studies on a device share one peak),
    else per process.

    Raises:
        ProfilerError: bad dtype, or the operands do not fit in memory.
    """
    n = size or PEAK_SIZE[device.type]
    store = cache if cache is not None else _PEAKS
    key = MeasurementKey(device.fingerprint, precision, PEAK_KIND, (n, n, n))
    seconds = store.get(key)
    if seconds is None:
        torch_dtype = _check_dtype(device, precision)
        with _memory_errors(f"peak gemm {n}x{n}x{n} ({precision})", device):
            fn = _gemm_fn(n, n, n, device.torch_device, torch_dtype, seed=0)
            seconds = _best_seconds(fn, device, min_run_time, repeats)
        store.put(key, seconds, device)
        logger.info("matmul peak on %s, %s: %.3g TFLOP/s", device.name, precision, 2 * n**3 / seconds / 1e12)
    return 2 * n**3 / seconds


def model_flops_utilisation(achieved: float, peak: float) -> float:
    """achieved / peak, never above 1.

    Above 1 means the peak was measured low (typically while another worker loaded the same
    cores) or the cost model counts FLOPs the step does not run. We clamp and warn rather than
    re-measure: the peak is stored first-measurement-wins in the shared kernel table, like every
    kernel time, so all trials on a device divide by the same number and their MFUs stay
    comparable; re-measuring mid-study would change the yardstick between trials.
    """
    if achieved > peak:
        logger.warning(
            "achieved %.3g FLOP/s is above the measured matmul peak %.3g FLOP/s (ratio %.3f): MFU "
            "clamped to 1; the stored peak was probably measured under load",
            achieved,
            peak,
            achieved / peak,
        )
        return 1.0
    return achieved / peak


def measure_bandwidth(
    device: str | DeviceInfo = "cpu",
    cache: MeasurementCache | None = None,
    min_run_time: float = DEFAULT_MIN_RUN_TIME,
    nbytes: int = BANDWIDTH_BYTES,
) -> float:
    """Achieved memory bandwidth in bytes per second: a copy of `nbytes` reads and writes each byte.

    Cached under (fingerprint, "bytes", "copy", (nbytes,)), so it is measured once per device.

    Raises:
        ProfilerError: bad device, or the two buffers do not fit in memory.
    """
    info = device if isinstance(device, DeviceInfo) else detect_device(device)
    key = MeasurementKey(info.fingerprint, "bytes", "copy", (nbytes,))
    seconds = cache.get(key) if cache is not None else None
    if seconds is None:
        with _memory_errors(f"bandwidth copy of {nbytes} bytes", info):
            seconds = _median_seconds(_copy_fn(nbytes, info.torch_device), info, min_run_time)
        if cache is not None:
            cache.put(key, seconds, info)
    return 2 * nbytes / seconds


# ------------------------------------------------------------------------------------------------
# The step profile
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Job:
    """One kernel to measure: its row's facts, its cache key and what it allocates."""

    name: str
    kind: str
    m: int
    n: int
    k: int
    count: int
    shape: tuple[int, ...]
    flops: int  # one call
    key: MeasurementKey
    bytes_needed: int  # estimated peak bytes of its tensors
    make_fn: Callable[[], Callable[[], object]]

    @property
    def label(self) -> str:
        return f"{self.name} ({self.kind} {'x'.join(map(str, self.shape))})"


def _gemm_job(g: Gemm, info: DeviceInfo, dtype: str, torch_dtype: torch.dtype, seed: int) -> _Job:
    size = DTYPE_BYTES[dtype]
    return _Job(
        name=g.name,
        kind="gemm",
        m=g.m,
        n=g.n,
        k=g.k,
        count=g.count,
        shape=g.shape,
        flops=g.flops // g.count,
        key=MeasurementKey(info.fingerprint, dtype, "gemm", g.shape),
        bytes_needed=(g.m * g.k + g.k * g.n + g.m * g.n) * size,  # a, b and c
        make_fn=lambda: _gemm_fn(g.m, g.n, g.k, info.torch_device, torch_dtype, seed),
    )


def _sdpa_job(a: AttentionCall, info: DeviceInfo, dtype: str, torch_dtype: torch.dtype, seed: int) -> _Job:
    shape = (a.batch, a.n_heads, a.n_kv_heads, a.seq_len, a.head_dim)
    # q, k, v, out (backward adds grad_out, dq, dk, dv), counting k and v at n_heads because GQA
    # kernels may expand them; flash-style kernels never hold the seq_len^2 score matrix.
    per_tensor = a.batch * a.n_heads * a.seq_len * a.head_dim * DTYPE_BYTES[dtype]
    tensors = 4 if a.name == "sdpa.fwd" else 8
    return _Job(
        name=a.name,
        kind=a.name,
        m=a.batch * a.n_heads,
        n=a.seq_len,
        k=a.head_dim,
        count=a.count,
        shape=shape,
        flops=a.causal_flops // a.count,
        key=MeasurementKey(info.fingerprint, dtype, a.name, shape),
        bytes_needed=tensors * per_tensor,
        make_fn=lambda: _sdpa_fn(a, info.torch_device, torch_dtype, seed),
    )


def profile_step(
    cfg: ArchConfig,
    batch: int,
    device: str = "cpu",
    dtype: str = AUTO,
    cache: MeasurementCache | None = None,
    min_run_time: float = DEFAULT_MIN_RUN_TIME,
    *,
    max_bytes: int | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    seed: int = 0,
) -> ProfileReport:
    """Measure one training step of `cfg` on `batch` sequences, kernel by kernel, on `device`.

    Every distinct kernel is timed once: shapes found in `cache` are not timed, shapes repeated
    within the step are timed once, and new measurements are put into `cache`. All kernels are
    checked against the memory limit before any is timed, so an oversized shape fails fast.

    Args:
        cfg: the architecture.
        batch: sequences per step (micro-batch); the step runs batch * cfg.seq_len tokens.
        device: "cpu", "cuda" or "cuda:N".
        dtype: "fp32", "bf16" or "fp16", for GEMMs, attention and the memory-op byte counts;
            "auto": the precision training runs in here (`resolve_precision`), so a CPU without
            native bf16 times fp32 kernels, never emulated bf16, unless bf16 is asked for.
        cache: where measurements persist across calls; None keeps them for this call only.
        min_run_time: seconds of repeats per kernel (median taken); more is steadier and slower.
        max_bytes: refuse a kernel whose tensors would need more bytes than this; default
            `MEMORY_FRACTION` of the memory free now (no limit where that is unknown).
        progress: called with (kernels timed, kernels to time, the one being timed) before each
            timing and at the end, when more than `PROGRESS_MIN_KERNELS` need timing; the CLI
            draws it as a bar.
        seed: seeds the random inputs, so each run times the same tensors.

    Returns:
        The measured `ProfileReport` (`modelled=False`); times in seconds.

    Raises:
        ProfilerError: bad device or dtype, a kernel above the memory limit or failing to allocate
            (the message names the kernel), a non-positive `min_run_time`.
        ValueError: `batch` is not positive (from `step_kernels.step_kernels`).
    """
    if not (0 < min_run_time <= MAX_MIN_RUN_TIME):  # NaN fails both
        raise ProfilerError(
            f"min_run_time must be a positive number of seconds, at most {MAX_MIN_RUN_TIME:g} per kernel, "
            f"got {min_run_time}"
        )
    info = detect_device(device)
    cache = cache if cache is not None else InMemoryCache()
    dtype = resolve_precision(info, dtype, cache)
    torch_dtype = _check_dtype(info, dtype)
    step = step_kernels(cfg, batch, dtype)

    jobs = [_gemm_job(g, info, dtype, torch_dtype, seed) for g in step.gemms]
    jobs += [_sdpa_job(a, info, dtype, torch_dtype, seed) for a in step.attention]

    seconds: dict[MeasurementKey, float] = {}
    pending: dict[MeasurementKey, _Job] = {}  # first job of each key not cached, in step order
    for job in jobs:
        if job.key in seconds or job.key in pending:
            continue  # identical shape earlier in this step: one measurement serves both
        cached = cache.get(job.key)
        if cached is not None:
            seconds[job.key] = cached
        else:
            pending[job.key] = job

    bandwidth_key = MeasurementKey(info.fingerprint, "bytes", "copy", (BANDWIDTH_BYTES,))
    bandwidth_cached = cache.get(bandwidth_key) is not None
    _check_memory(pending.values(), bandwidth_cached, info, max_bytes)

    n_timings = len(pending) + (0 if bandwidth_cached else 1)
    logger.info(
        "profiling %s on %s (%s): %d kernels, %d distinct shapes, %d of them cached",
        dtype,
        info.name,
        info.fingerprint,
        len(jobs),
        len(seconds) + len(pending),
        len(seconds),
    )
    report = progress if progress is not None and n_timings > PROGRESS_MIN_KERNELS else None
    for done, (key, job) in enumerate(pending.items()):
        if report is not None:
            report(done, n_timings, job.label)
        with _memory_errors(f"kernel {job.label}, {dtype}", info):
            seconds[key] = _median_seconds(job.make_fn(), info, min_run_time)
        cache.put(key, seconds[key], info)
        logger.debug("%s: %.3e s", job.label, seconds[key])
    if report is not None:
        report(len(pending), n_timings, "memory bandwidth")
    bandwidth = measure_bandwidth(info, cache, min_run_time, nbytes=bandwidth_key.shape[0])
    if report is not None:
        report(n_timings, n_timings, "done")

    rows = tuple(
        KernelRow(
            name=j.name,
            kind=j.kind,
            m=j.m,
            n=j.n,
            k=j.k,
            count=j.count,
            dtype=dtype,
            shape=j.shape,
            flops=j.flops,
            time_s=seconds[j.key],
        )
        for j in jobs
    )
    memory_rows = tuple(MemoryRow(op.name, op.bytes, op.bytes / bandwidth) for op in step.memory_ops)
    return ProfileReport(
        config=cfg,
        device=info.to_dict(),
        dtype=dtype,
        batch=batch,
        tokens=step.tokens,
        kernels=rows,
        memory_ops=memory_rows,
        bandwidth_bytes_per_s=bandwidth,
        min_run_time=min_run_time,
    )


def _check_memory(
    jobs: Iterable[_Job], bandwidth_cached: bool, info: DeviceInfo, max_bytes: int | None
) -> None:
    """Refuse, before allocating anything, a kernel whose tensors would exceed the memory limit.

    Raises:
        ProfilerError: naming the first kernel over the limit, its bytes and the limit.
    """
    limit = max_bytes
    if limit is None:
        free = available_memory_bytes(info)
        if free is None:
            logger.warning("free memory on %s unknown: kernel sizes are not checked", info.name)
            return
        limit = int(free * MEMORY_FRACTION)
    needs = [(job.label, job.bytes_needed) for job in jobs]
    if not bandwidth_cached:
        needs.append((f"bandwidth copy of {BANDWIDTH_BYTES} bytes", 2 * BANDWIDTH_BYTES))
    for label, nbytes in needs:
        if nbytes > limit:
            raise ProfilerError(
                f"kernel {label} needs about {_human_bytes(nbytes)} of {info.type} memory, above the limit "
                f"of {_human_bytes(limit)}; lower the batch size or raise max_bytes"
            )


def _human_bytes(nbytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if nbytes < 1024:
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"
