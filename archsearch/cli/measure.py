"""Measurement commands: train a proxy, profile a step, check GEMM alignment, the GPU catalogue,
refit a GPU's step model to a recorded run."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from archsearch.cli.common import (
    ConfigArg,
    FromStudyOpt,
    FromTrialOpt,
    JsonFlag,
    PresetOpt,
    StorageOpt,
    app,
    fmt_value,
    print_json,
    resolve_config,
    resolve_shape,
    si,
    stdout,
)
from archsearch.cli.progress import progress_bar, steps_bar
from archsearch.errors import ConfigError
from archsearch.trial import FAILED


@app.command()
def train(
    config: ConfigArg = None,
    preset_name: PresetOpt = None,
    study: FromStudyOpt = None,
    trial: FromTrialOpt = None,
    storage: StorageOpt = None,
    tokens: Annotated[int | None, typer.Option(help="Budget: training tokens.")] = None,
    flops: Annotated[float | None, typer.Option(help="Budget: training FLOPs.")] = None,
    seconds: Annotated[float | None, typer.Option(help="Budget: seconds of training.")] = None,
    data: Annotated[
        Path | None,
        typer.Option(help="Text file or folder (bytes), or .bin token file(s); default: bundled corpus."),
    ] = None,
    vocab_size: Annotated[int | None, typer.Option(help="Vocabulary of .bin token files.")] = None,
    token_dtype: Annotated[str, typer.Option(help="dtype of .bin token files.")] = "uint16",
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto.")] = "auto",
    precision: Annotated[str, typer.Option(help="bf16, fp32 or auto.")] = "auto",
    batch_size: Annotated[int, typer.Option(help="Sequences per step.")] = 16,
    lr: Annotated[float, typer.Option(help="Peak learning rate at --base-width.")] = 3e-3,
    base_width: Annotated[int, typer.Option(help="Width at which --lr applies unscaled.")] = 128,
    schedule: Annotated[str, typer.Option(help="cosine or wsd.")] = "cosine",
    seed: Annotated[int, typer.Option(help="Seed for init and batches.")] = 0,
    compile_model: Annotated[bool, typer.Option("--compile", help="torch.compile the model.")] = False,
    threads: Annotated[
        int | None, typer.Option(help="CPU threads (default: chosen from the shape and the free cores).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Train a shape's proxy LM on a budget; report held-out loss, throughput and MFU.

    --study S --trial N takes that trial's shape only: it trains with this command's options,
    not the study's [proxy] settings. --json records the settings with the result.
    Exit code 1 when the run fails (NaN loss, out of memory, too large), with the reason.
    """
    from archsearch.evaluators.data import load_dataset
    from archsearch.evaluators.trainer import TrainSettings
    from archsearch.evaluators.trainer import train as run_training

    cfg = resolve_shape(config, preset_name, study, trial, storage)
    settings = TrainSettings(
        tokens=tokens, flops=flops, seconds=seconds, batch_size=batch_size, lr=lr, base_width=base_width,
        schedule=schedule, seed=seed, device=device, precision=precision, compile=compile_model,
        threads=threads,
    )  # fmt: skip
    dataset = load_dataset(data, vocab_size=vocab_size, dtype=token_dtype, seq_len=cfg.seq_len)
    with progress_bar("training") as update:
        result = run_training(cfg, dataset, settings, progress=update)
    if as_json:
        print_json({**result.to_dict(), "settings": dataclasses.asdict(settings)})
    else:
        console = stdout()
        console.print(cfg.describe())
        table = Table("result", "value")
        rows = [
            ("status", result.status + (f" ({result.reason})" if result.reason else "")),
            ("val loss (nats/token)", fmt_value(result.val_loss, ".4f")),
            ("bits per byte", fmt_value(result.bits_per_byte, ".4f")),
            ("tokens", f"{result.tokens:,} in {result.steps:,} steps"),
            ("tokens / s", f"{result.tokens_per_second:,.0f}"),
            (
                "step time",
                fmt_value(result.step_time_s, ".4g")
                + f" s, median of {result.step_time_steps} steady-state steps",
            ),
            ("achieved FLOP/s", si(result.achieved_flops_per_second, "FLOP/s")),
            (
                "MFU",
                fmt_value(result.mfu, ".1%") + f" of {si(result.peak_flops_per_second or 0, 'FLOP/s')} peak",
            ),
            ("precision", result.precision),
            ("device", result.device + (f", {result.threads} threads" if result.threads else "")),
            ("wall time", f"{result.wall_time_s:.1f} s"),
            ("corpus", f"{dataset.name} ({result.corpus_fingerprint})"),
        ]
        for row in rows:
            table.add_row(*row)
        console.print(table)
    if result.status == FAILED:
        raise typer.Exit(1)


