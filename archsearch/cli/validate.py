"""`archsearch validate`: does the proxy rank shapes as longer training does?

The command line of `archsearch.search.validate`, which retrains the calibration set and builds
the report printed here.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from archsearch.cli.common import JsonFlag, StorageOpt, StudyOpt, app, fmt_value, print_json, si, stdout
from archsearch.cli.progress import validate_display
from archsearch.trial import FAILED


@app.command()
def validate(
    study: StudyOpt,
    storage: StorageOpt = None,
    trials: Annotated[
        int, typer.Option(help="Calibration-set size: the Pareto front plus a sample of the rest.")
    ] = 12,
    trial: Annotated[
        list[int] | None, typer.Option("--trial", help="Retrain trial N (repeat); instead of --trials.")
    ] = None,
    multiplier: Annotated[float, typer.Option(help="Long runs train K x the proxy's tokens (> 1).")] = 10.0,
    seeds: Annotated[int, typer.Option(help="Long runs per trial (seeds 0..R-1); > 1 measures noise.")] = 1,
    workers: Annotated[int, typer.Option(help="Long runs at once.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the calibration sample.")] = 0,
    size_beta: Annotated[
        float | None,
        typer.Option(
            help="Beta of the adjusted predictor, loss + extrapolate x change - beta ln(params / 1M), its "
            "extrapolate the study's (default: the study's \\[objectives].size_beta; else 0 when the study "
            "extrapolates; else sd(loss) / sd(ln params) over the set). Report only."
        ),
    ] = None,
    address: Annotated[
        str | None, typer.Option(help="Ray cluster to join (default: start one here).")
    ] = None,
    cpus_per_run: Annotated[float, typer.Option(help="Ray CPUs per long run.")] = 1.0,
    gpus_per_run: Annotated[float, typer.Option(help="Ray GPUs per long run.")] = 0.0,
    as_json: JsonFlag = False,
) -> None:
    """Rank fidelity of a study's proxy: retrain a calibration set for longer and compare rankings.

    Long runs use the study's stored \\[proxy] settings and corpus at --multiplier x its tokens, with
    the cosine schedule; each is stored as it finishes, so a rerun (or one after Ctrl-C, exit 130)
    trains only what is missing. The report is stored with the study.
    """
    from archsearch.search.validate import ValidateOptions, run_validate
    from archsearch.storage import Storage

    options = ValidateOptions(
        study=study, trials=trials, numbers=tuple(trial or ()), multiplier=multiplier, seeds=seeds,
        workers=workers, sample_seed=seed, size_beta=size_beta, address=address, cpus_per_trial=cpus_per_run,
        gpus_per_trial=gpus_per_run,
    )  # fmt: skip
    with Storage.open(storage, create=False) as db, validate_display() as update:
        summary = run_validate(db, options, on_update=update)
    for line in summary.failed:
        typer.echo(f"failed: {line}", err=True)
    if summary.report is None:
        typer.echo(
            f"interrupted: {summary.trained} long runs trained and stored; rerun the same command to "
            "train the rest",
            err=True,
        )
        raise typer.Exit(128 + (summary.signal or 2))
    from archsearch.results.regimes import validation_regime

    if as_json:
        print_json({"study": summary.study, "trained": summary.trained, "skipped": summary.skipped,
                     FAILED: list(summary.failed), **summary.report,
                     "regime": validation_regime(summary.report)})  # fmt: skip
    else:
        _print_validation(summary.study, summary.report)
    typer.echo(f"{summary.trained} long runs trained, {summary.skipped} reused from earlier runs", err=True)


def _print_validation(study: str, report: dict[str, Any]) -> None:
    from archsearch.results.regimes import validation_regime
    from archsearch.search.validate import adjusted_label

    console = stdout()
    seeds = report["seeds"]
    fronts = report["fronts"]
    proxy_front, long_front = set(fronts.get("proxy", ())), set(fronts.get("long", ()))
    adjusted_front = set(fronts.get("adjusted", ()))
    table = Table(
        title=f"Proxy fidelity of {study!r}: {len(report['rows'])} trials retrained at "
        f"{report['multiplier']:g}x the proxy's tokens, {seeds} seed{'s' if seeds > 1 else ''}"
    )
    for column in ("trial", "shape", "params", "FLOPs/token", "proxy loss", "long loss", "fronts"):
        table.add_column(column, justify="left" if column in ("shape", "fronts") else "right")
    for r in report["rows"]:
        members = (("proxy", proxy_front), ("adjusted", adjusted_front), ("long", long_front))
        marks = "/".join(m for m, s in members if r["number"] in s)
        table.add_row(
            str(r["number"]), escape(r["shape"]), si(r["params_total"]), si(r["flops"]),
            f"{r['proxy_loss']:.4f}", fmt_value(r["long_loss"], ".4f"), marks,
        )  # fmt: skip
    console.print(table)
    if "promotion" in report:  # the set was chosen from a front that ranks promoted contenders
        console.print(escape(f"chosen from the study's front, {report['promotion']['said']}"))
    ranks = Table(title="Ranking the long-run loss (seed mean)")
    for column in ("predictor", "Spearman", "Kendall", "iso-params pairs"):
        ranks.add_column(column, justify="left" if column == "predictor" else "right")
    names = {"proxy": "proxy loss", "params": "-params", "flops": "-FLOPs"}
    if "adjusted" in report["correlations"]:  # reports stored before it lack this predictor
        names["adjusted"] = adjusted_label(report)
    objective = report.get("objective", "proxy")  # reports from before size betas: the proxy loss
    names[objective] += ": the study's objective"
    for key, label in names.items():
        c = report["correlations"][key]
        iso = report["iso_pairs"].get(key)
        ranks.add_row(
            label,
            fmt_value(c["spearman"], ".3f"),
            fmt_value(c["kendall"], ".3f"),
            f"{iso[0]}/{iso[1]}" if iso else "-",
        )
    console.print(ranks)
    _print_deciding(console, report.get("deciding"), names)  # reports stored before it lack it
    floor = report["noise_floor"]
    console.print(
        "seed noise floor (pooled sd): " + (f"{floor:.4f}" if floor is not None else "- (one seed)")
    )
    if "shared" in fronts:
        console.print(
            f"fronts (loss vs FLOPs): proxy {len(proxy_front)}, long run {len(long_front)}, shared "
            f"{fronts['shared']}; long-run hypervolume: proxy front {fronts['proxy_long_hypervolume']:.4g}, "
            f"long-run front {fronts['long_long_hypervolume']:.4g} (reference "
            + ", ".join(f"{x:.4g}" for x in fronts["reference"])
            + ", log10 FLOPs)"
        )
    if "adjusted_shared" in fronts:
        console.print(
            f"size-adjusted front: {len(fronts['adjusted'])}, shared with the long-run front "
            f"{fronts['adjusted_shared']}; long-run hypervolume {fronts['adjusted_long_hypervolume']:.4g}"
        )
    console.print(escape(validation_regime(report)))


def _print_deciding(console: Any, deciding: dict[str, Any] | None, names: dict[str, str]) -> None:
    """Each predictor's measures with 95% bootstrap intervals over the trials:
    "- params" / "- FLOPs" its Spearman minus theirs, "front" the long-run front's members its
    front holds, "regret" its knee's long-run loss minus the best at equal or lower FLOPs."""
    if not deciding:
        return
    noise, ceiling = deciding["reference_noise"], deciding["reference_ceiling"]
    table = Table(
        title="With 95% bootstrap intervals over the trials; pairs judged beyond the long runs' seed "
        + (f"noise {noise:.4f}" if deciding["seed_pairs"] else "noise (one seed: every pair)")
    )
    for column in ("predictor", "Spearman", "Kendall", "- params", "- FLOPs", "pairs", "front", "regret"):
        table.add_column(column, justify="left" if column == "predictor" else "right")

    def est(e: dict[str, float]) -> str:
        return f"{fmt_value(e['value'], '.3f')} [{fmt_value(e['low'], '.2f')}, {fmt_value(e['high'], '.2f')}]"

    for key, label in names.items():
        d = deciding[key]
        table.add_row(
            label.split(":")[0], est(d["spearman"]), est(d["kendall"]), est(d["vs_params"]),
            est(d["vs_flops"]), "{}/{}".format(*d["pairs"]), "{}/{}".format(*d["front_recall"]),
            f"{d['knee_regret']:.4f}",
        )  # fmt: skip
    console.print(table)
    if ceiling:
        console.print(
            f"reference ceiling (Spearman of seed 1 against seed 0, {deciding['seed_pairs']} trials): "
            + est(ceiling)
        )
