"""`archsearch profile`: one training step, kernel by kernel, measured here or modelled for a GPU."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from archsearch.cli.common import (
    ConfigArg,
    JsonFlag,
    PresetOpt,
    ThreadsOpt,
    app,
    note_if_unfit,
    path_value,
    print_json,
    resolve_config,
    si,
    stdout,
    threads_text,
)
from archsearch.cli.progress import steps_bar
from archsearch.errors import ConfigError
from archsearch.space import ArchConfig


@app.command()
def profile(
    ctx: typer.Context,
    config: ConfigArg = None,
    preset_name: PresetOpt = None,
    device: Annotated[
        str, typer.Option(help="cpu, cuda, cuda:N (measured) or a catalogued GPU (modelled, see `devices`).")
    ] = "cpu",
    batch: Annotated[
        int | None,
        typer.Option(help="Sequences per micro-batch [default: 8; with --serve 1].", min=1),
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
    memory: Annotated[
        str | None,
        typer.Option(
            help='With --serve: the server\'s memory limit (e.g. "40GB"), for the largest batch that fits '
            "(default: a modelled GPU's memory; none here)."
        ),
    ] = None,
    steps: Annotated[
        int,
        typer.Option(
            help="Measured: real training steps timed (median, after 3 warm-up steps) so the kernels "
            "read as its breakdown with a residual line; 0: kernels only.",
            min=0,
        ),
    ] = 10,
    cache: Annotated[
        Path | None, typer.Option(help="JSON file caching measurements across runs.", parser=path_value)
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage", help="Trial database whose kernel table caches measurements (shared with searches)."
        ),
    ] = None,
    min_run_time: Annotated[float, typer.Option(help="Seconds of repeats per kernel.")] = 0.1,
    top: Annotated[int, typer.Option(help="Kernels shown in the table (JSON has all).", min=0)] = 20,
    threads: ThreadsOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Kernel-by-kernel time of one training step: measured here, or modelled for a GPU.

    Measured on the CPU, the step runs on the threads `train` would choose for this shape and
    --batch on this machine now (or --threads); --json's "threads" is the count used.
    --serve: prefill and per-token decode at --context instead (see `archsearch.cli.serving_lines`).
    """
    given = {name for name in ctx.params if ctx.get_parameter_source(name).name != "DEFAULT"}
    if memory is not None and not serve:
        raise ConfigError("--memory only goes with --serve")
    if "context" in given and not serve:  # refused, not ignored: it only applies to --serve
        raise ConfigError("--context only goes with --serve")
    cfg = resolve_config(config, preset_name)
    if serve:  # archsearch.cli.serving_lines prints it
        from archsearch.cli.serving_lines import serve_profile
        from archsearch.units import parse_bytes

        limit = parse_bytes(memory, "--memory") if memory is not None else None
        return serve_profile(cfg, device, batch or 1, context, dtype, as_json, min_run_time, limit)
    batch = batch or 8
    if cache is not None and storage is not None:
        raise ConfigError("give --cache FILE or --storage URL, not both")
    report, used = _profile(cfg, device, batch, dtype, steps, cache, storage, min_run_time, threads, given)
    note_if_unfit(cfg, device, batch)
    if as_json:
        print_json({**report.to_dict(), "threads": used})
        return
    console = stdout()
    how = "modelled" if report.modelled else "measured"
    on = f"{report.device['name']}, {report.dtype}, batch {batch} x {cfg.seq_len}"
    console.print(f"{cfg.describe()}\n{how} on {on}" + (f", {threads_text(used, threads)}" if used else ""))
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


def _profile(
    cfg: ArchConfig, device: str, batch: int, dtype: str, steps: int, cache: Path | None, storage: str | None,
    min_run_time: float, threads: int | None, given: set[str],
) -> tuple[Any, int | None]:  # fmt: skip
    """The `ProfileReport` and the CPU threads it ran on (None: modelled, or on a GPU); `given`
    names the options the user gave."""
    from archsearch.evaluators.hardware import check_device
    from archsearch.evaluators.step_time import step_profile

    measure = functools.partial(
        step_profile, cfg, device, batch, dtype, steps=steps, min_run_time=min_run_time
    )
    if check_device(device):  # modelled: nothing to time, no cache, no threads
        timing = [n for n in ("threads", "steps", "min_run_time", "cache", "storage") if n in given]
        if timing:  # refused rather than ignored, which would look as if they had been applied
            flags = ", ".join("--" + n.replace("_", "-") for n in timing)
            verb = "is" if len(timing) == 1 else "are"
            raise ConfigError(f"{flags} {verb} for a step measured here; {device} is modelled")
        return measure(), None
    from archsearch.evaluators.profiler import InMemoryCache, JsonFileCache
    from archsearch.evaluators.trainer import intra_op_threads, step_threads

    used = step_threads(cfg, device, batch * cfg.seq_len, threads)  # the rule `train` follows
    with intra_op_threads(used), steps_bar("profiling") as update:
        if storage is None:
            known = JsonFileCache(cache) if cache is not None else InMemoryCache()
            return measure(known, progress=update), used
        from archsearch.storage import KernelCache, Storage

        with Storage.open(storage) as db:  # new times are written through
            return measure(KernelCache(db.measurements(), db), progress=update), used


def _step_breakdown(report: Any) -> str:
    """The lines that add up to the step (`ProfileReport.breakdown`), under the step time."""
    step = report.step_time_s
    lines = [f"step {si(step, 's')} ({report.step_source}), {report.tokens_per_second:,.0f} tokens/s"]
    for what, seconds, holds in report.breakdown():
        note = f"  ({holds})" if holds else ""
        lines.append(f"  {what:<24}{si(seconds, 's'):>8} {seconds / step:7.1%}{note}")
    return "\n".join(lines)
