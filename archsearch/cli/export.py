"""`archsearch export`: a trial's shape in the files a real trainer reads.

The command line of `archsearch.space.export`, which holds the formats and writes nothing; with
`--scale-to` the shape is first scaled by `archsearch.results.scale_ranking`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from archsearch.cli.common import StorageOpt, StudyOpt, app, path_value
from archsearch.cli.serving_lines import (
    CacheDtypeOpt,
    GenLenOpt,
    MemoryOpt,
    PromptLenOpt,
    ServeBatchOpt,
    ServeDeviceOpt,
    WeightDtypeOpt,
)
from archsearch.errors import ConfigError
from archsearch.fileio import check_writable


@app.command()
def export(
    study: StudyOpt,
    fmt: Annotated[str, typer.Option("--format", help="hf, litgpt, nanogpt or json.")],
    output: Annotated[
        Path,
        typer.Option(
            "--output", "-o", help="Folder to create (absent or empty); all or nothing.", parser=path_value
        ),
    ],
    trial: Annotated[int | None, typer.Option(help="Export trial number N.")] = None,
    knee: Annotated[bool, typer.Option("--knee", help="Export the knee of the Pareto front.")] = False,
    best_under_flops: Annotated[
        str | None,
        typer.Option(
            help="Export the trial with the lowest loss objective (the study's: adjusted when it has a "
            "size_beta or an extrapolate) with forward FLOPs/token <= F (e.g. 1e9 or 2G)."
        ),
    ] = None,
    front: Annotated[
        bool, typer.Option("--front", help="Export every front member to trial-N/ folders, plus index.json.")
    ] = False,
    exportable: Annotated[
        bool,
        typer.Option(
            "--exportable",
            help="Choose among the trials the format represents: the knee, best or front of those.",
        ),
    ] = False,
    scale_to: Annotated[
        str | None,
        typer.Option(
            "--scale-to",
            help="Keep the one chosen trial's design at this many parameters (1.3B, 1.3G, 350M), the "
            "widths fastest on --device in the roofline model.",
        ),
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="With --scale-to: a catalogued GPU (see `devices`); default h100-sxm.")
    ] = None,
    vocab: Annotated[
        int | None,
        typer.Option(
            help="With --scale-to: your tokenizer's vocabulary, padded up to a multiple of 64.", min=1
        ),
    ] = None,
    seq_len: Annotated[
        int | None,
        typer.Option(help="With --scale-to: the context to train at (default 2048, not the proxy's).", min=1),
    ] = None,
    batch: Annotated[
        int | None,
        typer.Option(help="With --scale-to: sequences per micro-batch (default 16384 tokens' worth).", min=1),
    ] = None,
    tokens: Annotated[
        str | None,
        typer.Option(
            help="With --scale-to: the tokens you will train on (26B); where the trial is laddered at two "
            "ratios or more, the loss is predicted at them (L(N, D)), else at the nearest ladder's ratio."
        ),
    ] = None,
    serve_batch: ServeBatchOpt = None,
    prompt_len: PromptLenOpt = None,
    gen_len: GenLenOpt = None,
    weight_dtype: WeightDtypeOpt = None,
    cache_dtype: CacheDtypeOpt = None,
    serve_device: ServeDeviceOpt = None,
    memory: MemoryOpt = None,
    storage: StorageOpt = None,
) -> None:
    """A trial's shape for a real trainer: Hugging Face config, litgpt YAML, nanoGPT GPTConfig or JSON.

    A shape the format cannot represent exactly is refused with the reason (exit 2, nothing
    written); --exportable picks among the trials it can represent instead. With --front the
    representable members are written and the refusals listed in index.json and on stderr; exit 2
    only when none is representable. With --scale-to, a study searched with a \\[serve] table (or
    the serving flags) also gets the scaled shape's KV cache, weights, largest batch and modelled
    prefill and decode, printed and in the provenance (`scaled.serve`).
    """
    from archsearch.cli.serving_lines import print_scaled_serve, serve_changes
    from archsearch.fileio import write_tree
    from archsearch.search.selection import Choice, export_plan, select
    from archsearch.storage import Storage

    choice = Choice(fmt, trial, knee, best_under_flops, front, exportable)
    request = _scale_request(scale_to, device, vocab, seq_len, batch, front)
    train_tokens = _tokens(tokens, scale_to)
    serving = serve_changes(
        scale_to is not None,
        dict(
            batch=serve_batch, prompt_len=prompt_len, gen_len=gen_len, weight_dtype=weight_dtype,
            cache_dtype=cache_dtype, device=serve_device, memory_bytes=memory,
        ),
    )  # fmt: skip
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ConfigError(f"--output {output} exists and is not an empty folder")
    check_writable(output, folder=True)  # before the study is read and the configs built
    with Storage.open(storage, read_only=True) as db:
        selection = select(db, study, choice)
        rungs = db.ladder_rungs(study) if request is not None else []
    if selection.ranking is not None:  # chosen among promoted contenders: say at which budget
        from archsearch.search.promotion import ranking_line

        typer.echo(f"note: {ranking_line(selection.ranking)}", err=True)
    if request is not None:
        from archsearch.results.scale_ranking import scaled_export, study_scenario

        scenario = study_scenario(selection.study, serving, request.device)
        result, plan = scaled_export(selection, choice, request, scenario)
        write_tree(output, plan.tree)
        entry = plan.index[0]
        typer.echo(f"{output}: trial {entry['number']} scaled to {scale_to} as {entry['target']}")
        _print_scaled(result)
        if result.serve is not None:
            print_scaled_serve(result.serve, scale_to)
        from archsearch.cli.predictions import print_scaled_prediction

        print_scaled_prediction(rungs, study, entry["number"], result.chosen.config, train_tokens)
        for note in entry["notes"]:
            typer.echo(f"note: {note}", err=True)
        return
    plan = export_plan(selection, choice)
    for entry in plan.index:
        if entry["refused"] is not None:
            typer.echo(
                f"refused: trial {entry['number']} cannot be exported as {fmt}: {entry['refused']}", err=True
            )
        for note in entry["notes"]:
            typer.echo(f"note: trial {entry['number']}: {note}", err=True)
    write_tree(output, plan.tree)
    for entry in plan.index:
        if entry["folder"] is not None:
            where = output / entry["folder"] if entry["folder"] else output
            typer.echo(f"{where}: trial {entry['number']} as {entry['target']}")


def _tokens(tokens: str | None, scale_to: str | None) -> int | None:
    """`--tokens`, parsed before the database is opened; only with `--scale-to`."""
    if tokens is None:
        return None
    if scale_to is None:
        raise ConfigError("--tokens only goes with --scale-to")
    from archsearch.units import parse_count

    return parse_count(tokens, "--tokens")


def _scale_request(
    scale_to: str | None,
    device: str | None,
    vocab: int | None,
    seq_len: int | None,
    batch: int | None,
    front: bool,
) -> Any:
    """The `--scale-to` request, checked before the database is opened; None without it."""
    if scale_to is None:
        given = [
            f
            for f, v in (("--device", device), ("--vocab", vocab), ("--seq-len", seq_len), ("--batch", batch))
            if v is not None
        ]
        if given:
            raise ConfigError(f"{', '.join(given)} only go with --scale-to")
        return None
    if front:
        raise ConfigError(
            "--scale-to scales one trial: give --trial N, --knee or --best-under-flops F, not --front"
        )
    from archsearch.results.scale_ranking import DEFAULT_SEQ_LEN, ScaleRequest
    from archsearch.units import parse_count

    target = parse_count(scale_to, "--scale-to")
    return ScaleRequest(
        target, "h100-sxm" if device is None else device, seq_len or DEFAULT_SEQ_LEN, vocab, batch
    )


def _print_scaled(result: Any) -> None:
    """The scaled shape, its exact size, its modelled speed and what alignment gained."""
    from archsearch.evaluators.catalogue import FITTED

    chosen, request = result.chosen, result.request
    cfg = chosen.config
    off = chosen.params / request.target_params - 1
    fit = FITTED.get(request.device)
    what = "kernel sum" if fit is None else "eager step: kernels plus launch overhead, fitted to real steps"
    lines = [
        f"shape: {cfg.describe()}, vocab {cfg.vocab_size}, seq_len {cfg.seq_len}",
        f"parameters: {chosen.params:,} (exact; target {request.target_params:,}, {off:+.1%})",
        f"modelled on {result.device_name}, bf16, micro-batch {request.micro_batch} x {cfg.seq_len} "
        f"({what}): step {chosen.step_time_s * 1e3:.1f} ms, {chosen.tokens_per_second:,.0f} tokens/s, "
        f"MFU {chosen.mfu:.1%} of {result.peak_flops / 1e12:.1f} TFLOP/s",
    ]
    if fit is None:
        low, high = result.eager_mfu_range
        lines.append(
            f"  an eager PyTorch step measured 1.4-1.9x its kernel sum on H100: "
            f"expect MFU {low:.0%}-{high:.0%}"
        )
    else:
        lines.append(
            f"  fitted on {fit.shapes} shapes of {fit.data}: a shape left out of the fit was predicted "
            f"within {fit.holdout_median:.0%} at the median, {fit.holdout_worst:.0%} at worst"
        )
    memory = (
        f"memory: activations {result.activation_bytes / 1e9:,.1f} GB at micro-batch {request.micro_batch} "
        f"(bf16, flash attention), weights, gradients and Adam state {result.state_bytes / 1e9:,.1f} GB"
    )
    lines.append(
        memory + (f"; the device holds {result.memory_bytes / 1e9:.0f} GB" if result.memory_bytes else "")
    )
    lines.append(
        f"chosen among {len(result.closest)} of {result.considered} candidates within "
        f"{request.tolerance:.0%} (the closest to the target, most tokens/s)"
    )
    for g in result.gains:
        lines.append(
            f"alignment: {g.dimension} {g.naive} -> {g.aligned}: modelled step {g.naive_step_s * 1e3:.1f} ms "
            f"-> {g.aligned_step_s * 1e3:.1f} ms ({g.gain_pct:+.1f}%)"
        )
    typer.echo("\n".join(lines))
    for note in result.memory_notes():
        typer.echo(f"note: {note}", err=True)
    if request.vocab_size is None:
        typer.echo(
            f"note: vocab_size {cfg.vocab_size} is the trial's"
            + (" (bytes)" if cfg.vocab_size == 256 else "")
            + "; give your tokenizer's with --vocab (e.g. --vocab 50257 pads to 50304)",
            err=True,
        )
