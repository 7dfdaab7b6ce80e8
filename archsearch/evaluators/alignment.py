"""Which widths of a shape suit a device's tiles, waves and alignment, and nearby sizes that do better.

`alignment_report` reads the device model of `evaluators.hardware` GEMM by GEMM: for each width a
shape's GEMMs see, it says whether the width is aligned, leaves no partial tile and fills its last
wave, and predicts what nearby sizes (multiples of 64 and 128, wave-filling sizes) would gain.
Pure, no torch. Background: docs/explanations/hardware-costs.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from archsearch.errors import UnknownNameError
from archsearch.evaluators.catalogue import COMPUTE_DTYPES
from archsearch.evaluators.hardware import DeviceModel, plan_gemm, predict_gemm, predict_step
from archsearch.evaluators.step_kernels import Gemm, GemmWidths, step_kernels
from archsearch.space.config import ArchConfig

# The widths the report examines, in GemmWidths field names (q/kv: the attention projections).
REPORT_DIMENSIONS = ("d_model", "d_ff", "q_width", "kv_width", "vocab_size", "tokens")


@dataclass(frozen=True)
class SizeOption:
    """A nearby size for one dimension and what it is predicted to gain."""

    value: int
    reason: str  # why it was tried: "multiple of 128 above", "fills the last wave", ...
    step_gain_pct: float  # step time saved, % (positive: faster); the rest of the step held fixed
    gemm_gain_pct: float  # achieved TFLOP/s of the dimension's GEMMs, % (positive: more efficient)

    @property
    def better(self) -> bool:
        """At least 1% more efficient per FLOP. A smaller size is always a faster step (less
        work), so the step gain alone does not make a size better."""
        return self.gemm_gain_pct >= 1.0


@dataclass(frozen=True)
class DimensionReport:
    """How hardware-friendly one width is on the target, and nearby sizes that do better."""

    name: str
    value: int
    gemm_sizes: tuple[int, ...]  # the sizes GEMMs see: d_ff and 2*d_ff when gated, q+2kv fused
    aligned: bool  # all a multiple of the tensor-core alignment (8 elements for 16-bit)
    well_aligned: bool  # all a multiple of the model's well_aligned_elements (64)
    tile_friendly: bool  # the tiles picked for its GEMMs cover it exactly (no partial tile)
    wave_friendly: bool  # its GEMMs' time-weighted wave efficiency reaches the threshold
    wave_efficiency: float
    gemm_time_s: float  # per step, all GEMMs that use this width
    options: tuple[SizeOption, ...]  # nearest first

    @property
    def better_options(self) -> tuple[SizeOption, ...]:
        return tuple(o for o in self.options if o.better)


@dataclass(frozen=True)
class AlignmentReport:
    """Per-dimension hardware friendliness of one config and micro-batch on one device."""

    device: str
    dtype: str
    batch: int
    step_time_s: float
    dimensions: tuple[DimensionReport, ...]

    def dimension(self, name: str) -> DimensionReport:
        """The report on dimension `name`.

        Raises:
            UnknownNameError: no such dimension (the message lists them).
        """
        for dim in self.dimensions:
            if dim.name == name:
                return dim
        valid = ", ".join(d.name for d in self.dimensions)
        raise UnknownNameError(f"unknown dimension {name!r}; valid: {valid}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _gemm_set_time(model: DeviceModel, gemms: Iterable[Gemm], dtype: str) -> tuple[float, int]:
    """Seconds and FLOPs of all calls of `gemms`."""
    gemms = tuple(gemms)
    return sum(g.count * predict_gemm(model, *g.shape, dtype) for g in gemms), sum(g.flops for g in gemms)


def _candidates(
    model: DeviceModel, widths: GemmWidths, name: str, touched: Sequence[int], dtype: str, max_change: float
) -> list[tuple[int, str]]:
    """Nearby values of width `name`: multiples of 64 and 128 each side, and wave-filling sizes."""
    value = getattr(widths, name)
    found: dict[int, list[str]] = {}
    for mult in (64, 128):
        down, up = (value // mult) * mult, -(-value // mult) * mult
        if 0 < down < value:
            found.setdefault(down, []).append(f"multiple of {mult} below")
        if up > value:
            found.setdefault(up, []).append(f"multiple of {mult} above")
    # Wave filling, on the slowest GEMM where the width sets an output side (m or n).
    base = widths.gemms()
    bumped = dataclasses.replace(widths, **{name: value + 1}).gemms()
    best: tuple[float, int, str] | None = None
    for i in touched:
        g, h = base[i], bumped[i]
        for axis in ("m", "n"):
            slope = getattr(h, axis) - getattr(g, axis)
            if slope:
                t = g.count * predict_gemm(model, *g.shape, dtype)
                if best is None or t > best[0]:
                    best = (t, i, axis)
    if best is not None:
        _, i, axis = best
        g = base[i]
        slope = getattr(bumped[i], axis) - getattr(g, axis)
        offset = getattr(g, axis) - slope * value  # GEMM side = slope * value + offset
        plan = plan_gemm(model, *g.shape, dtype)
        if plan.split_k == 1:
            tm, tn = plan.tile
            edge, other = (tm, math.ceil(g.n / tn)) if axis == "m" else (tn, math.ceil(g.m / tm))
            align = model.device.alignment_elements(dtype)
            units = model.device.units
            for waves, reason in ((plan.waves, "fills the last wave"), (plan.waves - 1, "one wave fewer")):
                side = (waves * units // other) * edge
                v = (side - offset) // slope
                v -= v % align  # keep the suggestion aligned
                near = abs(v - value) <= max_change * value
                if v > 0 and v != value and near and (v > value) == (waves == plan.waves):
                    found.setdefault(v, []).append(reason)
    return sorted(((v, ", ".join(r)) for v, r in found.items()), key=lambda vr: (abs(vr[0] - value), vr[0]))


def alignment_report(
    model: DeviceModel,
    cfg: ArchConfig,
    batch: int,
    dtype: str = "bf16",
    wave_threshold: float = 0.9,
    max_change: float = 0.1,
) -> AlignmentReport:
    """Which widths of `cfg` suit the target's tiles, waves and alignment, and what to use instead.

    For each width in REPORT_DIMENSIONS, nearby sizes are tried (multiples of 64 and 128 on
    either side; the largest size that keeps the slowest GEMM's waves, filling its last wave; the
    one that drops a wave) and predicted GEMM by GEMM. Only the GEMMs that use the width change;
    attention and memory-bound kernels are held fixed, which is close for neighbouring sizes.

    Args:
        model: the target device model.
        cfg: the architecture.
        batch: sequences per micro-batch.
        dtype: compute dtype.
        wave_threshold: time-weighted wave efficiency at or above which a width is wave-friendly.
        max_change: wave-based sizes further than this fraction of the width are not suggested
            (the multiples of 64 and 128 always are).

    Raises:
        ValueError: batch is not positive.
        UnknownNameError: dtype is unknown or the device lacks it.
    """
    step = predict_step(model, step_kernels(cfg, batch, COMPUTE_DTYPES[dtype].storage), dtype)
    widths = GemmWidths.of(cfg, batch)
    base = widths.gemms()
    align = model.device.alignment_elements(dtype)
    reports = []
    for name in REPORT_DIMENSIONS:
        value = getattr(widths, name)
        bumped = dataclasses.replace(widths, **{name: value + 1}).gemms()
        touched = [i for i, (g, h) in enumerate(zip(base, bumped, strict=True)) if g.shape != h.shape]
        sizes = sorted(
            {a for i in touched for a, b in zip(base[i].shape, bumped[i].shape, strict=True) if a != b}
        )
        plans = [(base[i], plan_gemm(model, *base[i].shape, dtype)) for i in touched]
        # Tiles cut m and n only; a width seen only as k never leaves a partial tile.
        partial = [
            side % edge
            for (g, plan), i in zip(plans, touched, strict=True)
            for side, moved, edge in zip(g.shape[:2], bumped[i].shape[:2], plan.tile, strict=True)
            if side != moved
        ]
        time0, flops0 = _gemm_set_time(model, (base[i] for i in touched), dtype)
        wave_eff = sum(g.count * p.time_s * p.wave_efficiency for g, p in plans) / time0
        options = []
        for v, reason in _candidates(model, widths, name, touched, dtype, max_change):
            changed = dataclasses.replace(widths, **{name: v}).gemms()
            time1, flops1 = _gemm_set_time(model, (changed[i] for i in touched), dtype)
            options.append(
                SizeOption(
                    value=v,
                    reason=reason,
                    step_gain_pct=100 * (time0 - time1) / step.step_time_s,
                    gemm_gain_pct=100 * ((flops1 / time1) / (flops0 / time0) - 1),
                )
            )
        reports.append(
            DimensionReport(
                name=name,
                value=value,
                gemm_sizes=tuple(sizes),
                aligned=all(s % align == 0 for s in sizes),
                well_aligned=all(s % model.well_aligned_elements == 0 for s in sizes),
                tile_friendly=not any(partial),
                wave_friendly=wave_eff >= wave_threshold,
                wave_efficiency=wave_eff,
                gemm_time_s=time0,
                options=tuple(options),
            )
        )
    return AlignmentReport(model.device.name, dtype, batch, step.step_time_s, tuple(reports))
