"""`archsearch ladder`: a design trained at several sizes, and the law fitted across them.

The command line of `archsearch.results.ladder` (the law and what it predicts) and of the runs
that train the rungs (`search.ladder_runs`).

What the law predicts at your size is printed by `export --scale-to` and `pareto --at-size`
(`cli.predictions`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from archsearch.cli.common import JsonFlag, StorageOpt, StudyOpt, app, path_value, print_json, si, stdout
from archsearch.cli.progress import live_display
from archsearch.errors import ConfigError
from archsearch.trial import FAILED


@app.command()
def ladder(
    study: StudyOpt,
    trial: Annotated[
        list[int] | None, typer.Option("--trial", help="Ladder trial N's design (repeat for several).")
    ] = None,
    knee: Annotated[bool, typer.Option("--knee", help="Ladder the knee of the Pareto front.")] = False,
    front: Annotated[bool, typer.Option("--front", help="Ladder every member of the Pareto front.")] = False,
    rungs: Annotated[int, typer.Option(help="Sizes per design, each --spacing x the one below (>= 2).")] = 4,
    spacing: Annotated[
        float,
        typer.Option(help="Each rung's size over the one below's (1.414: twice the rungs in one span)."),
    ] = 2.0,
    top: Annotated[
        str | None,
        typer.Option(help="Total parameters of the largest rung (500k, 2M); default the trial's own size."),
    ] = None,
    tokens_per_param: Annotated[
        str,
        typer.Option(
            help="Training tokens per parameter of every rung, best the ratio your model will train at "
            "(default 20, Chinchilla's; the law was measured at 10-200 on public GPU runs, the OLMo-2 "
            "ladder); a comma list (5,20) ladders each ratio and fits L(N, D) across them."
        ),
    ] = "20",
    batch_size: Annotated[
        int | None,
        typer.Option(
            help="Sequences per step of every rung (default: the study's proxy batch, lowered so the "
            "smallest rung trains 500 steps: on 0.06-2M CPU rungs fewer steps missed 4x out by 5.2%, "
            "not 1.4%)."
        ),
    ] = None,
    workers: Annotated[int, typer.Option(help="Rungs trained at once.")] = 1,
    seed: Annotated[int, typer.Option(help="Training seed of the rungs.")] = 0,
    address: Annotated[
        str | None, typer.Option(help="Ray cluster to join (default: start one here).")
    ] = None,
    cpus_per_run: Annotated[float, typer.Option(help="Ray CPUs per rung.")] = 1.0,
    gpus_per_run: Annotated[float, typer.Option(help="Ray GPUs per rung.")] = 0.0,
    plot: Annotated[
        Path | None,
        typer.Option(help="Write the ladder curves (rungs, fit, 95% band) to FILE.png.", parser=path_value),
    ] = None,
    storage: StorageOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Train chosen designs at several sizes and fit L(N) = E + A_d N^-alpha across them.

    Each rung keeps the trial's design with widths and depth re-chosen as --scale-to does, and trains
    on the study's corpus for --tokens-per-param x its parameters at --batch-size, cosine schedule;
    the ratio and the batch make the ladder's recipe, one law per recipe. Rungs are stored
    as they finish: a rerun (or one after Ctrl-C, exit 130) trains only what is missing. Then
    `export --scale-to` prints the predicted loss and `pareto --at-size` ranks the laddered designs.
    Several ratios (--tokens-per-param 5,20) train a ladder at each and fit L(N, D) = E + A_d N^-alpha
    + B D^-beta across them too, so `--tokens` predicts at your own tokens per parameter.
    """
    from archsearch.fileio import check_writable
    from archsearch.results.ladder import fit_study_ladders
    from archsearch.search.ladder_plan import (
        LadderOptions,
        few_steps_note,
        merged_rungs_note,
        parse_ratios,
        plan_ladders,
    )
    from archsearch.search.ladder_runs import run_ladder
    from archsearch.storage import Storage, database_files
    from archsearch.units import parse_count

    ratios = parse_ratios(tokens_per_param)
    if plot is not None and plot.suffix.lower() != ".png":
        raise ConfigError(f"cannot plot ladders to {plot.name!r}: use a .png file")
    if plot is not None and len(ratios) > 1:
        raise ConfigError("--plot draws the ladders of one ratio: give one --tokens-per-param")
    if plot is not None:  # before any rung trains: a plot below a file failed after the training
        check_writable(plot, inputs=database_files(storage))

    base = LadderOptions(
        study=study, numbers=tuple(trial or ()), knee=knee, front=front, rungs=rungs, spacing=spacing,
        top=parse_count(top, "--top") if top is not None else None, tokens_per_param=ratios[0],
        batch_size=batch_size, seed=seed, workers=workers, address=address, cpus_per_trial=cpus_per_run,
        gpus_per_trial=gpus_per_run,
    )  # fmt: skip
    every = [dataclasses.replace(base, tokens_per_param=ratio) for ratio in ratios]
    summaries = []
    with Storage.open(storage, create=False) as db:
        every, plans, batch_note = plan_ladders(db, every)  # every ratio checked before any trains
        if batch_note:
            typer.echo(batch_note, err=True)
        for options, planned in zip(every, plans, strict=True):
            for note in (merged_rungs_note(planned, rungs), few_steps_note(planned)):
                if note:
                    typer.echo(note, err=True)
            with ladder_display() as update:
                summary = run_ladder(
                    db, options, fit_rungs=fit_study_ladders, on_update=update, planned=planned
                )
            summaries.append(summary)
            if summary.signal is not None:
                typer.echo(
                    f"interrupted: {sum(s.trained for s in summaries)} rungs trained and stored; rerun the "
                    "same command to train the rest",
                    err=True,
                )
                raise typer.Exit(128 + summary.signal)
    _report(summaries, plot, as_json)


