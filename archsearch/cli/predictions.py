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
    fit, ratios = found.fit, " and ".join(f"{r:g}" for r in found.ratios)
    lines = [
        f"predicted loss: {p.loss:.4f} nats/token [{p.low:.4f}, {p.high:.4f}] (95% bootstrap over "
        f"rungs), {reach(p)} in non-embedding parameters ({si(found.target_non_embedding)} against "
        f"{si(p.n_low)}-{si(p.n_high)})" + (f", {ratio_reach(found)}" if found.joint else ""),
        f"  from the ladder of trial {trial}: {len(found.rungs)} rungs of {si(min(sizes))} to "
        f"{si(max(sizes))} parameters at {ratios or format(found.tokens_per_param, 'g')} tokens per "
        f"parameter and batch {found.batch_size}, fitted with "
        f"{found.designs - 1} other design{'s' * (found.designs != 2)} (shared E {fit.e:.3f}, "
        f"alpha {fit.alpha:.3f}"
        + (f", B {fit.token_coefficient:.3g}, beta {fit.beta:.3f}: L(N, D))" if found.joint else ")"),
        f"  for {si(found.tokens)} training tokens ({found.tokens_per_param:,.4g} per parameter), on the "
        "ladder's corpus and vocabulary: a loss in that tokenizer's units",
    ]
    seeds = len({r.seed for r in found.rungs})
    if found.by_seed:
        losses = [loss for _, loss in found.by_seed]
        lines.append(
            "  by the rungs' training seed, each seed's rungs fitted alone: "
            + ", ".join(f"seed {seed} {loss:.4f}" for seed, loss in found.by_seed)
            + f" ({max(losses) / min(losses) - 1:.1%} apart; the interval does not carry this)"
        )
    elif seeds > 1 and not found.joint:  # each seed's rungs alone: the law in N's, not the joint one
        lines.append("  by the rungs' training seed: only one seed's rungs can be fitted alone so far")
    elif seeds == 1:
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
    if tokens is not None and not found.joint:
        from archsearch.results.ladder import ratio_note

        if note := ratio_note(found.tokens_per_param, tokens / found.target_params):
            typer.echo(f"note: {note}", err=True)


def ratio_reach(found: Any) -> str:
    """How far a joint prediction reaches in tokens per parameter: "94x past the largest ratio
    laddered (1,875 against 5-20)"."""
    high, yours = max(found.ratios), found.tokens_per_param
    where = (
        f"{yours / high:,.1f}x past the largest ratio laddered"
        if yours > high
        else "within the ratios laddered"
        if yours >= min(found.ratios)
        else f"{min(found.ratios) / yours:,.1f}x below the smallest ratio laddered"
    )
    return f"{where} ({yours:,.4g} tokens per parameter against {min(found.ratios):g}-{high:g})"


def reach(p: Any) -> str:
    """How far a prediction reaches beyond its rungs: "extrapolated 2,381x past the top rung"."""

    def times(x: float) -> str:
        return f"{x:,.0f}x" if x >= 10 else f"{x:.1f}x"

    if p.n > p.n_high:
        return f"extrapolated {times(p.distance)} past the top rung"
    if p.n < p.n_low:
        return f"extrapolated {times(p.n_low / p.n)} below the smallest rung"
    return "interpolated between the rungs"


def print_at_size(
    study: str, target: int, predictions: list[Any], notes: list[str], tokens: int | None = None
) -> None:
    """`pareto --at-size`: the laddered designs ranked by the loss predicted at `target` (and
    `tokens`: by the joint law where designs are laddered at two ratios or more)."""
    from archsearch.results.ladder import UNPINNED_FLOOR

    console = stdout()
    first = predictions[0][1] if predictions else None
    if first is not None and first.joint:
        recipe = (
            f" (L(N, D) at {si(tokens)} tokens, {first.tokens_per_param:,.4g} per parameter; batch "
            f"{first.batch_size})"
        )
    elif first is not None:
        recipe = f" ({first.tokens_per_param:g} tokens per parameter, batch {first.batch_size})"
    else:
        recipe = ""
    table = Table(
        title=f"Laddered designs of {study!r} at {si(target)} parameters, ranked by predicted loss{recipe}"
    )
    columns = ["rank", "trial", "trial's shape", "params at size", "predicted", "95% interval", "past top"]
    joint = first is not None and first.joint
    for column in [*columns, *(["past ratio"] if joint else []), "rungs"]:
        table.add_column(column, justify="left" if column == "trial's shape" else "right")
    for rank, (trial, found) in enumerate(predictions, 1):
        p = found.prediction
        past = [f"{found.tokens_per_param / max(found.ratios):,.1f}x"] if joint else []
        table.add_row(
            str(rank), str(trial.number), escape(trial.config.describe()), si(found.target_params),
            f"{p.loss:.4f}", f"[{p.low:.4f}, {p.high:.4f}]", f"{p.distance:,.1f}x", *past,
            str(len(found.rungs)),
        )  # fmt: skip
    console.print(table)
    for note in notes:
        typer.echo(f"left out: {note}", err=True)
    if note := at_size_ratio_note(target, predictions, tokens):
        typer.echo(f"note: {note}", err=True)
    if first is not None and not first.fit.floor_pinned:
        typer.echo(UNPINNED_FLOOR, err=True)


def at_size_ratio_note(target: int, predictions: list[Any], tokens: int | None) -> str | None:
    """The one-ratio note (`ratio_note`) where `--tokens` was given and no design has two ratios."""
    from archsearch.results.ladder import ratio_note

    if tokens is None or not predictions or predictions[0][1].joint:
        return None
    return ratio_note(predictions[0][1].tokens_per_param, tokens / target)


def at_size_dict(
    study: str, target: int, predictions: list[Any], notes: list[str], tokens: int | None = None
) -> dict[str, Any]:
    return {
        "study": study,
        "at_size": target,
        **({"tokens": tokens, "note": at_size_ratio_note(target, predictions, tokens)} if tokens else {}),
        "ranked": [{"rank": i, **found.to_dict()} for i, (_, found) in enumerate(predictions, 1)],
        "left_out": notes,
    }


def pareto_at_size(
    studies: list[str],
    at_size: str | None,
    front_options: tuple[Any, ...],
    storage: str | None,
    as_json: bool,
    tokens: str | None = None,
) -> None:
    """`pareto --at-size N [--tokens D]`: one study's laddered designs ranked at N (not its front)."""
    from archsearch.results.ladder import predict_at_size
    from archsearch.storage import Storage
    from archsearch.units import parse_count

    if at_size is None:
        raise ConfigError("--tokens only goes with --at-size")
    if len(studies) != 1:
        raise ConfigError("--at-size ranks one study's ladders: give one --study")
    if any(option is not None for option in front_options):
        raise ConfigError(
            "--at-size ranks ladders, not the front: --objectives, --reference, --loss and --plot do not "
            "apply"
        )
    target = parse_count(at_size, "--at-size")
    train_tokens = parse_count(tokens, "--tokens") if tokens is not None else None
    with Storage.open(storage, read_only=True) as db:
        ranked, notes = predict_at_size(db, studies[0], target, tokens=train_tokens)
    if as_json:
        print_json(at_size_dict(studies[0], target, ranked, notes, train_tokens))
    else:
        print_at_size(studies[0], target, ranked, notes, train_tokens)
