"""Fit a device model to measured training steps, so that modelled steps predict real ones.

The roofline of `evaluators.hardware` sums kernels; a real eager step is 1.4-5.6x longer on an
H100 (benchmarks/gpu_model_accuracy_h100_2026-11-22.json; docs/explanations/hardware-costs.md).
`fit_step_model` fits, from a recorded run of `benchmarks/gpu_model_accuracy.py` (its kernels and
its real steps), what the roofline lacks, in four stages, each on the data that shows it:
1. GEMMs: compute rate, bandwidth and launch (`hardware.calibrate`) on the aligned GEMMs, then
   the speed of GEMMs whose n or k is off the 16-byte alignment (m is free) and of those aligned
   to 16 bytes but not to 64 elements, each the median of what its GEMMs imply; the bandwidth
   is then the device-to-device copy's the run measured (GEMMs that L2 serves imply more than
   the memory has);
2. flash attention: forward and backward efficiency and the sequence length at which the
   kernel reaches half of it (`efficiency * s / (s + half)`), least squares on log time;
3. whole steps: per kernel an eager step launches (`counting.eager_kernel_count`), the GPU's gap
   between kernels, and the host's time per launch and per autograd node (`counting.eager_host_ops`;
   a step waits on the slower of the two),
   and the bandwidth of elementwise ops over rows off the alignment (vocab 50257): least
   squares on the relative error of the real steps.
Pure: numpy only; kernel counts come with the records.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from archsearch.errors import ConfigError, quoted
from archsearch.evaluators.hardware import (
    DeviceModel,
    GemmMeasurement,
    calibrate,
    device_model,
    misalignment,
    predict_attention,
    predict_gemm,
    predict_step,
)
from archsearch.evaluators.step_kernels import StepKernels, step_kernels
from archsearch.space.config import ArchConfig
from archsearch.units import format_si

# The longest real training step a recorded run may hold: the benchmark's shapes step in
# milliseconds to seconds on a GPU; an hour is no step of theirs.
MAX_STEP_S = 3600.0
FIT_FIELDS = (
    "compute_efficiency",
    "bandwidth_efficiency",
    "launch_overhead_s",
    "misaligned_factor",
    "coarse_aligned_factor",
    "attention_efficiency",
    "attention_backward_efficiency",
    "attention_seq_half",
    "misaligned_memory_factor",
    "eager_kernel_s",
    "host_kernel_s",
)


@dataclass(frozen=True)
class StepRecord:
    """One shape measured on the device: its kernels and its real training step."""

    label: str
    config: ArchConfig
    batch: int
    dtype: str
    gemms: tuple[GemmMeasurement, ...]  # one per distinct GEMM call of the step
    attention: tuple[tuple[str, float], ...]  # (sdpa.fwd | sdpa.bwd, seconds per call)
    real_step_s: float  # the measured training step (median)
    launches: int  # kernels the eager step launches (`counting.eager_kernel_count`)
    copy_bandwidth: float | None = None  # bytes/s a device-to-device copy reached in the run

    @functools.cached_property
    def host_ops(self) -> int:
        """The ops the host handles: the launches as recorded (a step measured before a change to
        the proxy ran those) and its autograd graph's nodes as counted now (`counting.eager_host_ops`)."""
        from archsearch.evaluators.counting import eager_host_ops, eager_kernel_count

        return self.launches + eager_host_ops(self.config) - eager_kernel_count(self.config)

    @functools.cached_property
    def kernels(self) -> StepKernels:
        """The step's inventory: its GEMMs and attention, and the memory-bound kernels the eager
        step runs (`counting.eager_memory_ops`)."""
        from archsearch.evaluators.counting import eager_memory_ops

        memory = eager_memory_ops(self.config, self.batch, self.dtype)
        return step_kernels(self.config, self.batch, self.dtype, memory_ops=memory)


