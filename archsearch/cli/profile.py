"""`archsearch profile`: one training step, kernel by kernel, measured here or modelled for a GPU."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from archsearch.cli.common import ConfigArg, JsonFlag, PresetOpt, app, print_json, resolve_config, si, stdout
from archsearch.cli.progress import steps_bar
from archsearch.errors import ConfigError


@app.command()
def profile(
    config: ConfigArg = None,
    preset_name: PresetOpt = None,
    device: Annotated[
        str, typer.Option(help="cpu, cuda, cuda:N (measured) or a catalogued GPU (modelled, see `devices`).")
    ] = "cpu",
    batch: Annotated[int, typer.Option(help="Sequences per micro-batch.", min=1)] = 8,
    dtype: Annotated[
        str,
        typer.Option(
            help="bf16, fp16, fp32 or auto: what training runs in here (fp32 on a CPU without native "
            "bf16); bf16 on a modelled GPU."
        ),
    ] = "auto",
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
    """Kernel-by-kernel time of one training step: measured here, or modelled for a GPU."""
    from archsearch.evaluators.catalogue import ACCELERATORS
    from archsearch.evaluators.profiler import InMemoryCache, JsonFileCache
    from archsearch.evaluators.step_time import step_profile

    cfg = resolve_config(config, preset_name)
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