def _report(summaries: list[Any], plot: Path | None, as_json: bool) -> None:
    """Each ratio's ladders and fit as one ratio's always were; with several, the joint law too."""
    from archsearch.results.ladder import fit_study_ladders_joint, joint_line
    from archsearch.results.ladder_fit import LadderFitError

    joint, joint_error = None, None
    if len(summaries) > 1:
        try:
            joint = fit_study_ladders_joint([r for s in summaries for r in s.rungs])
        except LadderFitError as exc:
            joint_error = str(exc)
    failed = [line for s in summaries for line in s.failed]
    busy = [name for s in summaries for name in s.busy]
    for line in failed:
        typer.echo(f"failed: {line}", err=True)
    if as_json and len(summaries) == 1:
        print_json(_summary_dict(summaries[0]))
    elif as_json:
        print_json(
            {
                "ladders": [_summary_dict(s) for s in summaries],
                "joint_fit": joint.to_dict() if joint is not None else None,
                "joint_fit_error": joint_error,
            }
        )
    else:
        for summary in summaries:
            _print_ladders(summary)
        if joint is not None:
            ratios = [s.tokens_per_param for s in summaries]
            typer.echo(joint_line(joint, ratios, summaries[0].batch_size))  # one line, never wrapped
    for summary in summaries:
        if summary.fit_error:
            typer.echo(f"no fit: {summary.fit_error}", err=True)
    if joint_error:
        typer.echo(f"no joint fit: {joint_error}", err=True)
    summary = summaries[0]
    if plot is not None and summary.fit is not None:
        from archsearch.results.ladder_plot import plot_ladders

        plot_ladders(summary.fit, plot)
        typer.echo(f"wrote {plot}", err=True)
    trained, skipped = sum(s.trained for s in summaries), sum(s.skipped for s in summaries)
    typer.echo(f"{trained} rungs trained, {skipped} reused from earlier runs", err=True)
    if busy:  # not failed: the ladder holding them stores them; a rerun then fits them
        typer.echo(
            f"note: {len(busy)} rung{'s' * (len(busy) != 1)} left to another ladder "
            f"training {'them' if len(busy) != 1 else 'it'} now ({', '.join(busy[:3])}"
            f"{', ...' if len(busy) > 3 else ''}); rerun the same command once it finishes to fit "
            "every rung",
            err=True,
        )
    if failed:  # the ladder is incomplete: not a success, even when every rung failed
        typer.echo(
            f"error: {len(failed)} rung{'s' * (len(failed) != 1)} failed (above); rerun the "
            "same command to train them again",
            err=True,
        )
        raise typer.Exit(1)


def ladder_display() -> Any:
    """A ladder's progress (`LadderProgress` snapshots), counted in stored rungs."""

    def text(p: Any) -> str:
        failed = f", {p.failed} failed" if p.failed else ""
        return f"{p.done}/{p.total} rungs stored{failed}; {p.last}"

    return live_display("ladder", text, lambda p: (p.done, p.total))


