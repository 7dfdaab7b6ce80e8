"""`archsearch search`: run a search over a space file, storing every trial (the space file is checked
without searching by `archsearch space check`, in `cli.space`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from archsearch.cli.boundary import interrupted
from archsearch.cli.common import (
    JsonFlag,
    StorageOpt,
    app,
    path_value,
    print_json,
)
from archsearch.cli.front_table import print_study_front
from archsearch.cli.progress import search_display


@app.command()
def search(
    space: Annotated[
        Path, typer.Option("--space", help="Search-space TOML file (see examples/).", parser=path_value)
    ],
    study: Annotated[str | None, typer.Option(help="Study name (default: the space file's name).")] = None,
    trials: Annotated[
        int | None, typer.Option(help="Finished trials to reach (default: the file's).")
    ] = None,
    workers: Annotated[int, typer.Option(help="Trials run at once.", min=1)] = 1,
    storage: StorageOpt = None,
    sampler: Annotated[
        str | None, typer.Option(help="tpe, nsga2, random or gp (default: the file's).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Sampler seed (default: the file's).")] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the study (created if missing).")
    ] = False,
    prune: Annotated[
        bool, typer.Option("--prune/--no-prune", help="Stop dominated trials at the rungs.")
    ] = True,
    address: Annotated[
        str | None, typer.Option(help="Ray cluster to join (default: start one here).")
    ] = None,
    cpus_per_trial: Annotated[float, typer.Option(help="Ray CPUs per trial.")] = 1.0,
    gpus_per_trial: Annotated[
        float, typer.Option(help="Ray GPUs per trial (GPU trials queue for GPUs).")
    ] = 0.0,
    retries: Annotated[int, typer.Option(help="Re-runs of a trial whose worker died.", min=0)] = 1,
    replay: Annotated[
        str | None,
        typer.Option(help="First train the complete shapes of this study (same space), in its order."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Search a space: sample shapes with Optuna, train and profile them on Ray, store every trial.

    Ctrl-C or SIGTERM stops dispatching, cancels the running trials (recorded as interrupted and
    re-queued) and exits 130 / 143; `--resume` then continues to the requested number.
    """
    from archsearch.search.driver import RayNodeDiedError, SearchOptions, SetupFailureError, run_search
    from archsearch.search.spec import load_spec
    from archsearch.storage import Storage, StorageUnavailableError

    spec = load_spec(space)
    options = SearchOptions(
        study=spec.name if study is None else study,  # "" is refused, not replaced
        trials=spec.defaults.trials if trials is None else trials,  # 0 is refused, not replaced
        workers=workers,
        sampler=spec.defaults.sampler if sampler is None else sampler,
        seed=spec.defaults.seed if seed is None else seed,
        resume=resume,
        prune=prune and spec.defaults.prune,
        address=address,
        cpus_per_trial=cpus_per_trial,
        gpus_per_trial=gpus_per_trial,
        retries=retries,
        replay=replay,
    )
    spec.space.check_feasible()  # an impossible budget fails here, before anything is written
    spec.preflight()  # so does a corpus or proxy batch no trial could use
    with Storage.open(storage) as db, search_display(options.trials) as update:
        again = resume_command(space, options, db.display_url)
        try:
            summary = run_search(spec, db, options, on_update=update, continue_with=again)
        except (StorageUnavailableError, SetupFailureError, RayNodeDiedError) as exc:  # it can continue
            raise type(exc)(f"{exc}; continue with `{again}`") from None
        except KeyboardInterrupt as exc:
            # A second signal cut the first one's clean-up short: what ran is kept, and a resume
            # sweeps what was left running. A signal before the first trial left no study to go on.
            raise typer.Exit(interrupted(exc, again if _has_study(db, options.study) else None)) from None
    front, promotion = summary.front, summary.promotion
    if as_json:
        report = {"study": summary.study, "counts": summary.progress.counts, "interrupted_by": summary.signal}
        report["promotion"] = dataclasses.asdict(promotion) if promotion else None
        print_json({**report, **(front.to_dict() if front else {"front": []})})
    elif front is not None:
        print_study_front(front)
    else:
        typer.echo(f"no complete trials in study {options.study!r}", err=True)
    if promotion is not None and not as_json:
        budgets = ", ".join(f"{b:,}" for b in promotion.budgets) or "none"
        promoted = ", ".join(map(str, promotion.contenders))
        seeds = f" at {promotion.seeds} seeds each" if promotion.seeds > 1 else ""
        # No contenders: stopped during the stall checks, before the contenders were chosen.
        said = (
            f"promoted trials {promoted} to {budgets} tokens{seeds}"
            if promotion.contenders
            else "promoted no trial yet"
        )
        typer.echo(f"{said} ({promotion.stopped})", err=True)
        if promotion.checked:
            checked = ", ".join(map(str, promotion.checked))
            typer.echo(
                f"stall-checked trials {checked} (their first pass stalled) at more seeds at the proxy's "
                "budget: each ranked by its mean over them",
                err=True,
            )
        typer.echo(cost_line(promotion), err=True)
    if summary.signal is not None:
        typer.echo(
            f"interrupted: {summary.progress.finished} of {options.trials} trials finished; continue with "
            f"`{again}`",
            err=True,
        )
        raise typer.Exit(128 + summary.signal)


def cost_line(promotion: Any) -> str:
    """What promotion cost (`PromotionSummary`), in tokens trained, against the same search without
    it and against training every trial of the first pass at `TENFOLD` x."""
    from archsearch.search.promotion import TENFOLD

    first, more, tenfold = promotion.first_pass_tokens, promotion.promotion_tokens, promotion.tenfold_tokens
    total = first + more
    against = f"{total / first:.2f}x" if first else "-"
    share = f"{100 * total / tenfold:.0f}%" if tenfold else "-"
    # How the promotions ran, as they did: resumed from a kept state or trained from step 0.
    how = [f"{promotion.resumed} resumed", f"{promotion.afresh} from step 0"]
    how += [f"{promotion.unknown} of unknown start, counted as planned"] if promotion.unknown else []
    return (
        f"tokens trained: {first:,} first pass + {more:,} promotion ({', '.join(how)}) = {total:,}; without "
        f"promotion {first:,} ({against} that), every trial at {TENFOLD}x {tenfold:,} ({share} of that)"
    )


def _has_study(db: Any, name: str) -> bool:
    """Whether the database (still) holds study `name`; False where it no longer answers."""
    try:
        return name in db.study_names()
    except Exception:
        return False


def resume_command(space: Path, options: Any, storage: str) -> str:
    """The command that continues this search: the same space, study, database and trial count
    (the storage URL as shown, its password hidden), and the options that change what runs."""
    import shlex

    args = ["archsearch", "search", "--space", str(space), "--study", options.study]
    args += ["--storage", storage, "--trials", str(options.trials), "--resume"]
    args += ["--sampler", options.sampler, "--seed", str(options.seed)]
    if options.workers != 1:
        args += ["--workers", str(options.workers)]
    if not options.prune:
        args.append("--no-prune")
    if options.replay is not None:
        args += ["--replay", options.replay]
    return shlex.join(args)
