"""A ladder law that knows a rung of one layer, scored against the real 2M runs (issue 23).

`L = E + A_d N^-alpha + B [n_layers = 1]`: the shipped law (`results.ladder_fit`: E and alpha
shared, A per design, N non-embedding parameters) with one more shared constant for the rungs of
a single layer, which cannot form induction heads (Olsson et al. 2022) and sit above the curve of
deeper shapes. Pre-registered in `benchmarks/data/ladder_tp5/preregistered_one_layer_term.md`
before its first fit. Reads a `ladder_accuracy.py` record (designs, real runs) and the study's
stored rungs of every seed, fits the law over each subset of the seeds (on the 4 sizes 2x apart
and on all sizes), and prints, beside the shipped law on the same rungs, the median absolute error
(95% bootstrap interval over designs), the worst, how many designs are predicted more than 1% low
and high, and the Spearman of the predicted ranking beside the proxy's (their paired difference).

    python benchmarks/ladder_depth.py           # the 12 designs, seeds 0-2 (seconds)
    python benchmarks/ladder_depth.py --smoke   # seed 0 only
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
from ladder_heads import score  # benchmarks/ is this script's folder
from ladder_seeds import stored_rung_arguments, stored_rungs

from archsearch.results.ladder import fit_study_ladders
from archsearch.results.ladder_fit import _ALPHA_STARTS, _E_STARTS, N_REF
from archsearch.search import fidelity_stats as fs
from archsearch.search.ladder_plan import rung_targets

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
RECORD = DATA / "ladder_accuracy_tp5_b4_b16_d12_dense_seeds3.json"


def fit_one_layer_law(rungs: list[Any]) -> dict[str, Any]:
    """Least squares of `L = E + A_d N^-alpha + B [n_layers = 1]` over `rungs`, from the same grid
    of starting exponents and floors the shipped fit uses; E in [0, the lowest loss], B free."""
    from scipy.optimize import least_squares

    designs = sorted({r.trial_number for r in rungs})
    index = np.array([designs.index(r.trial_number) for r in rungs])
    log_x = np.log(np.array([r.params_non_embedding for r in rungs], float) / N_REF)
    one = np.array([r.config.n_layers == 1 for r in rungs], float)
    y = np.array([r.val_loss for r in rungs], float)
    k = len(designs)
    lower = np.r_[0.0, 0.0, -np.inf, np.full(k, -np.inf)]
    upper = np.r_[float(y.min()), 3.0, np.inf, np.full(k, np.inf)]

    def residuals(t: np.ndarray) -> np.ndarray:
        return t[0] + np.exp(t[3 + index] - t[1] * log_x) + t[2] * one - y

    best = None
    for alpha, fraction in itertools.product(_ALPHA_STARTS, _E_STARTS):
        e = fraction * float(y.min())
        log_a = [float(np.mean(np.log(y[index == d] - e) + alpha * log_x[index == d])) for d in range(k)]
        x0 = np.clip(np.r_[e, alpha, 0.0, log_a], lower, np.nextafter(upper, -np.inf))
        found = least_squares(residuals, x0, bounds=(lower, upper), method="trf", x_scale="jac")
        if best is None or found.cost < best.cost:
            best = found
    t = best.x
    return {
        "e": float(t[0]), "alpha": float(t[1]), "b": float(t[2]),
        "log_a": {d: float(v) for d, v in zip(designs, t[3:], strict=True)},
    }  # fmt: skip


def predict(law: dict[str, Any], trial: int, n: float) -> float:
    """The law at `n` non-embedding parameters for a shape of 2+ layers (the real runs' shapes)."""
    return law["e"] + float(np.exp(law["log_a"][trial] - law["alpha"] * np.log(n / N_REF)))


def side_counts(errors: dict[int, float]) -> tuple[int, int]:
    """(designs predicted more than 1% low, more than 1% high)."""
    return sum(e < -0.01 for e in errors.values()), sum(e > 0.01 for e in errors.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    stored_rung_arguments(parser, RECORD)
    parser.add_argument("--smoke", action="store_true", help="seed 0 only")
    args = parser.parse_args()
    rows = [r for r in json.loads(args.record.read_text())["rows"] if r["real"] is not None]
    shallow = [r["trial"] for r in rows if " 1 layers " in f" {r['shape_at_real']} "]
    if shallow:
        raise SystemExit(f"error: the real runs of trials {shallow} have one layer; the law's B would apply")
    trials = {r["trial"] for r in rows}
    rungs = stored_rungs(args.db, args.study, trials, args.tokens_per_param, args.batch_size)
    seeds = [0] if args.smoke else sorted({r.seed for r in rungs})
    top = max(r.target_params for r in rungs)
    two_x = set(rung_targets(top, 4))
    sizes = {"2x": [r for r in rungs if r.target_params in two_x], "all": rungs}
    print(
        f"{len(rows)} designs with a real run ({args.record.name}); {len(rungs)} rungs at "
        f"{args.tokens_per_param:g} tokens per parameter, batch {args.batch_size}, seeds {seeds}; "
        f"{sum(r.config.n_layers == 1 for r in rungs)} of them 1 layer"
    )
    results: dict[str, Any] = {}
    for which, chosen in sizes.items():
        for n in range(1, len(seeds) + 1):
            for subset in itertools.combinations(seeds, n):
                some = [r for r in chosen if r.seed in subset]
                name = f"{which}:{'+'.join(map(str, subset))}"
                law = fit_one_layer_law(some)
                shipped = fit_study_ladders(some, resamples=0)
                at = {r["trial"]: float(r["params_non_embedding"]) for r in rows}
                for label, fit, pred in (
                    ("one-layer term", law, {t: predict(law, t, n) for t, n in at.items()}),
                    ("shipped", shipped, {t: shipped.predict(t, n).loss for t, n in at.items()}),
                ):
                    s = score(rows, pred)
                    low, high = side_counts(s["errors"])
                    paired = fs.paired_difference(
                        [pred[r["trial"]] for r in rows],
                        [r["proxy_loss"] for r in rows],
                        [r["real"] for r in rows],
                    ).to_dict()
                    e = fit["e"] if isinstance(fit, dict) else fit.e
                    alpha = fit["alpha"] if isinstance(fit, dict) else fit.alpha
                    extra = f", B {fit['b']:+.3f}" if isinstance(fit, dict) else ""
                    lo, hi = s["interval"]
                    print(
                        f"{which:>3} sizes, seeds {name.split(':')[1]:<6} {label:<14} E {e:.3f}, "
                        f"alpha {alpha:.3f}{extra}: median {s['median']:.2%} [{lo:.2%}, {hi:.2%}], "
                        f"worst {s['worst']:.2%}; "
                        f">1% low {low}, high {high}; Spearman {_est(s['spearman_ladder'])} "
                        f"(proxy {_est(s['spearman_proxy'])}, paired {_est(paired)})"
                    )
                    results.setdefault(name, {})[label] = {
                        "e": e, "alpha": alpha, **({"b": fit["b"]} if isinstance(fit, dict) else {}),
                        "low": low, "high": high, "paired": paired, **s,
                    }  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


def _est(e: dict[str, Any]) -> str:
    return fs.estimate_text(e)


if __name__ == "__main__":
    main()
