"""`archsearch train`: train a shape's proxy LM on a budget and report its loss and speed."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from archsearch.cli.boundary import EXIT_ENVIRONMENT
from archsearch.cli.common import (
    ConfigArg,
    FromStudyOpt,
    FromTrialOpt,
    JsonFlag,
    PresetOpt,
    StorageOpt,
    ThreadsOpt,
    app,
    fmt_value,
    path_value,
    print_json,
    resolve_shape,
    si,
    stdout,
    threads_text,
)
from archsearch.cli.progress import progress_bar
from archsearch.errors import error_line
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
        typer.Option(
            help="Text file or folder (bytes), or .bin token file(s); default: bundled corpus.",
            parser=path_value,
        ),
    ] = None,
    vocab_size: Annotated[int | None, typer.Option(help="Vocabulary of .bin token files.")] = None,
    token_dtype: Annotated[
        str | None, typer.Option(help="dtype of .bin token files [default: uint16, uint32 past 65,536 ids].")
    ] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto.")] = "auto",
    precision: Annotated[str, typer.Option(help="bf16, fp32 or auto.")] = "auto",
    batch_size: Annotated[int, typer.Option(help="Sequences per step.")] = 16,
    lr: Annotated[float, typer.Option(help="Peak learning rate at --base-width.")] = 3e-3,
    base_width: Annotated[int, typer.Option(help="Width at which --lr applies unscaled.")] = 128,
    schedule: Annotated[str, typer.Option(help="cosine or wsd.")] = "cosine",
    seed: Annotated[int, typer.Option(help="Seed for init and batches.")] = 0,
    compile_model: Annotated[bool, typer.Option("--compile", help="torch.compile the model.")] = False,
    threads: ThreadsOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Train a shape's proxy LM on a budget; report held-out loss, throughput and MFU.

    --study S --trial N takes that trial's shape only: it trains with this command's options,
    not the study's \\[proxy] settings. --json records the settings with the result.
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
    if as_json:  # "threads": the count used; "settings" holds the one asked for (None: chosen)
        print_json({**result.to_dict(), "settings": dataclasses.asdict(settings)})
    else:
        console = stdout()
        console.print(cfg.describe())
        table = Table("result", "value")
        rows = [
            ("status", result.status + (f" ({result.reason})" if result.reason else "")),
            ("val loss (nats/token)", fmt_value(result.val_loss, ".4f")),
            ("bits per byte", fmt_value(result.bits_per_byte, ".4f")),
            ("tokens", f"{result.tokens:,} in {result.steps:,} steps of {batch_size} x {cfg.seq_len}"),
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
            ("device", result.device),
            ("CPU threads", threads_text(result.threads, threads)),
            ("wall time", f"{result.wall_time_s:.1f} s"),
            ("corpus", f"{dataset.name} ({result.corpus_fingerprint})"),
        ]
        for row in rows:
            table.add_row(*row)
        console.print(table)
    if result.status == FAILED:  # the table says it on stdout; stderr gets the one error line too
        typer.echo(error_line(f"the run failed: {result.reason or 'no reason recorded'}"), err=True)
        raise typer.Exit(EXIT_ENVIRONMENT)