def _summary_dict(summary: Any) -> dict[str, Any]:
    from archsearch.results.ladder import seed_fits, seed_predictions

    fit = summary.fit
    fits = seed_fits(summary.rungs) if fit is not None else {}
    at_4x = [
        {
            **p.to_dict(),
            "by_seed": {str(s): v for s, v in seed_predictions(summary.rungs, p.design, p.n, fits)},
        }
        for p in (_at_4x(fit) if fit is not None else [])
    ]
    return {
        "study": summary.study,
        "tokens_per_param": summary.tokens_per_param,
        "batch_size": summary.batch_size,
        "trained": summary.trained,
        "skipped": summary.skipped,
        FAILED: list(summary.failed),
        "busy": list(summary.busy),
        "rungs": [
            {
                "trial": r.trial_number, "target_params": r.target_params, "params_total": r.params_total,
                "params_non_embedding": r.params_non_embedding, "tokens": r.tokens, "loss": r.val_loss,
                "shape": r.config.describe(), "config": r.config.to_dict(), "seed": r.seed,
                "wall_time_s": r.wall_time_s,
            }
            for r in summary.rungs
        ],
        "fit": fit.to_dict() if fit is not None else None,
        "fit_error": summary.fit_error,
        "at_4x_top": at_4x,  # each with the prediction of each training seed's rungs alone
    }  # fmt: skip


def _at_4x(fit: Any) -> list[Any]:
    """Each design's prediction at 4x its largest rung, the distance `benchmarks/ladder_accuracy.py`
    checks."""
    return [fit.predict(d, 4 * max(p.n for p in fit.points if p.design == d)) for d in fit.designs]


def _print_ladders(summary: Any) -> None:
    from archsearch.results.ladder import UNPINNED_FLOOR, backtest_line, seed_fits, seed_predictions

    console = stdout()
    fit = summary.fit
    table = Table(
        title=f"Ladders of {summary.study!r} at {summary.tokens_per_param:g} tokens per parameter, batch "
        f"{summary.batch_size}"
    )
    for column in ("trial", "shape", "params", "non-emb", "tokens", "loss", "fitted", "residual"):
        table.add_column(column, justify="left" if column == "shape" else "right")
    for r in summary.rungs:
        fitted = fit is not None and r.trial_number in fit.designs
        f = float(fit.loss(r.trial_number, r.params_non_embedding)) if fitted else None
        table.add_row(
            str(r.trial_number), escape(r.config.describe()), si(r.params_total), si(r.params_non_embedding),
            si(r.tokens), f"{r.val_loss:.4f}", f"{f:.4f}" if f is not None else "-",
            f"{f - r.val_loss:+.4f}" if f is not None else "-",
        )  # fmt: skip
    console.print(table)
    if fit is None:
        return
    d = fit.to_dict()
    e_low, e_high = d["E_interval"] or (float("nan"),) * 2
    a_low, a_high = d["alpha_interval"] or (float("nan"),) * 2
    console.print(
        f"law: L(N) = E + A_d N^-alpha over {len(fit.designs)} designs, N non-embedding parameters: "
        f"E {fit.e:.4f} [{e_low:.3f}, {e_high:.3f}], alpha {fit.alpha:.4f} [{a_low:.3f}, {a_high:.3f}] "
        f"(95% bootstrap over rungs, {d['resamples']} resamples); residuals rms {d['rmse']:.4f}, worst "
        f"{d['max_abs_relative_residual']:.2%}"
    )
    fits = seed_fits(summary.rungs)
    for p in _at_4x(fit):
        by_seed = [loss for _, loss in seed_predictions(summary.rungs, p.design, p.n, fits)]
        low, high = (min(by_seed), max(by_seed)) if by_seed else (0.0, 0.0)
        spread = f"; by the rungs' seed {low:.4f}-{high:.4f} ({high / low - 1:.1%} apart)" if by_seed else ""
        console.print(
            f"trial {p.design}: A {fit.coefficient(p.design):.4g}; at 4x its top rung ({si(p.n)} "
            f"non-embedding): {p.loss:.4f} [{p.low:.4f}, {p.high:.4f}], extrapolated{spread}"
        )
    if line := backtest_line(fit):
        console.print(line)
    if not fit.floor_pinned:
        typer.echo(UNPINNED_FLOOR, err=True)