def records_from_benchmark(raw: dict[str, Any], launches: dict[str, int]) -> list[StepRecord]:
    """The shapes of a `benchmarks/gpu_model_accuracy.py` run that have a real step timed.

    Args:
        raw: the run's JSON (`--save`).
        launches: kernels per step by shape label.

    Raises:
        ConfigError: the file is not such a run.
    """
    records = []
    for i, entry in enumerate(_shapes(raw)):
        try:
            if entry.get("train_step_s") is None:
                continue
            report = entry["report"]
            rows = report["kernels"]
            label, batch, real = entry["label"], entry["batch"], entry["train_step_s"]
            if isinstance(batch, bool) or not (isinstance(batch, int) and batch > 0):
                raise ValueError(f"batch must be a positive integer, got {batch!r}")
            # At most an hour: a recorded step of 1e308 s would overflow to inf ms and be fitted.
            if isinstance(real, bool) or not (isinstance(real, (int, float)) and 0 < real <= MAX_STEP_S):
                raise ValueError(
                    f"train_step_s must be a positive number of seconds up to {MAX_STEP_S:g}, got {real!r}"
                )  # a NaN fitted NaN constants, a 0 divided by zero, a negative one fitted garbage
            record = StepRecord(
                label=label,
                config=ArchConfig.from_dict(entry["config"]),
                batch=batch,
                dtype=report["dtype"],
                gemms=tuple(
                    GemmMeasurement(r["m"], r["n"], r["k"], report["dtype"], r["time_s"])
                    for r in rows
                    if r["kind"] == "gemm"
                ),
                attention=tuple((r["kind"], r["time_s"]) for r in rows if r["kind"].startswith("sdpa")),
                real_step_s=float(real),
                launches=launches[label],
                copy_bandwidth=report.get("bandwidth_bytes_per_s"),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise _unreadable(exc, _where(i, entry)) from None
        _check_consistent(record, _where(i, entry))
        records.append(record)
    return records


def _shapes(raw: Any) -> list[dict[str, Any]]:
    """The run's list of shapes, each an object."""
    shapes = raw.get("shapes") if isinstance(raw, dict) else None
    if not isinstance(shapes, list) or not all(isinstance(e, dict) for e in shapes):
        raise ConfigError("not a recorded gpu_model_accuracy run: 'shapes' must be a list of objects")
    return shapes


def _launches(shapes: list[dict[str, Any]], count: Callable[[ArchConfig], int]) -> dict[str, int]:
    """Kernels an eager step of each shape launches, by label."""
    out = {}
    for i, entry in enumerate(shapes):
        try:
            out[entry["label"]] = count(ArchConfig.from_dict(entry["config"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise _unreadable(exc, _where(i, entry)) from None
    return out


def _where(i: int, entry: dict[str, Any]) -> str:
    """ "shapes[0] ('gpt2-small')": a recorded shape as messages name it."""
    label = entry.get("label")
    return f"shapes[{i}]" + (f" ({quoted(label)})" if isinstance(label, str) else "")


def _check_device(raw: dict[str, Any], device: str, spec: Any) -> None:
    """Refuse a run recorded on another GPU than catalogued `device`: its SM count differs, or its
    memory by more than 15% (an H100 recording would otherwise be fitted as an A100's). A run that
    names no CUDA device is not checked."""
    recorded = raw.get("device")
    if not isinstance(recorded, dict) or recorded.get("type") != "cuda":
        return
    units, memory = recorded.get("units"), recorded.get("memory_bytes")
    other_units = isinstance(units, int) and units != spec.units
    other_memory = isinstance(memory, (int, float)) and abs(memory / spec.memory_bytes - 1) > 0.15
    if other_units or other_memory:  # what the run does not name is not held against it
        name = quoted(str(recorded.get("name", "a GPU")), 60)
        raise ConfigError(
            f"the run was recorded on {name} ({units} SMs, {format_si(memory or 0, 'B')}), not on "
            f"{device} ({spec.name}: {spec.units} SMs, {format_si(spec.memory_bytes, 'B')}): give "
            "--device for the GPU that recorded it"
        )


def _unreadable(exc: Exception, where: str) -> ConfigError:
    """A malformed part of a recording in one line, naming where (not a Python repr)."""
    if isinstance(exc, KeyError):
        what = f" has no {exc.args[0]!r}"
    elif isinstance(exc, (TypeError, AttributeError)):
        what = " holds a value of the wrong type"
    else:
        what = f": {exc}"
    return ConfigError(f"not a recorded gpu_model_accuracy run: {where}{what}")


def _check_consistent(record: StepRecord, where: str) -> None:
    """Refuse a shape whose recorded GEMMs its config does not run at its batch: the config was
    edited, or belongs to another shape (unchecked, a d_model of 7 would be fitted with a 768-wide
    run's kernels)."""
    runs = {(g.m, g.n, g.k) for g in step_kernels(record.config, record.batch, record.dtype).gemms}
    if alien := sorted({(x.m, x.n, x.k) for x in record.gemms} - runs):
        m, n, k = alien[0]
        raise ConfigError(
            f"{where}: its recorded GEMMs are not its config's at batch {record.batch} (e.g. {m}x{n}x{k}): "
            "the config or the kernels were changed"
        )


def _check_possible(records: Sequence[StepRecord], spec: Any) -> None:
    """Refuse a real step shorter than its matrix FLOPs take at the device's peak: no GPU runs one
    (unchecked, steps of 1e-12 s would be fitted into a model to paste, with errors of 10^12 %)."""
    for r in records:
        floor = step_kernels(r.config, r.batch, r.dtype).matmul_flops / spec.peak_flops(r.dtype)
        if r.real_step_s < floor:
            raise ConfigError(
                f"shape {quoted(r.label)}: train_step_s {r.real_step_s:.3g} s is shorter than its "
                f"matrix FLOPs take at the {spec.name}'s {r.dtype} peak ({floor:.3g} s)"
            )


def _aligned(x: GemmMeasurement, multiple: int) -> bool:
    """n and k multiples of `multiple` (m is free of the alignment penalty)."""
    return x.n % multiple == 0 and x.k % multiple == 0


def _fit_gemms(base: DeviceModel, gemms: Sequence[GemmMeasurement]) -> DeviceModel:
    align = base.device.alignment_elements(gemms[0].dtype)
    well = [x for x in gemms if _aligned(x, base.well_aligned_elements)]
    if len(well) < 3:
        raise ConfigError(f"the fit needs at least 3 well-aligned GEMMs, got {len(well)}")
    model = calibrate(base, well).model
    free = dataclasses.replace(model, misaligned_factor=1.0, coarse_aligned_factor=1.0)

    def slowdown(x: GemmMeasurement) -> float:
        return predict_gemm(free, x.m, x.n, x.k, x.dtype) / x.seconds

    # Off the 16 bytes: speed = misaligned_factor ** misalignment, so each GEMM implies a log factor.
    misaligned = [x for x in gemms if not _aligned(x, align)]
    factor = model.misaligned_factor
    if misaligned:
        logs = [
            math.log(slowdown(x)) / max(misalignment(x.n, align), misalignment(x.k, align))
            for x in misaligned
        ]
        factor = min(1.0, math.exp(statistics.median(logs)))
    coarse = [x for x in gemms if _aligned(x, align) and not _aligned(x, base.well_aligned_elements)]
    coarse_factor = (
        min(1.0, statistics.median(slowdown(x) for x in coarse)) if coarse else model.coarse_aligned_factor
    )
    return dataclasses.replace(model, misaligned_factor=factor, coarse_aligned_factor=coarse_factor)


def _fit_attention(model: DeviceModel, records: Sequence[StepRecord]) -> DeviceModel:
    """Forward and backward efficiency and the half-efficiency sequence length."""
    unit = dataclasses.replace(
        model, attention_efficiency=1.0, attention_backward_efficiency=None, attention_seq_half=0.0
    )
    calls: dict[str, list[tuple[float, int, float]]] = {"sdpa.fwd": [], "sdpa.bwd": []}
    for record in records:
        inventory = step_kernels(record.config, record.batch, record.dtype)
        measured = dict(record.attention)
        for call in inventory.attention:
            if call.name in measured:
                at_unit = predict_attention(unit, call, record.dtype) / call.count - unit.launch_s
                calls[call.name].append((at_unit, call.seq_len, measured[call.name] - unit.launch_s))
    if not calls["sdpa.fwd"] or not calls["sdpa.bwd"]:
        return model
    best: tuple[float, float, float, float] | None = None
    for half in np.linspace(0.0, 8192.0, 513):
        loss, efficiency = 0.0, {}
        for name, rows in calls.items():
            # time = at_unit * (s + half) / s / e  ->  log e = mean(log(at_unit (s+half)/s) - log t)
            logs = [math.log(u * (s + half) / s) - math.log(max(t, 1e-9)) for u, s, t in rows]
            log_e = sum(logs) / len(logs)
            efficiency[name] = math.exp(log_e)
            loss += sum((v - log_e) ** 2 for v in logs)
        if best is None or loss < best[0]:
            best = (loss, efficiency["sdpa.fwd"], efficiency["sdpa.bwd"], float(half))
    assert best is not None
    return dataclasses.replace(
        model, attention_efficiency=best[1], attention_backward_efficiency=best[2], attention_seq_half=best[3]
    )


def _kernel_step(model: DeviceModel, record: StepRecord) -> tuple[float, float]:
    """(the kernels' predicted step, the part of it in ops over misaligned rows)."""
    inventory = record.kernels
    align = model.device.alignment_elements(record.dtype)
    misaligned = sum(op.bytes / model.bandwidth for op in inventory.memory_ops if op.row and op.row % align)
    return predict_step(model, inventory).kernel_sum_s, misaligned


def _fit_overheads(model: DeviceModel, records: Sequence[StepRecord]) -> DeviceModel:
    """Per-launch GPU gap, host time per launch and autograd node, and the misaligned-row
    bandwidth, from real steps.

    The step is `max(kernels + misaligned extra + launches * gap, host ops * host)`: the GPU
    runs its kernels with a gap each, while the host records the autograd graph, runs its
    backward and issues the kernels (`StepRecord.host_ops`); a small shape waits on the host.
    Least squares on relative error over a grid, refined around the best point.
    """
    flat = dataclasses.replace(model, misaligned_memory_factor=1.0, eager_kernel_s=0.0, host_kernel_s=0.0)
    rows = np.array([[*_kernel_step(flat, r), r.launches, r.host_ops, r.real_step_s] for r in records])
    kernels, misaligned, launches, host_ops, real = rows.T

    def loss(gap: np.ndarray, host: np.ndarray, extra: np.ndarray) -> np.ndarray:
        g, h, c = (v[:, None] for v in (gap, host, extra))
        step = np.maximum(kernels + misaligned * c + launches * g, host_ops * h)
        return ((step / real - 1) ** 2).sum(axis=1)

    # (gap s, host s, extra bandwidth cost); each round a 21^3 grid, then a window 1/5 as wide.
    low, high = np.zeros(3), np.array([50e-6, 50e-6, 20.0 if misaligned.any() else 0.0])
    best = None
    for _ in range(12):
        axes = [np.linspace(lo, hi, 21) for lo, hi in zip(low, high, strict=True)]
        grid = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 3)
        best = grid[np.argmin(loss(grid[:, 0], grid[:, 1], grid[:, 2]))]
        span = (high - low) / 10
        low, high = np.maximum(best - span, 0.0), best + span
    assert best is not None
    return dataclasses.replace(
        model,
        eager_kernel_s=float(best[0]),
        host_kernel_s=float(best[1]),
        misaligned_memory_factor=1.0 / (1.0 + float(best[2])),
    )


def fit_step_model(
    base: DeviceModel, records: Sequence[StepRecord], extra_gemms: Sequence[GemmMeasurement] = ()
) -> DeviceModel:
    """`base` with every field of `FIT_FIELDS` fitted to `records` (see the module's docstring).

    Args:
        base: the catalogued device's model (its tiles, units and peaks shape the fit).
        records: at least 2 shapes with kernels and real steps.
        extra_gemms: more GEMM measurements for stage 1 (the benchmark's synthetic set).

    Raises:
        ConfigError: fewer than 2 records or 3 well-aligned GEMMs.
    """
    if len(records) < 2:
        raise ConfigError(f"the fit needs at least 2 shapes with a real step, got {len(records)}")
    gemms = [g for r in records for g in r.gemms] + list(extra_gemms)
    model = _fit_gemms(base, gemms)
    copies = [r.copy_bandwidth for r in records if r.copy_bandwidth]
    if copies:  # memory-bound ops stream at the copy bandwidth measured, not at what GEMMs imply
        model = dataclasses.replace(
            model, bandwidth_efficiency=statistics.median(copies) / base.device.memory_bandwidth
        )
    model = _fit_attention(model, records)
    return _fit_overheads(model, records)


def predicted_step(model: DeviceModel, record: StepRecord) -> float:
    """The modelled real step of a record's shape: its kernels plus its launches' overhead."""
    return predict_step(model, record.kernels, launches=record.launches, host_ops=record.host_ops).step_time_s


@dataclass(frozen=True)
class Holdout:
    """One shape predicted by a model fitted on all the others."""

    label: str
    real_step_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.real_step_s - 1


def leave_one_out(
    base: DeviceModel,
    records: Sequence[StepRecord],
    extra_gemms: Sequence[GemmMeasurement] = (),
    on_fit: Callable[[int, str], None] | None = None,
) -> list[Holdout]:
    """Each shape's step predicted by `fit_step_model` on the other shapes (their kernels too);
    `on_fit(i, label)` is called before each of the fits (for progress displays)."""
    out = []
    for i, record in enumerate(records):
        if on_fit is not None:
            on_fit(i, record.label)
        others = [r for j, r in enumerate(records) if j != i]
        model = fit_step_model(base, others, extra_gemms)
        out.append(Holdout(record.label, record.real_step_s, predicted_step(model, record)))
    return out


def fitted_fields(model: DeviceModel) -> dict[str, float | None]:
    """The fitted assumptions of `model`, by field name (what `catalogue.FITTED` stores)."""
    values = {name: getattr(model, name) for name in FIT_FIELDS}
    return {name: None if value is None else float(value) for name, value in values.items()}


@dataclass(frozen=True)
class Refit:
    """A device model fitted to a recorded run, with how well it predicts the run's steps."""

    device: str  # catalogue key
    model: DeviceModel
    records: tuple[StepRecord, ...]
    predicted: tuple[float, ...]  # each record's modelled step, fitted on all records
    kernel_sums: tuple[float, ...]  # the bare roofline's kernel sum of each record (before)
    holdout: tuple[Holdout, ...]  # empty unless asked

    def entry(self, data: str, sha256: str) -> str:
        """The `catalogue.FITTED` entry for this fit, as Python source (4 significant digits)."""
        fields = ", ".join(
            f'("{name}", {value if value is None else float(f"{value:.4g}")!r})'
            for name, value in fitted_fields(self.model).items()
        )
        errors = [abs(h.error) for h in self.holdout]
        median = f"{statistics.median(errors):.3f}" if errors else "nan"
        worst = f"{max(errors):.3f}" if errors else "nan"
        return (
            f'FITTED["{self.device}"] = FittedModel(\n    fields=({fields}),\n    data="{data}",\n'
            f'    sha256="{sha256}",\n    shapes={len(self.records)},\n'
            f"    holdout_median={median},\n    holdout_worst={worst},\n)"
        )


def refit(
    raw: dict[str, Any],
    device: str,
    count: Callable[[ArchConfig], int],
    holdout: bool = False,
    on_progress: Callable[[int, int, str], None] | None = None,
) -> Refit:
    """Fit catalogued `device` to a recorded `benchmarks/gpu_model_accuracy.py` run.

    Args:
        raw: the run's JSON.
        device: the catalogue key the fit is for (its bare model is the starting point).
        count: kernels an eager step of a config launches (`counting.eager_kernel_count`).
        holdout: also predict each shape from a fit on the others (one fit per shape).
        on_progress: called as `(fits done, fits in all, what runs now)` (a progress display).

    Raises:
        ConfigError: the file is not such a run, or has too few shapes.
        UnknownNameError: `device` is not catalogued.
    """
    shapes = _shapes(raw)
    launches = _launches(shapes, count)
    dtype = raw.get("dtype", "bf16")  # runs before 2026-11-25 name none: they timed bf16
    extra = []
    for i, row in enumerate(raw.get("fit_gemms", [])):
        if not (isinstance(row, list) and len(row) == 4):
            raise ConfigError(
                f"not a recorded gpu_model_accuracy run: fit_gemms[{i}] must be [m, n, k, seconds]"
            )
        try:
            extra.append(GemmMeasurement(*row[:3], dtype, row[3]))
        except (TypeError, ValueError) as exc:
            raise _unreadable(exc, f"fit_gemms[{i}]") from None
    records = records_from_benchmark(raw, launches)
    base = device_model(device, fitted=False)
    _check_device(raw, device, base.device)
    _check_possible(records, base.device)
    total = 1 + len(records) * holdout

    def fitting(done: int, what: str) -> None:
        if on_progress is not None:
            on_progress(done, total, what)

    fitting(0, f"all {len(records)} shapes")
    model = fit_step_model(base, records, extra)
    fits = []
    if holdout:
        fits = leave_one_out(base, records, extra, lambda i, label: fitting(1 + i, f"all but {label}"))
    fitting(total, "done")
    return Refit(
        device=device,
        model=model,
        records=tuple(records),
        predicted=tuple(predicted_step(model, r) for r in records),
        kernel_sums=tuple(predict_step(base, r.kernels).step_time_s for r in records),
        holdout=tuple(fits),
    )


def held_out_fit(
    raw: dict[str, Any],
    device: str,
    count: Callable[[ArchConfig], int],
    held_out: Collection[str],
) -> tuple[Refit, tuple[Holdout, ...]]:
    """Fit catalogued `device` to the shapes of a recorded run that are not `held_out` (as `refit`
    fits them: `archsearch fit-device`), then predict each held-out shape's real step with it.

    Unlike `leave_one_out`, one fit scores every held-out shape, and the split is the caller's,
    fixed before the run: the error of a model on shapes chosen in advance that it never saw.

    Args:
        raw: the run's JSON (`benchmarks/gpu_model_accuracy.py --save`, `gpu_campaign.py` part 1).
        device: the catalogue key the fit is for.
        count: kernels an eager step of a config launches (`counting.eager_kernel_count`).
        held_out: labels of the run's shapes left out of the fit; a shape without a real step
            is left out of both.

    Returns:
        (the fit on the other shapes, one `Holdout` per held-out shape with a real step).

    Raises:
        ConfigError: the file is not such a run, a held-out label is not in it, or too few shapes
            are left to fit.
        UnknownNameError: `device` is not catalogued.
    """
    shapes = _shapes(raw)
    labels = {entry.get("label") for entry in shapes}
    if unknown := sorted(set(held_out) - labels):
        raise ConfigError(f"held-out shape(s) not in the run: {', '.join(unknown)}")
    fit = refit({**raw, "shapes": [e for e in shapes if e["label"] not in held_out]}, device, count)
    held = [entry for entry in shapes if entry["label"] in held_out]
    records = records_from_benchmark({"shapes": held}, _launches(held, count))
    return fit, tuple(Holdout(r.label, r.real_step_s, predicted_step(fit.model, r)) for r in records)
