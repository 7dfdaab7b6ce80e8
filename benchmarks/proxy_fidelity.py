"""Proxy fidelity: how well each proxy variant ranks shapes the way 10x longer training does.

The calibration set is fixed: the 14 distinct shapes of a random-sampler study of
`examples/tiny.toml`, with their loss after 5x and 10x the original proxy budget (120,832 tokens,
batch 16, cosine, seed 0, fp32, CPU), recorded in `benchmarks/data/fidelity_tiny_2026-11-23.json`.
Each variant below trains every shape once on the bundled corpus (fp32, one thread: CPU runs are
bit-reproducible, so the variant "reference" reproduces the recorded proxy losses exactly) and is
scored against the recorded long runs. Printed per variant (and for the free predictors, parameter
count and forward FLOPs, on the same set):
- Spearman and Kendall of its loss against the 10x loss (and Spearman against 5x);
- pairwise agreement inside iso-parameter pairs (parameter counts within 25%);
- how many members its front (loss vs forward FLOPs) shares with the 10x front;
- its compute: training tokens per shape as a multiple of the original proxy's, and of a 10x run.

A second table puts four predictors side by side per variant, all against the 10x runs: the proxy
loss, parameter count, the size-adjusted proxy loss (`loss - beta ln(params / 1M)` with the
equal-weight beta over the 14 shapes, `archsearch.search.fidelity.size_adjusted_losses`) and the
rank sum (proxy-loss rank + parameter-count rank). Neither combination is fitted to the long runs.

A third table scores the size-adjusted loss at fixed betas (`--betas`), the form a search tells
Optuna (`[objectives].size_beta`: a per-trial value needs a beta that does not depend on the
other trials): Spearman against 10x and the front shared with the 10x front, per variant and beta.

A fourth gives fidelity against cost from the recorded long runs alone: each intermediate
evaluation of the 5x and 10x runs is a proxy that cost that share of a 10x run (same seed as the
reference: what a proxy of that cost could reach at best with the long runs' schedule).

    python benchmarks/proxy_fidelity.py [--variants reference,batch8] [--out results.json]
    python benchmarks/proxy_fidelity.py --out benchmarks/data/proxy_fidelity_cpu_2026-11-23.json \
        --variants reference,tokens2x-constant     # the recorded runs of docs/accuracy.md's tables
    python benchmarks/proxy_fidelity.py --smoke      # 3 shapes, a few thousand tokens: seconds

Results are kept in `--out` as they come, so an interrupted run resumes where it stopped; a variant
whose every shape is recorded there is scored without training (or importing torch).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from archsearch.fileio import write_atomic
from archsearch.search.fidelity import (
    average_ranks,
    iso_pair_agreement,
    kendall,
    size_adjusted_losses,
    spearman,
)
from archsearch.search.pareto import pareto_mask

CALIBRATION = Path(__file__).resolve().parent / "data" / "fidelity_tiny_2026-11-23.json"
PROXY_TOKENS = 120_000  # the original proxy's budget (examples/tiny.toml before the change)

# name -> TrainSettings fields that differ from the original proxy (batch 16, 120k tokens, cosine).
# Smaller batches keep the tokens and add optimizer steps; they evaluate on as many tokens (8 x 16
# sequences) so that only training differs.
VARIANTS: dict[str, dict[str, Any]] = {
    "reference": {},
    "constant": {"schedule": "constant"},
    "batch8": {"batch_size": 8, "eval_batches": 16},
    "batch8-constant": {"batch_size": 8, "eval_batches": 16, "schedule": "constant"},
    "batch4": {"batch_size": 4},  # post-norm shapes stall at the unigram loss at this rate
    "batch4-lr1e-3": {"batch_size": 4, "eval_batches": 32, "lr": 1e-3},
    "tokens1.5x-constant": {"tokens": 180_000, "schedule": "constant"},
    "tokens2x": {"tokens": 2 * PROXY_TOKENS},
    "tokens2x-constant": {"tokens": 2 * PROXY_TOKENS, "schedule": "constant"},
    # Seed 0 is the recorded long runs' seed (same init and first batches): other seeds show the
    # fidelity a proxy has against an independent long run.
    "reference-seed1": {"seed": 1},
    "tokens2x-constant-seed1": {"tokens": 2 * PROXY_TOKENS, "schedule": "constant", "seed": 1},
    "tokens2x-constant-seed2": {"tokens": 2 * PROXY_TOKENS, "schedule": "constant", "seed": 2},
    # A quarter of the run: 30 steps, the warm-up of the calibration set's 10x runs (5% of 590).
    "tokens2x-constant-warmup25": {"tokens": 2 * PROXY_TOKENS, "schedule": "constant", "warmup": 0.25},
    # Half the run: 59 steps, the warm-up of a 10x run of this proxy (5% of 1180). At 5% (6 steps)
    # some post-norm ReLU shapes stall at the unigram loss for the whole proxy and train fine later.
    "tokens2x-constant-warmup50": {"tokens": 2 * PROXY_TOKENS, "schedule": "constant", "warmup": 0.5},
    "tokens2x-constant-warmup50-seed1": {
        "tokens": 2 * PROXY_TOKENS, "schedule": "constant", "warmup": 0.5, "seed": 1,
    },
    "batch8-tokens2x": {"batch_size": 8, "eval_batches": 16, "tokens": 2 * PROXY_TOKENS},
    "batch8-tokens2x-constant": {
        "batch_size": 8, "eval_batches": 16, "tokens": 2 * PROXY_TOKENS, "schedule": "constant",
    },
}  # fmt: skip
BASE = dict(tokens=PROXY_TOKENS, batch_size=16, evals=4, device="cpu", precision="fp32", seed=0)
# name -> (variant, its retry): what a search does with stalled runs (`search.worker`), applied to
# recorded runs. A shape whose first run sits on the unigram plateau at half its budget
# (`worker.stalled_at`) takes the retry variant's run instead, and costs half a run more.
RETRIED = {
    "tokens2x-constant-retry": ("tokens2x-constant", "tokens2x-constant-warmup50"),
    "tokens2x-constant-seed1-retry": ("tokens2x-constant-seed1", "tokens2x-constant-warmup50-seed1"),
}


def retried_runs(trials: list[dict], first: dict, retry: dict, batch_size: int) -> tuple[dict, list[int]]:
    """The runs of a RETRIED variant from its two trained variants' runs, and the stalled trials."""
    from archsearch.evaluators.data import load_dataset
    from archsearch.search.worker import stalled_at

    seq_len = trials[0]["config"]["seq_len"]
    unigram = load_dataset(None, None, seq_len=seq_len).unigram_loss()
    runs, stalled = {}, []
    for trial in trials:
        key = str(trial["trial"])
        run, curve = first[key], first[key]["val_curve"]
        where = stalled_at(curve, len(curve), unigram, batch_size * seq_len)
        if where is None:
            runs[key] = run
            continue
        again = retry[key]
        runs[key] = {**again, "tokens": where[0] + again["tokens"], "wall_s": run["wall_s"] + again["wall_s"]}
        stalled.append(trial["trial"])
    return runs, stalled


