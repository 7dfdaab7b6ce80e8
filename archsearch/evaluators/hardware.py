"""Predicted kernel times of a training step on devices that are not here. Pure, no torch.

A tile-and-wave roofline (docs/explanations/hardware-costs.md; NVIDIA, "Matrix Multiplication
Background User's Guide", DU-09799-001, sections 2-3). A GEMM `(m x k) @ (k x n)` runs as
output tiles of `tile_m x tile_n`, one tile per streaming multiprocessor (SM) at a time:
1. Tile quantization: the kernel computes `ceil(m/tile_m) * ceil(n/tile_n)` whole tiles, so a
   dimension one past a tile edge pays for a whole, mostly empty, extra row of tiles.
2. Wave quantization: tiles run in waves of one per SM; `ceil(tiles / SMs)` waves each take as
   long as one tile, so a last wave that is nearly empty costs a full one.
3. Alignment: a dimension that is not a multiple of 16 bytes (8 elements in 16-bit types) falls
   back to slower kernels; one aligned to 16 bytes but not to 64 elements runs a little slower.
   This is separate from 1 and 2: k = 4095 and k = 4096 run the same tiles.
4. Roofline: a call takes `max(compute, memory) + launch`, memory being A, B and C moved once.
The GEMM library's heuristic is modelled as picking, among the catalogued tiles (and split-K when
one wave would leave SMs idle), the plan with the least predicted time. Attention calls are a
roofline on their causal FLOPs at a flash-kernel efficiency, memory-bound ops their bytes over the
achievable bandwidth, and a step is the sum of its kernels run back to back on one stream.

Everything published about a device lives in the catalogue (`evaluators.catalogue.ACCELERATORS`)
with its source; everything that is a modelling assumption (achievable fractions of peak,
alignment penalties) is a field of `DeviceModel`, where `calibrate` can fit it to measurements.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from archsearch.errors import ConfigError
from archsearch.evaluators.catalogue import ACCELERATORS, COMPUTE_DTYPES, FITTED, Accelerator
from archsearch.evaluators.step_kernels import (
    AttentionCall,
    KernelRow,
    MemoryOp,
    MemoryRow,
    ProfileReport,
    StepKernels,
    step_kernels,
)
from archsearch.space.config import ArchConfig


# --- the model ---
@dataclass(frozen=True)
class DeviceModel:
    """A catalogued (or calibrated) device plus the modelling assumptions `calibrate` can fit.

    Raises:
        ConfigError: an efficiency or factor is not positive, or a factor exceeds 1.
    """

    device: Accelerator
    # Achievable fractions of the published peaks: large aligned cuBLAS GEMMs reach ~75-85% of
    # dense peak, streaming kernels ~80-90% of DRAM bandwidth. Round defaults; calibrate().
    compute_efficiency: float = 0.8
    bandwidth_efficiency: float = 0.85
    launch_overhead_s: float | None = None  # None: the catalogued device's figure
    # Flash attention relative to a GEMM: FlashAttention-2 reaches 50-73% of A100 peak forward
    # and less backward (Dao 2023), against ~80% for GEMMs.
    attention_efficiency: float = 0.8
    # Alignment (assumed penalties; the guide shows the effect, its size varies by library and
    # shape): off the 16-byte alignment a fallback kernel runs at about half speed (at this
    # factor when aligned to one element only, see `_alignment_factor`); aligned to 16 bytes but
    # not to `well_aligned_elements` costs a little.
    misaligned_factor: float = 0.5
    coarse_aligned_factor: float = 0.9
    well_aligned_elements: int = 64
    # A tile reuses each loaded element tile_m*tile_n/(tile_m+tile_n) times per k step; a small
    # tile needs more operand bandwidth per FLOP. Its speed relative to an infinitely large tile is
    # reuse / (reuse + tile_reuse_half), normalised to the device's best tile.
    tile_reuse_half: float = 16.0
    max_split_k: int = 16  # split-K slices tried when one wave of output tiles leaves units idle
    fast_head_dims: tuple[int, ...] = (64, 128)  # flash kernels are tuned for these head sizes
    other_head_dim_factor: float = 0.85  # "mild" penalty for any other head_dim
    # What a real eager step adds to the kernels (`step_fit.fit_step_model` fits them
    # to measured steps, `catalogue.FITTED` holds the fits with the data they came from). The
    # defaults leave the bare kernel roofline:
    # - the backward flash kernel's efficiency, when it differs from the forward's;
    attention_backward_efficiency: float | None = None
    # - a decode step's attention (one query a head over the cache), when it differs from the
    #   flash kernel's (a CPU's decode kernel runs at a third of its prefill rate or less);
    decode_attention_efficiency: float | None = None
    # - flash kernels fill the device only for long sequences: efficiency * s / (s + half);
    attention_seq_half: float = 0.0
    # - elementwise ops over rows whose width is off the 16-byte alignment (vocab 50257) do not
    #   vectorise: their bytes move at this fraction of the bandwidth;
    misaligned_memory_factor: float = 1.0
    # - GPU time per kernel an eager PyTorch step launches beyond the roofline's kernels (gaps
    #   between kernels, the many small elementwise kernels the memory ops lump together);
    eager_kernel_s: float = 0.0
    # - host time per launch and per autograd node (Python, dispatcher, autograd's recording and
    #   its engine, the launch itself): a step lasts at least host ops * host_kernel_s
    #   (`counting.eager_host_ops`), so a small shape waits on the host, not the GPU.
    host_kernel_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("compute_efficiency", "bandwidth_efficiency", "attention_efficiency"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
                raise ConfigError(f"{name} must be a positive number, got {value!r}")
        for name in ("attention_backward_efficiency", "decode_attention_efficiency"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and 0 < value < math.inf):
                raise ConfigError(f"{name} must be a positive number, got {value!r}")
        if not (self.attention_seq_half >= 0 and self.eager_kernel_s >= 0 and self.host_kernel_s >= 0):
            raise ConfigError("attention_seq_half, eager_kernel_s and host_kernel_s must be >= 0")
        for name in (
            "misaligned_factor",
            "coarse_aligned_factor",
            "other_head_dim_factor",
            "misaligned_memory_factor",
        ):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ConfigError(f"{name} must be in (0, 1], got {value!r}")
        if self.launch_overhead_s is not None and not self.launch_overhead_s >= 0:
            raise ConfigError(f"launch_overhead_s must be >= 0, got {self.launch_overhead_s!r}")
        if self.well_aligned_elements <= 0 or self.max_split_k < 1 or self.tile_reuse_half < 0:
            raise ConfigError("well_aligned_elements > 0, max_split_k >= 1, tile_reuse_half >= 0 required")

    @property
    def launch_s(self) -> float:
        """The launch overhead in use: this model's, else the device's."""
        if self.launch_overhead_s is None:
            return self.device.launch_overhead_s
        return self.launch_overhead_s

    @property
    def bandwidth(self) -> float:
        """Achievable bytes/s."""
        return self.device.memory_bandwidth * self.bandwidth_efficiency


def device_model(name: str, fitted: bool = True, **assumptions: Any) -> DeviceModel:
    """The model of catalogued device `name`, with any `DeviceModel` field overridden.

    Args:
        fitted: start from the constants fitted to real steps on the device (`catalogue.FITTED`),
            where it has them; False: the bare roofline's round assumptions.

    Raises:
        UnknownNameError: `name` is not in ACCELERATORS (the message lists the valid names).
        ConfigError: an overridden assumption is out of range.
    """
    device = ACCELERATORS[name]
    base = dict(FITTED[name].fields) if fitted and name in FITTED else {}
    return DeviceModel(device=device, **{**base, **assumptions})


LOCAL_DEVICES = ("cpu", "cuda")  # measured here by the profiler (cuda:N too), not modelled


def check_device(device: str) -> bool:
    """Whether `device` is modelled (a catalogued GPU: True) or measured here (cpu, cuda, cuda:N:
    False).

    Raises:
        ConfigError: `device` is neither.
    """
    if device in ACCELERATORS:
        return True
    if device.split(":")[0] in LOCAL_DEVICES:
        return False
    raise ConfigError(
        f"unknown device {device!r}; measured: cpu, cuda, cuda:N; modelled: {', '.join(ACCELERATORS)}"
    )


def modelled_dtype(dtype: str) -> str:
    """`dtype` on a modelled GPU: "auto" is bf16, what training runs in on every catalogued one."""
    return "bf16" if dtype == "auto" else dtype


def modelled_profile(
    cfg: ArchConfig,
    device: str,
    batch: int,
    dtype: str,
    launches: int = 0,
    memory_ops: tuple[MemoryOp, ...] | None = None,
    host_ops: int | None = None,
) -> ProfileReport | None:
    """One training step of `cfg` on `batch` sequences, modelled on the catalogued GPU `device`;
    None when `device` is one to measure here instead (cpu, cuda, cuda:N: see `step_time.step_profile`).

    `dtype` "auto" is bf16 (`modelled_dtype`). `launches`: kernels the eager step launches
    (`counting.eager_kernel_count`), charged the device's fitted GPU gap each; `host_ops`: what its
    host does, launches and autograd nodes (`counting.eager_host_ops`; None: the launches alone),
    charged the fitted host time each; `memory_ops`: its memory-bound kernels
    (`counting.eager_memory_ops`; None: `step_kernels.step_kernels`'s estimate).

    Raises:
        ConfigError: `device` is neither catalogued nor local.
        UnknownNameError: the device has no peak for `dtype`.
    """
    if not check_device(device):
        return None
    dtype = modelled_dtype(dtype)
    kernels = step_kernels(cfg, batch, dtype, memory_ops)
    return predict_step(device_model(device), kernels, dtype, launches, host_ops)


def local_cpu(
    cores: int | None = None,
    gflops_per_core: float = 50.0,
    bandwidth_gbs: float = 20.0,
    tile: tuple[int, int] = (6, 16),
) -> DeviceModel:
    """A starting model of this machine's CPU, to be fitted with `calibrate`.

    The peak and bandwidth are nominal placeholders (about one AVX2 core: 2 FMA pipes x 8 fp32
    lanes x 2 FLOPs x ~1.5 GHz sustained); `calibrate` replaces them with effective values.

    Args:
        cores: parallel units; default the cores this process may run on.
        gflops_per_core: nominal fp32 GFLOP/s of one core.
        bandwidth_gbs: nominal memory bandwidth of the whole socket, GB/s.
        tile: the register micro-tile (rows, columns) of fp32 output one core computes at a
            time. The default is BLIS's Haswell/Zen sgemm kernel: six rows of two 8-lane AVX2
            vectors. Cores share out micro-tiles, so wave effects stay small on a CPU.

    Returns:
        A DeviceModel with efficiencies 1 (the fit goes into the peaks) and mild alignment
        penalties: BLAS libraries copy operands into aligned panels, so an odd size costs only
        edge micro-kernels.
    """
    units = cores if cores is not None else _available_cores()
    if units <= 0:
        raise ConfigError(f"cores must be positive, got {units}")
    device = Accelerator(
        name=f"local CPU ({platform.machine() or 'unknown'}, {units} cores)",
        units=units,
        peak_tflops=(("fp32", units * gflops_per_core / 1e3),),
        memory_bandwidth=bandwidth_gbs * 1e9,
        tiles=(tile,),
        # One 64-byte cache line (16 fp32 elements): panels are packed in whole lines.
        alignment_bytes=64,
        launch_overhead_s=1e-5,  # a PyTorch CPU op's dispatch cost, nominal
        source="nominal placeholders for the local CPU; fit with calibrate()",
    )
    return DeviceModel(
        device=device,
        compute_efficiency=1.0,
        bandwidth_efficiency=1.0,
        misaligned_factor=0.95,
        coarse_aligned_factor=1.0,
        tile_reuse_half=0.0,
    )


def _available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# --- GEMMs ---
@dataclass(frozen=True)
class GemmPlan:
    """The predicted execution of one GEMM call `(m x k) @ (k x n)`."""

    m: int
    n: int
    k: int
    dtype: str
    tile: tuple[int, int]  # (tile_m, tile_n) the library is predicted to pick
    split_k: int  # slices of k run in parallel (1: no split)
    tiles: int  # tiles launched: output tiles x split_k
    waves: int  # ceil(tiles / units)
    wave_efficiency: float  # tiles / (waves * units): 1 when the last wave is full
    alignment_factor: float  # 1, coarse_aligned_factor or misaligned_factor
    compute_s: float
    memory_s: float
    launch_s: float

    @property
    def time_s(self) -> float:
        """Seconds per call: the roofline plus the launch overhead."""
        return max(self.compute_s, self.memory_s) + self.launch_s

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def tflops(self) -> float:
        """Achieved TFLOP/s (useful FLOPs only)."""
        return self.flops / self.time_s / 1e12

    @property
    def tile_efficiency(self) -> float:
        """Useful fraction of the computed output area: m*n over the area of whole tiles."""
        tm, tn = self.tile
        return self.m * self.n / (math.ceil(self.m / tm) * tm * math.ceil(self.n / tn) * tn)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def _check_size(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _alignment_factor(model: DeviceModel, dims: Sequence[int], align: int) -> float:
    """Speed factor of the worst-aligned dimension: one fallback kernel, not one per dimension.

    Pass n and k only: m is free. Measured on an H100 (benchmarks/gpu_model_accuracy_h100_*.json):
    vocab 50257 or d_ff 2750 as n or k ran 2.5-5x slower, as m (the weight-gradient GEMM) at
    full speed, as the leading dimensions of row-major operands in cuBLAS are n and k.

    Off the alignment, kernels load narrower vectors: `misaligned_factor` is the speed of the
    worst case (a dimension aligned to one element: vocab 50257 ran its GEMMs at 0.2), and each
    doubling of the alignment takes an equal step back toward full speed (`misalignment`)."""
    exponent = max(misalignment(d, align) for d in dims)
    if exponent:
        return model.misaligned_factor**exponent
    if any(d % model.well_aligned_elements for d in dims):
        return model.coarse_aligned_factor
    return 1.0


def misalignment(size: int, align: int) -> float:
    """How far `size` is off an alignment of `align` elements (a power of two), from 0 (aligned)
    to 1 (aligned to one element): log2(align / largest power of two dividing both) / log2(align)."""
    if align <= 1 or size % align == 0:
        return 0.0
    return math.log2(align / math.gcd(size, align)) / math.log2(align)


def _tile_speeds(model: DeviceModel) -> dict[tuple[int, int], float]:
    """Each catalogued tile's speed relative to the device's best tile (operand reuse)."""

    def speed(tile: tuple[int, int]) -> float:
        reuse = tile[0] * tile[1] / (tile[0] + tile[1])
        return reuse / (reuse + model.tile_reuse_half)

    best = max(speed(t) for t in model.device.tiles)
    return {t: speed(t) / best for t in model.device.tiles}


def _gemm_options(model: DeviceModel, m: int, n: int, k: int, dtype: str) -> list[GemmPlan]:
    """Every (tile, split-K) plan the library could run for this call."""
    for name, value in (("m", m), ("n", n), ("k", k)):
        _check_size(name, value)
    device = model.device
    spec = COMPUTE_DTYPES[dtype]
    unit_rate = device.peak_flops(dtype) * model.compute_efficiency / device.units
    align = _alignment_factor(model, (n, k), device.alignment_elements(dtype))
    bandwidth = model.bandwidth
    operand_bytes = (m * k + k * n + m * n) * spec.bytes
    plans = []
    for tile, tile_speed in _tile_speeds(model).items():
        tm, tn = tile
        out_tiles = math.ceil(m / tm) * math.ceil(n / tn)
        # Split-K only when one wave of output tiles leaves units idle, as cuBLAS's heuristics
        # do; its fp32 partial sums are written and read back once more.
        splits = [1]
        if out_tiles < device.units:
            splits += [s for s in (2, 4, 8, 16, 32, 64) if s <= model.max_split_k]
        for split in splits:
            tiles = out_tiles * split
            waves = math.ceil(tiles / device.units)
            # One wave lasts as long as one tile's k-loop on one unit.
            tile_s = 2 * tm * tn * math.ceil(k / split) / (unit_rate * tile_speed * align)
            extra = 2 * split * m * n * 4 if split > 1 else 0
            plans.append(
                GemmPlan(
                    m=m, n=n, k=k, dtype=dtype, tile=tile, split_k=split, tiles=tiles, waves=waves,
                    wave_efficiency=tiles / (waves * device.units), alignment_factor=align,
                    compute_s=waves * tile_s, memory_s=(operand_bytes + extra) / bandwidth,
                    launch_s=model.launch_s,
                )
            )  # fmt: skip
    return plans


def plan_gemm(model: DeviceModel, m: int, n: int, k: int, dtype: str = "bf16") -> GemmPlan:
    """The fastest predicted plan for one call of `(m x k) @ (k x n)` in `dtype`.

    Ties go to the earlier (larger) catalogued tile, as larger tiles reuse operands more.

    Raises:
        ConfigError: m, n or k is not a positive integer.
        UnknownNameError: `dtype` is unknown or the device lacks it.
    """
    plans = _gemm_options(model, m, n, k, dtype)
    return min(plans, key=lambda p: max(p.compute_s, p.memory_s))


def predict_gemm(model: DeviceModel, m: int, n: int, k: int, dtype: str = "bf16") -> float:
    """Predicted seconds of one call of `(m x k) @ (k x n)` (see `plan_gemm`)."""
    return plan_gemm(model, m, n, k, dtype).time_s


# --- attention and memory-bound kernels ---
def predict_attention(model: DeviceModel, call: AttentionCall, dtype: str = "bf16") -> float:
    """Predicted seconds of all `call.count` calls of one causal SDPA shape (flash kernels).

    A roofline on the causal FLOPs and the bytes of q, k, v and o: forward reads q, k, v and
    writes o; backward reads q, k, v, o, do and writes dq, dk, dv.

    Raises:
        UnknownNameError: `dtype` is unknown or the device lacks it.
    """
    device = model.device
    size = COMPUTE_DTYPES[dtype].bytes
    factor = 1.0 if call.head_dim in model.fast_head_dims else model.other_head_dim_factor
    if call.head_dim % device.alignment_elements(dtype):
        factor *= model.misaligned_factor
    factor *= call.seq_len / (call.seq_len + model.attention_seq_half)
    efficiency = model.attention_efficiency
    if call.name == "sdpa.bwd" and model.attention_backward_efficiency is not None:
        efficiency = model.attention_backward_efficiency
    rate = device.peak_flops(dtype) * model.compute_efficiency * efficiency * factor
    q = call.batch * call.n_heads * call.seq_len * call.head_dim
    kv = call.batch * call.n_kv_heads * call.seq_len * call.head_dim
    tensors = 2 if call.name == "sdpa.fwd" else 4  # per q-sized and per kv-sized tensor
    per_call_bytes = tensors * (q + kv) * size
    per_call_flops = call.causal_flops / call.count
    roofline = max(per_call_flops / rate, per_call_bytes / model.bandwidth)
    return call.count * (roofline + model.launch_s)


def predict_memory_op(model: DeviceModel, op: MemoryOp, dtype: str = "bf16") -> float:
    """Predicted seconds of a memory-bound step: its bytes at achievable bandwidth, one launch;
    at `misaligned_memory_factor` of it when its rows are off the 16-byte alignment.

    `MemoryOp` records bytes but not calls, so one launch overhead is charged per op.
    """
    bandwidth = model.bandwidth
    if op.row and op.row % model.device.alignment_elements(dtype):
        bandwidth *= model.misaligned_memory_factor
    return op.bytes / bandwidth + model.launch_s


# --- a whole step ---
def predict_step(
    model: DeviceModel,
    kernels: StepKernels,
    compute_dtype: str | None = None,
    launches: int = 0,
    host_ops: int | None = None,
) -> ProfileReport:
    """Predict every kernel of one training step: the profiler's report, marked as modelled.

    Args:
        model: the device model.
        kernels: the step's inventory, from `step_kernels.step_kernels`.
        compute_dtype: math mode of GEMMs and attention; default the inventory's dtype (pass
            "tf32" for fp32 tensors with TF32 enabled).
        launches: kernels the eager step launches (`counting.eager_kernel_count`); the step is
            then `max(kernels + launches * eager_kernel_s, host_ops * host_kernel_s)` and the
            difference to the kernels its framework overhead (0: the kernels alone).
        host_ops: launches and autograd nodes the host handles (`counting.eager_host_ops`); None:
            `launches` (a call without autograd).

    Raises:
        UnknownNameError: the dtype is unknown or the device lacks it.
    """
    dtype = kernels.dtype if compute_dtype is None else compute_dtype
    rows = [
        KernelRow(g.name, "gemm", *g.shape, g.count, dtype, g.shape, g.flops // g.count,
                  predict_gemm(model, *g.shape, dtype))
        for g in kernels.gemms
    ]  # fmt: skip
    rows += [
        # Attention rows as the profiler writes them: batch * heads, seq_len, head_dim.
        KernelRow(a.name, a.name, a.batch * a.n_heads, a.seq_len, a.head_dim, a.count, dtype,
                  (a.batch, a.n_heads, a.n_kv_heads, a.seq_len, a.head_dim), a.causal_flops // a.count,
                  predict_attention(model, a, dtype) / a.count)
        for a in kernels.attention
    ]  # fmt: skip
    memory = tuple(
        MemoryRow(op.name, op.bytes, predict_memory_op(model, op, dtype)) for op in kernels.memory_ops
    )
    kernel_sum = sum(row.total_s for row in rows) + sum(row.time_s for row in memory)
    host_ops = launches if host_ops is None else host_ops
    gpu = kernel_sum + launches * model.eager_kernel_s
    overhead = max(gpu, host_ops * model.host_kernel_s) - kernel_sum
    device = model.device
    return ProfileReport(
        config=kernels.config,
        device={"name": device.name, "units": device.units, "fingerprint": f"model:{device.name}"},
        dtype=dtype,
        batch=kernels.batch,
        tokens=kernels.tokens,
        kernels=tuple(rows),
        memory_ops=memory,
        bandwidth_bytes_per_s=model.bandwidth,
        min_run_time=0.0,
        modelled=True,
        launches=launches,
        host_ops=host_ops,
        overhead_s=overhead,
    )


# --- calibration ---
@dataclass(frozen=True)
class GemmMeasurement:
    """One measured GEMM call: `(m x k) @ (k x n)` in `dtype` took `seconds` (median of repeats).

    Raises:
        ConfigError: a size is not a positive integer or seconds is not a positive number.
    """

    m: int
    n: int
    k: int
    dtype: str
    seconds: float

    def __post_init__(self) -> None:
        for name in ("m", "n", "k"):
            _check_size(name, getattr(self, name))
        if not (isinstance(self.seconds, int | float) and self.seconds > 0 and math.isfinite(self.seconds)):
            raise ConfigError(f"seconds must be a positive number, got {self.seconds!r}")


@dataclass(frozen=True)
class Calibration:
    """A fitted model and how well it fits its own measurements."""

    model: DeviceModel
    fitted: str  # "efficiency" (catalogued peaks kept) or "peaks" (effective peak and bandwidth)
    n_measurements: int
    median_error: float  # |predicted - measured| / measured over the fitting set
    worst_error: float


def prediction_errors(model: DeviceModel, measurements: Iterable[GemmMeasurement]) -> tuple[float, ...]:
    """Relative errors `|predicted - measured| / measured`, one per measurement, in order."""
    return tuple(abs(predict_gemm(model, x.m, x.n, x.k, x.dtype) / x.seconds - 1) for x in measurements)


def _is_catalogued(device: Accelerator) -> bool:
    return any(device == entry for _, entry in ACCELERATORS.items())


def _pareto_options(model: DeviceModel, x: GemmMeasurement) -> list[tuple[float, float]]:
    """(compute_s, memory_s) of the plans no other plan beats on both (the fit's choices)."""
    pairs = sorted({(p.compute_s, p.memory_s) for p in _gemm_options(model, x.m, x.n, x.k, x.dtype)})
    front: list[tuple[float, float]] = []
    for c, mem in pairs:
        if not front or mem < front[-1][1]:
            front.append((c, mem))
    return front


def calibrate(base: DeviceModel, measurements: Iterable[GemmMeasurement]) -> Calibration:
    """Fit compute rate, bandwidth and launch overhead to measured GEMM times.

    Least squares on log time, so a 10 us kernel counts as much as a 10 ms one. The model is
    `max(C / s_c, M / s_m) + L` per plan, with C and M the base model's compute and memory times,
    so three numbers are fitted: the scales s_c, s_m and the launch overhead L, by a coarse grid
    search then a shrinking local grid (no scipy). For a catalogued device the scales go into
    `compute_efficiency` and `bandwidth_efficiency` (the datasheet peaks stay); for any other
    device (the local CPU) into the device's peak FLOP/s (every dtype alike) and bandwidth. Tile,
    wave and alignment effects keep the base model's assumptions.

    Args:
        base: the starting model; its tiles, units and penalties shape the fit.
        measurements: at least 3, ideally spanning memory-, launch- and compute-bound shapes.

    Returns:
        The fitted model and its median and worst relative error on `measurements`.

    Raises:
        ConfigError: fewer than 3 measurements.
        UnknownNameError: a measurement's dtype is unknown or the device lacks it.
    """
    data = tuple(measurements)
    if len(data) < 3:
        raise ConfigError(f"calibration needs at least 3 measurements, got {len(data)}")
    fronts = [_pareto_options(base, x) for x in data]
    width = max(len(f) for f in fronts)
    # (n, options) arrays, padded with +inf so padding never wins the min over options.
    comp = np.full((len(data), width), np.inf)
    mem = np.full((len(data), width), np.inf)
    for i, front in enumerate(fronts):
        for j, (c, m) in enumerate(front):
            comp[i, j], mem[i, j] = c, m
    log_t = np.log([x.seconds for x in data])

    def losses(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Mean squared log error at every point of the grid a x b x c of (log s_c, log s_m,
        log10 L), flat in that order. The roofline depends on the two scales alone, so it is
        computed once per (a, b) pair rather than once per launch overhead as well (the coarse
        grid's 28 launch values made that 28 times the work)."""
        launch = 10.0**c
        # A whisper of ridge toward the base model settles directions the data cannot see
        # (e.g. bandwidth when every measurement is compute-bound).
        ridge = 1e-6 * (a[:, None] ** 2 + b[None, :] ** 2)
        rows = max(1, 2_000_000 // max(len(b) * comp.size, len(b) * len(c) * len(data)))  # bounded memory
        out = []
        for start in range(0, len(a), rows):
            roofline = np.maximum(
                comp[None, None] * np.exp(-a[start : start + rows])[:, None, None, None],
                mem[None, None] * np.exp(-b)[None, :, None, None],
            ).min(axis=3)
            pred = np.log(roofline[:, :, None, :] + launch[None, None, :, None])
            out.append(((pred - log_t) ** 2).mean(axis=3) + ridge[start : start + rows, :, None])
        return np.concatenate(out).reshape(-1)

    # Coarse grid: scales from 1e-3 to 1e3 of the base model, launch from 0.1 ns to 100 ms.
    axes = (np.linspace(-7.0, 7.0, 49), np.linspace(-7.0, 7.0, 49), np.linspace(-10.0, -1.0, 28))
    steps = [ax[1] - ax[0] for ax in axes]

    def argmin(grid_axes: Sequence[np.ndarray]) -> np.ndarray:
        index = np.unravel_index(int(np.argmin(losses(*grid_axes))), [len(ax) for ax in grid_axes])
        return np.array([ax[i] for ax, i in zip(grid_axes, index, strict=True)])

    best = argmin(axes)
    offsets = np.linspace(-1.0, 1.0, 7)
    for _ in range(40):  # each round shrinks the local grid; 0.6**40 leaves ~1e-9 of a step
        best = argmin([best[d] + offsets * steps[d] for d in range(3)])
        steps = [s * 0.6 for s in steps]
    s_c, s_m, launch = math.exp(best[0]), math.exp(best[1]), 10.0 ** best[2]
    if _is_catalogued(base.device):
        fitted = "efficiency"
        model = dataclasses.replace(
            base,
            compute_efficiency=base.compute_efficiency * s_c,
            bandwidth_efficiency=base.bandwidth_efficiency * s_m,
            launch_overhead_s=launch,
        )
    else:
        device = dataclasses.replace(
            base.device,
            peak_tflops=tuple((d, t * s_c) for d, t in base.device.peak_tflops),
            memory_bandwidth=base.device.memory_bandwidth * s_m,
            launch_overhead_s=launch,
            source=f"{base.device.source}; calibrated on {len(data)} GEMMs",
        )
        fitted = "peaks"
        model = dataclasses.replace(base, device=device, launch_overhead_s=launch)
    errors = prediction_errors(model, data)
    return Calibration(model, fitted, len(data), float(np.median(errors)), max(errors))
