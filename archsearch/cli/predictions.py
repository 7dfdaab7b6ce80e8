"""The ladder's predictions at the user's size: its lines in `export --scale-to` and the table of
`pareto --at-size` (the ladders themselves: `cli.ladder`)."""

from __future__ import annotations

from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from archsearch.cli.common import print_json, si, stdout
from archsearch.errors import ConfigError


def print_scaled_prediction(rungs: Any, study: str, trial: int, target: Any, tokens: int | None) -> None:
    """`export --scale-to`'s ladder lines: the predicted loss at the scaled shape, its interval, the
    rungs it rests on and how far it extrapolates; a hint on stderr when the trial has no ladder."""
    from archsearch.results.ladder import UNPINNED_FLOOR, predict_trial
    from archsearch.results.ladder_fit import LadderFitError

    try:
        found = predict_trial(rungs, trial, target, tokens)
    except LadderFitError as exc:
        typer.echo(f"ladder: no prediction for trial {trial}: {exc}", err=True)
        return
    if found is None:
        typer.echo(
            f"note: no ladder of trial {trial}: `archsearch ladder --study {study} --trial {trial}` "
            "predicts the loss at this size",
            err=True,
        )
        return
    p, sizes = found.prediction, [r.params_total for r in found.rungs]
    lines = [
        f"predicted loss: {p.loss:.4f} nats/token [{p.low:.4f}, {p.high:.4f}] (95% bootstrap over "
        f"rungs), {reach(p)} in non-embedding parameters ({si(found.target_non_embedding)} against "
        f"{si(p.n_low)}-{si(p.n_high)})",
        f"  from the ladder of trial {trial}: {len(found.rungs)} rungs of {si(min(sizes))} to "
        f"{si(max(sizes))} parameters at {found.tokens_per_param:g} tokens per parameter and batch "
        f"{found.batch_size}, fitted with "
        f"{found.designs - 1} other design{'s' * (found.designs != 2)} (shared E {found.fit.e:.3f}, "
        f"alpha {found.fit.alpha:.3f})",
        f"  for {si(found.tokens)} training tokens ({found.tokens_per_param:g} per parameter), on the "
        "ladder's corpus and vocabulary: a loss in that tokenizer's units",
    ]
    if found.by_seed:
        losses = [loss for _, loss in found.by_seed]
        lines.append(
            "  by the rungs' training seed, each seed's rungs fitted alone: "
            + ", ".join(f"seed {seed} {loss:.4f}" for seed, loss in found.by_seed)
            + f" ({max(losses) / min(losses) - 1:.1%} apart; the interval does not carry this)"
        )
    elif len({r.seed for r in found.rungs}) > 1:
        lines.append("  by the rungs' training seed: only one seed's rungs can be fitted alone so far")
    else:
        lines.append(
            "  one training seed: the interval does not carry how far another seed's rungs move the "
            "prediction (5-14% 4x past the top rung on 12 tiny designs at 3 seeds); the same `archsearch "
            "ladder` with `--seed 1` measures it"
        )
    if tested := found.fit.backtest().get(trial):
        lines.append(
            f"  backtest: its top rung, predicted from the rungs below it ({tested[1]:.1f}x out) by the law "
            f"fitted without every design's top rung: {tested[0]:+.1%}"
        )
    typer.echo("\n".join(lines))
    if not found.fit.floor_pinned:
        typer.echo(UNPINNED_FLOOR, err=True)
    if tokens is not None and abs(tokens / found.target_params / found.tokens_per_param - 1) > 0.05:
        typer.echo(
            f"note: --tokens {si(tokens)} is {tokens / found.target_params:.3g} tokens per parameter; the "
            f"nearest ladder trained {found.tokens_per_param:g}, so the prediction is for "
            f"{si(found.tokens)} tokens",
            err=True,
        )


def reach(p: Any) -> str:
    """How far a prediction reaches beyond its rungs: "extrapolated 2,381x past the top rung"."""

    def times(x: float) -> str:
        return f"{x:,.0f}x" if x >= 10 else f"{x:.1f}x"

    if p.n > p.n_high:
        return f"extrapolated {times(p.distance)} past the top rung"
    if p.n < p.n_low:
        return f"extrapolated {times(p.n_low / p.n)} below the smallest rung"
    return "interpolated between the rungs"


def print_at_size(study: str, target: int, predictions: list[Any], notes: list[str]) -> None:
    """`pareto --at-size`: the laddered designs ranked by the loss predicted at `target`."""
    from archsearch.results.ladder import UNPINNED_FLOOR

    console = stdout()
    recipe = (predictions[0][1].tokens_per_param, predictions[0][1].batch_size) if predictions else None
    table = Table(
        title=f"Laddered designs of {study!r} at {si(target)} parameters, ranked by predicted loss"
        + (f" ({recipe[0]:g} tokens per parameter, batch {recipe[1]})" if recipe is not None else "")
    )
    for column in (
        "rank",
        "trial",
        "trial's shape",
        "params at size",
        "predicted",
        "95% interval",
        "past top",
        "rungs",
    ):
        table.add_column(column, justify="left" if column == "trial's shape" else "right")
    for rank, (trial, found) in enumerate(predictions, 1):
        p = found.prediction
        table.add_row(
            str(rank), str(trial.number), escape(trial.config.describe()), si(found.target_params),
            f"{p.loss:.4f}", f"[{p.low:.4f}, {p.high:.4f}]", f"{p.distance:,.1f}x", str(len(found.rungs)),
        )  # fmt: skip
    console.print(table)
    for note in notes:
        typer.echo(f"left out: {note}", err=True)
    if predictions and not predictions[0][1].fit.floor_pinned:
        typer.echo(UNPINNED_FLOOR, err=True)


def at_size_dict(study: str, target: int, predictions: list[Any], notes: list[str]) -> dict[str, Any]:
    return {
        "study": study,
        "at_size": target,
        "ranked": [{"rank": i, **found.to_dict()} for i, (_, found) in enumerate(predictions, 1)],
        "left_out": notes,
    }


def pareto_at_size(
    studies: list[str], at_size: str, front_options: tuple[Any, ...], storage: str | None, as_json: bool
) -> None:
    """`pareto --at-size N`: one study's laddered designs ranked at N (not its front)."""
    from archsearch.results.ladder import predict_at_size
    from archsearch.storage import Storage
    from archsearch.units import parse_count

    if len(studies) != 1:
        raise ConfigError("--at-size ranks one study's ladders: give one --study")
    if any(option is not None for option in front_options):
        raise ConfigError(
            "--at-size ranks ladders, not the front: --objectives, --reference, --loss and --plot do not "
            "apply"
        )
    target = parse_count(at_size, "--at-size")
    with Storage.open(storage, read_only=True) as db:
        ranked, notes = predict_at_size(db, studies[0], target)
    if as_json:
        print_json(at_size_dict(studies[0], target, ranked, notes))
    else:
        print_at_size(studies[0], target, ranked, notes)
