"""How much the rungs' training seeds move a ladder's prediction 4x past its top rung (issue 23).

Reads a `ladder_accuracy.py` record (its designs and their real runs) and the study's database
(every stored rung of the recipe, of every seed: `archsearch ladder ... --seed S` stores each seed's
rungs beside the others), fits the shipped law (`results.ladder.fit_study_ladders`: E and alpha
shared, A per design) over the rungs of each subset of the stored seeds, and scores each fit
against the same real runs: E and alpha, the median absolute error (its 95% bootstrap interval over
designs) and the worst, and how many real losses fall inside the fit's 95% intervals. The spread
over the subsets is how much the prediction owes to which seeds the rungs happened to get. Where a
denser ladder stored sizes between the 2x ones (`archsearch ladder --rungs 7 --spacing 1.41421356`),
every subset is fitted twice: on the 4 sizes 2x apart, and on all of them.

    python benchmarks/ladder_seeds.py           # the 12 designs, seeds 0-2 (about a minute)
    python benchmarks/ladder_seeds.py --smoke   # seeds 0 and 1 only
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

from ladder_heads import score  # benchmarks/ is this script's folder

from archsearch.results.ladder import fit_study_ladders
from archsearch.results.ladder_fit import LadderFit, RungPoint, fit_ladders
from archsearch.search.ladder_plan import rung_targets
from archsearch.storage import Storage

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
RECORD = DATA / "ladder_accuracy_tp5_b4_b16_d12_seeds3.json"
DB = DATA / "ladder_tp5" / "ladder-tiny-hf.db"


def stored_rungs(db: Path, study: str, trials: set[int], ratio: float, batch: int) -> list[Any]:
    """The stored rungs of `trials` at the recipe (`ratio` tokens per parameter, `batch`), every
    seed, in the order `Storage.ladder_rungs` gives them to `fit_study_ladders` (the bootstrap
    draws rungs by position: in this order a fit is the one `ladder_accuracy.py` makes)."""
    with Storage.open(f"sqlite:///{db}", read_only=True) as storage:
        return [r for r in storage.ladder_rungs(study, ratio, batch) if r.trial_number in trials]


def fit_total(rungs: list[Any]) -> LadderFit:
    """The shipped law with N the rungs' total parameters (`preregistered_total_params.md`), as
    `fit_study_ladders` builds its points otherwise (designs of 2 sizes or more, in the same order)."""
    sizes: dict[int, set[int]] = {}
    for r in rungs:
        sizes.setdefault(r.trial_number, set()).add(r.params_total)
    return fit_ladders(
        RungPoint(r.trial_number, float(r.params_total), r.val_loss)
        for r in rungs
        if len(sizes[r.trial_number]) >= 2
    )


def stored_rung_arguments(parser: argparse.ArgumentParser, record: Path = RECORD) -> None:
    """The flags that name a `ladder_accuracy.py` record, the study's stored rungs and their recipe,
    and where the results go (this script's and `ladder_depth.py`'s)."""
    parser.add_argument("--record", type=Path, default=record, help="a ladder_accuracy.py record")
    parser.add_argument("--db", type=Path, default=DB, help="the study's database")
    parser.add_argument("--study", default="ladder-tiny-hf", help="the study the rungs belong to")
    parser.add_argument("--tokens-per-param", type=float, default=5.0, help="the rungs' recipe")
    parser.add_argument("--batch-size", type=int, default=4, help="the rungs' recipe")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    stored_rung_arguments(parser)
    parser.add_argument(
        "--min-layers",
        type=int,
        default=1,
        help="fit only the rungs of at least this many layers (preregistered_two_layers.md: 2)",
    )
    parser.add_argument(
        "--size",
        choices=("non_embedding", "total"),
        default="non_embedding",
        help="the law's N: the shipped non-embedding parameters, or total (preregistered_total_params.md)",
    )
    parser.add_argument(
        "--mixed",
        type=int,
        default=0,
        metavar="N",
        help="also N ladders whose rungs draw their seed per (design, size), 4 sizes "
        "(preregistered_mixed_seeds.md: 200)",
    )
    parser.add_argument("--smoke", action="store_true", help="seeds 0 and 1 only")
    args = parser.parse_args()
    rows = [r for r in json.loads(args.record.read_text())["rows"] if r["real"] is not None]
    trials = {r["trial"] for r in rows}
    rungs = stored_rungs(args.db, args.study, trials, args.tokens_per_param, args.batch_size)
    top = max(r.target_params for r in rungs)
    if args.min_layers > 1:
        kept = [r for r in rungs if r.config.n_layers >= args.min_layers]
        print(f"rungs of at least {args.min_layers} layers: {len(kept)} of {len(rungs)}")
        rungs = kept
    seeds = sorted({r.seed for r in rungs})
    if args.smoke:
        seeds = [s for s in seeds if s in (0, 1)]
    print(
        f"{len(rows)} designs with a real run ({args.record.name}); rungs at {args.tokens_per_param:g} "
        f"tokens per parameter, batch {args.batch_size}: "
        + ", ".join(f"seed {s} {sum(r.seed == s for r in rungs)}" for s in seeds)
    )
    # The rungs 2x apart (`--rungs 4`) and, where a denser ladder stored more sizes between them
    # (`--rungs 7 --spacing 1.41421356`: preregistered_dense.md), all of them.
    two_x = set(rung_targets(top, 4))
    sizes = {"2x": [r for r in rungs if r.target_params in two_x]}
    if len(sizes["2x"]) < len(rungs):
        sizes["all"] = rungs
        every = len({r.target_params for r in rungs})
        print(
            f"sizes: {len(two_x)} 2x apart ({len(sizes['2x'])} rungs), all {every} ({len(rungs)} rungs; "
            "where neighbours are one shape they are one rung)"
        )
    results: dict[str, Any] = {}
    for which, chosen in sizes.items():
        for n in range(1, len(seeds) + 1):
            for subset in itertools.combinations(seeds, n):
                some = [r for r in chosen if r.seed in subset]
                fit = fit_total(some) if args.size == "total" else fit_study_ladders(some)
                predictions = {
                    r["trial"]: fit.predict(r["trial"], float(r[f"params_{args.size}"])) for r in rows
                }
                s = score(rows, {t: p.loss for t, p in predictions.items()})
                inside = sum(
                    predictions[r["trial"]].low <= r["real"] <= predictions[r["trial"]].high for r in rows
                )
                name = "+".join(map(str, subset))
                # The 2x sizes keep the keys the records before the dense rungs had.
                results[name if which == "2x" else f"{which}:{name}"] = {
                    "e": fit.e, "alpha": fit.alpha, "inside": inside, "rungs": len(fit.points), **s
                }  # fmt: skip
                low, high = s["interval"]
                print(
                    f"{which:>3} sizes, seeds {name:<6} E {fit.e:.3f}, alpha {fit.alpha:.3f}: median |error| "
                    f"{s['median']:.2%} [{low:.2%}, {high:.2%}], worst {s['worst']:.2%}, "
                    f"{inside}/{len(rows)} inside the 95% interval; predicted >2% low "
                    f"{sum(e < -0.02 for e in s['errors'].values())}, >1% low "
                    f"{sum(e < -0.01 for e in s['errors'].values())}, >1% high "
                    f"{sum(e > 0.01 for e in s['errors'].values())}; Spearman "
                    f"{s['spearman_ladder']['value']:.2f} (proxy {s['spearman_proxy']['value']:.2f})"
                )
        spread = [results[str(seed) if which == "2x" else f"{which}:{seed}"]["median"] for seed in seeds]
        if len(spread) > 1:
            print(f"{which:>3} sizes: the single seeds' median errors span {max(spread) - min(spread):.2%}")
    if args.mixed:
        results["mixed"] = mixed_seeds(rows, sizes["2x"], seeds, args.mixed)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


def mixed_seeds(rows: list[dict[str, Any]], rungs: list[Any], seeds: list[int], draws: int) -> dict[str, Any]:
    """`draws` ladders whose every (design, size) takes one of `seeds`' rungs, drawn uniformly and
    independently (numpy seed 0), each fitted and scored: how the error spreads when the designs'
    rung noise is independent rather than shared by one training seed."""
    import numpy as np

    by: dict[tuple[int, int], dict[int, Any]] = {}
    for r in rungs:
        if r.seed in seeds:
            by.setdefault((r.trial_number, r.target_params), {})[r.seed] = r
    keys = sorted(k for k, v in by.items() if len(v) == len(seeds))
    rng = np.random.default_rng(0)
    medians, worsts, low = [], [], []
    for _ in range(draws):
        fit = fit_study_ladders([by[k][seeds[int(rng.integers(len(seeds)))]] for k in keys], resamples=0)
        s = score(
            rows, {r["trial"]: fit.predict(r["trial"], float(r["params_non_embedding"])).loss for r in rows}
        )
        medians.append(s["median"])
        worsts.append(s["worst"])
        low.append(sum(e < -0.01 for e in s["errors"].values()))
    p5, p50, p95 = (float(v) for v in np.percentile(medians, [5, 50, 95]))
    print(
        f"mixed seeds, {draws} draws over {len(keys)} (design, size) rungs: median |error| p5 {p5:.2%}, "
        f"p50 {p50:.2%}, p95 {p95:.2%} (spread {p95 - p5:.2%}); worst p50 {float(np.median(worsts)):.2%}; "
        f"designs >1% low: {float(np.median(low)):.0f} of {len(rows)} at the median"
    )
    return {"draws": draws, "p5": p5, "p50": p50, "p95": p95, "worst_p50": float(np.median(worsts))}


if __name__ == "__main__":
    main()