def train_variant(trials: list[dict], overrides: dict[str, Any], done: dict[str, Any], save) -> None:
    """Train every calibration shape not yet in `done` (trial number -> result), saving after each."""
    if all(str(trial["trial"]) in done for trial in trials):
        return  # all recorded: scoring needs no torch
    import torch

    from archsearch.evaluators.data import load_dataset
    from archsearch.evaluators.settings import TrainSettings
    from archsearch.evaluators.trainer import train
    from archsearch.space.config import ArchConfig

    torch.set_num_threads(1)  # these shapes gain nothing from a second thread (issue 9's 31x)
    settings = TrainSettings(**{**BASE, **overrides})
    data = load_dataset(None, None, seq_len=trials[0]["config"]["seq_len"])
    for trial in trials:
        key = str(trial["trial"])
        if key in done:
            continue
        start = time.perf_counter()
        result = train(ArchConfig.from_dict(trial["config"]), data, settings)
        done[key] = dict(
            status=result.status, val_loss=result.val_loss, tokens=result.tokens, steps=result.steps,
            wall_s=time.perf_counter() - start, val_curve=[list(p) for p in result.val_curve],
        )  # fmt: skip
        save()


def scores(predicted: np.ndarray, trials: list[dict]) -> dict[str, float]:
    """Fidelity of `predicted` (lower = better) against the recorded long runs."""
    x10 = np.array([t["x10"]["val_loss"] for t in trials])
    x5 = np.array([t["x5"]["val_loss"] if "x5" in t else np.nan for t in trials])
    params = np.array([t["params_total"] for t in trials], dtype=float)
    flops = np.array([t["flops_forward_per_token"] for t in trials])
    agree, pairs = iso_pair_agreement(predicted, x10, params)
    front = set(np.flatnonzero(pareto_mask(np.column_stack([predicted, flops]))))
    long_front = set(np.flatnonzero(pareto_mask(np.column_stack([x10, flops]))))
    return dict(
        spearman_10x=spearman(predicted, x10),
        kendall_10x=kendall(predicted, x10),
        spearman_5x=spearman(predicted, x5) if np.isfinite(x5).all() else float("nan"),  # no 5x: NaN
        iso_agree=agree,
        iso_pairs=pairs,
        front=len(front),
        front_10x=len(long_front),
        front_shared=len(front & long_front),
    )


