"""The GPU catalogue and its model: `align` (GEMM widths on a catalogued GPU), `devices` (the
catalogue) and `fit-device` (refit a GPU's step model to a recorded run)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from archsearch.cli.common import (
    ConfigArg,
    JsonFlag,
    PresetOpt,
    app,
    note_if_unfit,
    path_value,
    print_json,
    resolve_config,
    si,
    stdout,
)
from archsearch.cli.progress import steps_bar
from archsearch.errors import ConfigError


@app.command()
def align(
    config: ConfigArg = None,
    preset_name: PresetOpt = None,
    device: Annotated[str, typer.Option(help="A catalogued GPU (see `devices`).")] = "h100-sxm",
    batch: Annotated[int, typer.Option(help="Sequences per micro-batch.", min=1)] = 8,
    dtype: Annotated[str, typer.Option(help="bf16, fp16, fp8, tf32 or fp32.")] = "bf16",
    as_json: JsonFlag = False,
) -> None:
    """Is each GEMM width tile- and wave-friendly on the target, and which nearby sizes run better?"""
    from archsearch.evaluators.alignment import alignment_report
    from archsearch.evaluators.hardware import device_model

    cfg = resolve_config(config, preset_name)
    report = alignment_report(device_model(device), cfg, batch, dtype)
    note_if_unfit(cfg, device, batch)
    if as_json:
        print_json(report.to_dict())
        return
    console = stdout()
    console.print(f"{cfg.describe()}\nmodelled on {report.device}, {dtype}, batch {batch} x {cfg.seq_len}")
    table = Table(
        "width", "value", "aligned", "tiles", "waves", "better sizes (step gain, GEMM efficiency gain)"
    )
    for d in report.dimensions:
        better = ", ".join(
            f"{o.value} ({o.step_gain_pct:+.1f}%, {o.gemm_gain_pct:+.1f}%)" for o in d.better_options
        )
        aligned = "yes" if d.well_aligned else ("8-aligned" if d.aligned else "NO")
        table.add_row(
            d.name, str(d.value), aligned, "ok" if d.tile_friendly else "partial",
            f"{d.wave_efficiency:.0%}" + ("" if d.wave_friendly else " (low)"), better or "-",
        )  # fmt: skip
    console.print(table)


@app.command()
def devices(as_json: JsonFlag = False) -> None:
    """The catalogue of GPUs that `profile` and `align` model, with their sources."""
    from archsearch.evaluators.catalogue import ACCELERATORS

    if as_json:
        print_json([{"key": key, **dataclasses.asdict(acc)} for key, acc in ACCELERATORS.items()])
        return
    table = Table("key", "name", "SMs", "dense TFLOP/s", "bandwidth", "source")
    for key, acc in ACCELERATORS.items():
        peaks = ", ".join(f"{d} {t:g}" for d, t in acc.peak_tflops)
        table.add_row(key, acc.name, str(acc.units), peaks, si(acc.memory_bandwidth, "B/s"), acc.source)
    stdout().print(table)


@app.command("fit-device")
def fit_device(
    data: Annotated[
        Path,
        typer.Argument(
            help="A recorded run of benchmarks/gpu_model_accuracy.py (--save).", parser=path_value
        ),
    ],
    device: Annotated[str, typer.Option(help="Catalogued device the run was measured on.")] = "h100-sxm",
    holdout: Annotated[
        bool, typer.Option("--holdout/--no-holdout", help="Also predict each shape from a fit on the others.")
    ] = True,
    as_json: JsonFlag = False,
) -> None:
    """Refit a device's step model to a recorded run: real steps, its kernels, launch overhead.

    Prints the fitted constants, each shape's real step against the bare kernel sum and the
    fitted model (and, with --holdout, against a fit that did not see it), and the
    `catalogue.FITTED` entry to paste.
    """
    import hashlib
    import statistics

    from archsearch.evaluators.catalogue import FITTED
    from archsearch.evaluators.counting import eager_kernel_count
    from archsearch.evaluators.step_fit import fitted_fields, refit
    from archsearch.fileio import read_json

    raw = read_json(data, "recorded run", ConfigError, "a recorded run")
    if not isinstance(raw, dict):
        raise ConfigError(f"{data}: not a recorded gpu_model_accuracy run (a JSON object with 'shapes')")
    with steps_bar("fitting") as update:
        result = refit(raw, device, eager_kernel_count, holdout=holdout, on_progress=update)
    sha256 = hashlib.sha256(data.read_bytes()).hexdigest()  # the file as committed, byte for byte
    holdouts = {h.label: h for h in result.holdout}
    shapes = [
        {
            "label": r.label,
            "launches": r.launches,
            "real_step_s": r.real_step_s,
            "kernel_sum_s": kernel_sum,
            "modelled_s": predicted,
            "holdout_s": holdouts[r.label].predicted_s if r.label in holdouts else None,
        }
        for r, kernel_sum, predicted in zip(result.records, result.kernel_sums, result.predicted, strict=True)
    ]
    catalogued = FITTED.get(device)
    if as_json:
        print_json(
            {
                "device": device,
                "data": str(data),
                "sha256": sha256,
                "fitted": fitted_fields(result.model),
                "catalogued": None if catalogued is None else dict(catalogued.fields),
                "shapes": shapes,
            }
        )
        return
    table = Table("constant", "fitted", "catalogued")
    now = dict(catalogued.fields) if catalogued else {}
    for name, value in fitted_fields(result.model).items():
        table.add_row(
            name,
            f"{value:.4g}" if value is not None else "-",
            f"{now[name]:.4g}" if now.get(name) is not None else "-",
        )
    stdout().print(table)
    table = Table("shape", "launches", "real ms", "kernel sum", "fitted", "held out")

    def cell(seconds: float | None, real: float) -> str:
        return "-" if seconds is None else f"{seconds * 1e3:.2f} ({seconds / real - 1:+.1%})"

    for row in shapes:
        real = row["real_step_s"]
        table.add_row(
            row["label"], str(row["launches"]), f"{real * 1e3:.2f}",
            cell(row["kernel_sum_s"], real), cell(row["modelled_s"], real), cell(row["holdout_s"], real),
        )  # fmt: skip
    stdout().print(table)
    if result.holdout:
        errors = [abs(h.error) for h in result.holdout]
        typer.echo(f"held out: median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%}")
    typer.echo(result.entry(data.as_posix(), sha256))