@app.command()
def profile(
    config: ConfigArg = None,
    preset_name: PresetOpt = None,
    device: Annotated[
        str, typer.Option(help="cpu, cuda, cuda:N (measured) or a catalogued GPU (modelled, see `devices`).")
    ] = "cpu",
    batch: Annotated[
        int | None, typer.Option(help="Sequences per micro-batch [default: 8; with --serve 1].", min=1)
    ] = None,
    dtype: Annotated[
        str,
        typer.Option(
            help="bf16, fp16, fp32 or auto: what training runs in here (fp32 on a CPU without native "
            "bf16); bf16 on a modelled GPU."
        ),
    ] = "auto",
    serve: Annotated[
        bool, typer.Option("--serve", help="Prefill and per-token decode instead of a training step.")
    ] = False,
    context: Annotated[int, typer.Option(help="With --serve: prompt and cached tokens.", min=1)] = 512,
    steps: Annotated[
        int,
        typer.Option(
            help="Measured: real training steps timed (median, after 3 warm-up steps) so the kernels "
            "read as its breakdown with a residual line; 0: kernels only.",
            min=0,
        ),
    ] = 10,
    cache: Annotated[Path | None, typer.Option(help="JSON file caching measurements across runs.")] = None,
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage", help="Trial database whose kernel table caches measurements (shared with searches)."
        ),
    ] = None,
    min_run_time: Annotated[float, typer.Option(help="Seconds of repeats per kernel.")] = 0.1,
    top: Annotated[int, typer.Option(help="Kernels shown in the table (JSON has all).")] = 20,
    as_json: JsonFlag = False,
) -> None:
    """Kernel-by-kernel time of one training step: measured here, or modelled for a GPU.

    --serve: prefill and per-token decode at --context instead (see `archsearch.cli.serve`).
    """
    from archsearch.evaluators.catalogue import ACCELERATORS
    from archsearch.evaluators.profiler import InMemoryCache, JsonFileCache
    from archsearch.evaluators.step_time import step_profile

    cfg = resolve_config(config, preset_name)
    if serve:  # archsearch.cli.serve prints it
        from archsearch.cli.serve import serve_profile

        return serve_profile(cfg, device, batch or 1, context, dtype, as_json, min_run_time)
    batch = batch or 8
    if cache is not None and storage is not None:
        raise ConfigError("give --cache FILE or --storage URL, not both")
    measure = functools.partial(
        step_profile, cfg, device, batch, dtype, steps=steps, min_run_time=min_run_time
    )
    if device in ACCELERATORS:  # modelled: nothing to time, no cache
        report = measure()
    else:
        with steps_bar("profiling") as update:
            if storage is not None:
                from archsearch.storage import KernelCache, Storage

                with Storage.open(storage) as db:  # new times are written through
                    report = measure(KernelCache(db.measurements(), db), progress=update)
            else:
                report = measure(
                    JsonFileCache(cache) if cache is not None else InMemoryCache(), progress=update
                )
    if as_json:
        print_json(report.to_dict())
        return
    console = stdout()
    how = "modelled" if report.modelled else "measured"
    console.print(
        f"{cfg.describe()}\n{how} on {report.device['name']}, {report.dtype}, batch {batch} x {cfg.seq_len}"
    )
    table = Table("kernel", "m", "n", "k", "count", "time/call", "total", "TFLOP/s", "share")
    rows = sorted(report.kernels, key=lambda r: r.total_s, reverse=True)
    for r in rows[:top]:
        table.add_row(
            r.name, str(r.m), str(r.n), str(r.k), str(r.count), si(r.time_s, "s"), si(r.total_s, "s"),
            f"{r.tflops:.3g}", f"{r.total_s / report.step_time_s:.1%}",
        )  # fmt: skip
    console.print(table)
    mem = Table("memory-bound op", "bytes", "time", "share")
    for op in sorted(report.memory_ops, key=lambda o: o.time_s, reverse=True):
        mem.add_row(op.name, si(op.bytes, "B"), si(op.time_s, "s"), f"{op.time_s / report.step_time_s:.1%}")
    console.print(mem)
    console.print(_step_breakdown(report))


def _step_breakdown(report: Any) -> str:
    """The lines that add up to the step (`ProfileReport.breakdown`), under the step time."""
    step = report.step_time_s
    lines = [f"step {si(step, 's')} ({report.step_source}), {report.tokens_per_second:,.0f} tokens/s"]
    for what, seconds, holds in report.breakdown():
        note = f"  ({holds})" if holds else ""
        lines.append(f"  {what:<24}{si(seconds, 's'):>8} {seconds / step:7.1%}{note}")
    return "\n".join(lines)


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
    from archsearch.evaluators.hardware import alignment_report, device_model

    cfg = resolve_config(config, preset_name)
    report = alignment_report(device_model(device), cfg, batch, dtype)
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


# ------------------------------------------------------------------------------------------------


@app.command("fit-device")
def fit_device(
    data: Annotated[
        Path, typer.Argument(help="A recorded run of benchmarks/gpu_model_accuracy.py (--save).")
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
    import json
    import statistics

    from archsearch.evaluators.catalogue import FITTED
    from archsearch.evaluators.model import eager_kernel_count
    from archsearch.evaluators.step_fit import fitted_fields, refit
    from archsearch.fileio import read_text

    text = read_text(data, "recorded run", ConfigError)
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ConfigError(f"{data}: not JSON: {exc}") from None
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