def size_rows(predicted: np.ndarray, trials: list[dict]) -> tuple[float, dict[str, dict[str, float]]]:
    """The proxy `predicted`, parameter count, the size-adjusted proxy and the rank sum, each
    scored by `scores`; and the adjusted loss's beta. Failed shapes (inf) stay worst in all."""
    params = np.array([t["params_total"] for t in trials], dtype=float)
    ok = np.isfinite(predicted)
    adjusted = np.full_like(predicted, np.inf)
    adjusted[ok], beta = size_adjusted_losses(predicted[ok], params[ok])
    rank_sum = average_ranks(predicted) + average_ranks(-params)  # equal weight, in ranks
    predictors = {"proxy": predicted, "params": -params, "adjusted": adjusted, "rank sum": rank_sum}
    return beta, {name: scores(p, trials) for name, p in predictors.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"any of {', '.join(VARIANTS)}")
    parser.add_argument("--out", default="proxy_fidelity_results.json", help="results (resumable)")
    parser.add_argument("--smoke", action="store_true", help="3 shapes, 4k tokens: checks the script runs")
    parser.add_argument("--betas", default="0,0.05,0.1,0.15,0.2,0.3,0.4", help="fixed betas to score")
    parser.add_argument(
        "--calibration", type=Path, default=CALIBRATION,
        help="the recorded set: shapes with their 10x runs (default the first set; "
        "data/fidelity_tiny_fid_2026-11-24.json is the second; shapes without a 10x run are left out)",
    )  # fmt: skip
    args = parser.parse_args()
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS and n not in RETRIED]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; valid: {', '.join([*VARIANTS, *RETRIED])}")
    trained = list(dict.fromkeys(t for n in names for t in RETRIED.get(n, (n,))))

    trials = [t for t in json.loads(args.calibration.read_text())["trials"] if "x10" in t]
    # The budget the variants' compute is counted in: a tenth of the recorded 10x runs.
    base_tokens = float(np.mean([t["x10"]["tokens"] for t in trials])) / 10
    if args.smoke:
        trials = sorted(trials, key=lambda t: t["params_total"])[:3]
    out = Path(args.out)
    results: dict[str, Any] = json.loads(out.read_text()) if out.exists() and not args.smoke else {}
    # Trial numbers name different shapes in different sets: one results file per set.
    recorded_set = results.setdefault("calibration", CALIBRATION.name if results else args.calibration.name)
    if recorded_set != args.calibration.name:
        parser.error(f"{out} holds runs of {recorded_set}, not {args.calibration.name}: give another --out")
    for name in trained:
        overrides = dict(VARIANTS[name])
        if args.smoke:
            overrides["tokens"] = 4096 * overrides.get("tokens", PROXY_TOKENS) // PROXY_TOKENS
        done = results.setdefault(name, {"settings": overrides, "runs": {}})["runs"]
        if not args.smoke:
            train_variant(
                trials, overrides, done, lambda: write_atomic(out, json.dumps(results, indent=1).encode())
            )
        else:
            train_variant(trials, overrides, done, lambda: None)

    derived = {}  # not saved: rebuilt from the trained variants each time
    for name in names:
        if name in RETRIED:
            first, retry = RETRIED[name]
            batch = VARIANTS[first].get("batch_size", BASE["batch_size"])
            runs, stalled = retried_runs(trials, results[first]["runs"], results[retry]["runs"], batch)
            derived[name] = {"runs": runs}
            said = (
                f"trials {stalled} stalled in {first}: their {retry} runs are used"
                if stalled
                else (f"no run of {first} stalled")
            )
            print(f"{name}: {said}")
    params = np.array([t["params_total"] for t in trials], dtype=float)
    rows = {
        "params (bigger = better)": (scores(-params, trials), 0.0, 0.0),
        "forward FLOPs (more = better)": (
            scores(-np.array([t["flops_forward_per_token"] for t in trials]), trials), 0.0, 0.0,
        ),
    }  # fmt: skip
    combined = {}
    for name in names:
        runs = (derived.get(name) or results[name])["runs"]
        losses = [runs[str(t["trial"])]["val_loss"] for t in trials]
        if any(loss is None for loss in losses):
            failed = [t["trial"] for t, loss in zip(trials, losses, strict=True) if loss is None]
            print(f"{name}: trials {failed} failed; scored as worst")
        predicted = np.array([np.inf if loss is None else loss for loss in losses])
        tokens = np.mean([runs[str(t["trial"])]["tokens"] for t in trials])
        wall = sum(runs[str(t["trial"])]["wall_s"] for t in trials)
        rows[name] = (scores(predicted, trials), tokens / base_tokens, wall)
        combined[name] = size_rows(predicted, trials)

    print(f"{len(trials)} shapes; long-run reference: recorded 10x runs ({args.calibration.name})")
    print(
        f"{'predictor':32s} {'compute':>8s} {'of 10x':>7s} {'wall s':>7s} {'sp 10x':>7s} {'kt 10x':>7s} "
        f"{'sp 5x':>6s} {'iso pairs':>10s} {'front shared':>13s}"
    )
    for name, (s, compute, wall) in rows.items():
        cost = f"{compute:7.2f}x {compute / 10:7.2f} {wall:7.0f}" if compute else f"{'free':>24s}"
        print(
            f"{name:32s} {cost} {s['spearman_10x']:7.3f} "
            f"{s['kendall_10x']:7.3f} {s['spearman_5x']:6.3f} {s['iso_agree']:>4d} of {s['iso_pairs']:<3d}"
            f" {s['front_shared']:>4d} of {s['front']}/{s['front_10x']}"
        )
    # The four predictors side by side: Spearman and Kendall for each, iso pairs and the shared
    # front for the two losses (params' are in the table above).
    print()
    print("with size: proxy loss, -params, size-adjusted loss (loss - beta ln(params / 1M), beta =")
    print("sd(loss) / sd(ln params) over the shapes) and rank sum (loss rank + params rank), against 10x")
    four = " ".join(f"{k:>8s}" for k in ("proxy", "params", "adjusted", "rank sum"))
    two = f"{'proxy':>8s} {'adjusted':>8s}"
    groups = [("Spearman vs 10x", 35), ("Kendall vs 10x", 35), ("iso pairs", 17), ("front shared", 17)]
    print(f"{'':33s} " + "  ".join(f"{title:^{width}s}" for title, width in groups))
    print(f"{'variant':26s} {'beta':>6s} {four}  {four}  {two}  {two}")
    for name, (beta, s) in combined.items():
        sp = " ".join(f"{x['spearman_10x']:8.3f}" for x in s.values())
        kt = " ".join(f"{x['kendall_10x']:8.3f}" for x in s.values())
        iso = " ".join(f"{s[k]['iso_agree']:>2d} of {s[k]['iso_pairs']:<2d}" for k in ("proxy", "adjusted"))
        front = " ".join(f"{s[k]['front_shared']:>2d} of {s[k]['front']:>2d}" for k in ("proxy", "adjusted"))
        print(f"{name:26s} {beta:6.3f} {sp}  {kt}  {iso}  {front}")
    betas = [float(b) for b in args.betas.split(",") if b.strip()]
    print()
    print("fixed beta (the size-adjusted loss a search tells Optuna): Spearman vs 10x, front members")
    print("shared with the 10x front of (its front / the 10x front)")
    print(f"{'variant':26s} " + " ".join(f"{f'beta {b:g}':>16s}" for b in betas))
    for name in combined:
        runs = [(derived.get(name) or results[name])["runs"][str(t["trial"])]["val_loss"] for t in trials]
        losses = np.array([np.inf if loss is None else loss for loss in runs])
        ok = np.isfinite(losses)
        cells = []
        for beta in betas:
            adjusted = np.full_like(losses, np.inf)
            adjusted[ok] = size_adjusted_losses(losses[ok], params[ok], beta)[0]
            s = scores(adjusted, trials)
            cells.append(f"{s['spearman_10x']:.3f} {s['front_shared']} of {s['front']}/{s['front_10x']}")
        print(f"{name:26s} " + " ".join(f"{c:>16s}" for c in cells))
    print()
    print_cost_curve(trials, betas)
    if not args.smoke:
        print(f"results in {os.path.abspath(out)}")


def print_cost_curve(trials: list[dict], betas: list[float]) -> None:
    """Fidelity against cost from the recorded long runs alone: each intermediate evaluation of
    the 5x and 10x runs is a proxy that cost that share of a 10x run (the same seed as the
    reference, so an upper bound for a proxy of that cost with the long run's schedule)."""
    tokens_10x = float(np.mean([t["x10"]["tokens"] for t in trials]))
    params = np.array([t["params_total"] for t in trials], dtype=float)
    shown = [b for b in (0.0, 0.15) if b in betas] or betas[:1]
    print("fidelity against cost: the long runs' own evaluations as proxies, Spearman vs the 10x loss")
    print(f"{'prefix':28s} {'of 10x':>7s} " + " ".join(f"{f'beta {b:g}':>9s}" for b in shown))
    for run in ("x5", "x10"):
        curves = [t[run]["val_curve"] for t in trials if run in t]
        if len(curves) < len(trials):
            continue  # a set without that run for every shape
        last = len(curves[0]) - (1 if run == "x10" else 0)  # the 10x run's end is the reference
        for i in range(min(last, *(len(c) for c in curves))):
            tokens = curves[0][i][0]
            losses = np.array([c[i][1] for c in curves])
            cells = [
                scores(size_adjusted_losses(losses, params, b)[0], trials)["spearman_10x"] for b in shown
            ]
            label = f"{run} run at {tokens:,} tokens"
            print(f"{label:28s} {tokens / tokens_10x:7.3f} " + " ".join(f"{c:9.3f}" for c in cells))


if __name__ == "__main__":
    main()
