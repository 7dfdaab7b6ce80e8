"""Does a design's loss exponent depend on its head width? Two laws over recorded ladders (issue 23).

On the 8 designs of `ladder_accuracy_tp5_b4_b16.json` the shipped law (one E and one alpha shared,
A per design: `results.ladder_fit`) predicted the two designs with a single 64-wide query head at
the proxy 3-6% too high at 2M parameters, the six with 32-wide heads within 2%. Their small rungs
have 1-2 query heads and their real runs 3. The hypothesis: designs of 64-wide heads improve
faster with size than the law's shared exponent says. This script fits, over the ladders of a
`ladder_accuracy.py` record (rungs at batch 4, seed 0, from the study's database):
- "shared alpha": the shipped law (`fit_ladders`, with its bootstrap interval);
- "alpha by head_dim": one exponent per head width, E shared, A per design (least squares from
  several starts, as `fit_ladders` fits; no interval);
and scores each design's prediction at its real run's size against the real loss: median and
worst |error|, and the Spearman of the predicted ranking against the real one beside the proxy's,
over the held-out designs (`--held-out`: written down before their results,
`benchmarks/data/ladder_tp5/preregistered_d12.md`) and over all of them, each with a 95% bootstrap
interval over designs (`search.fidelity_stats`).

    python benchmarks/ladder_heads.py            # seconds: the 12-design record, 4 held out
    python benchmarks/ladder_heads.py --smoke    # the 8-design record, its 2 single-head designs
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from archsearch.results.ladder_fit import ALPHA_BOUNDS, N_REF, RungPoint, fit_ladders
from archsearch.search import fidelity_stats as fs

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
RECORD = DATA / "ladder_accuracy_tp5_b4_b16_d12.json"
HELD_OUT = (88, 15, 87, 30)  # preregistered_d12.md
SMOKE_RECORD, SMOKE_HELD_OUT = DATA / "ladder_accuracy_tp5_b4_b16.json", (16, 33)


def load(record: Path, db: Path) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """(the record's rows with a real run, each trial's head_dim from its rungs' configs)."""
    rows = [r for r in json.loads(record.read_text())["rows"] if r["real"] is not None]
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    head_dim = {
        int(trial): json.loads(config)["head_dim"]
        for trial, config in con.execute("SELECT trial_number, config_json FROM archsearch_ladder_rungs")
    }
    con.close()
    return rows, head_dim


def shared_alpha(rows: list[dict[str, Any]], head_dim: dict[int, int]) -> dict[int, float]:
    """Each design's loss at its real size under the shipped law."""
    fit = fit_ladders(
        RungPoint(r["trial"], float(g["params_non_embedding"]), g["loss"]) for r in rows for g in r["rungs"]
    )
    return {r["trial"]: fit.predict(r["trial"], float(r["params_non_embedding"])).loss for r in rows}


def alpha_by_head_dim(rows: list[dict[str, Any]], head_dim: dict[int, int]) -> dict[int, float]:
    """Each design's loss at its real size under `E + A_d N^-alpha_h`, h its head width."""
    trials = [r["trial"] for r in rows]
    widths = sorted({head_dim[t] for t in trials})
    points = [
        (i, g["params_non_embedding"] / N_REF, g["loss"]) for i, r in enumerate(rows) for g in r["rungs"]
    ]
    index = np.array([p[0] for p in points])
    log_x = np.log([p[1] for p in points])
    y = np.array([p[2] for p in points])
    group = np.array([widths.index(head_dim[t]) for t in trials])[index]
    k, h = len(trials), len(widths)

    def residuals(t: np.ndarray) -> np.ndarray:
        return t[0] + np.exp(t[1 + h + index] - t[1 + group] * log_x) - y

    lower = np.r_[0.0, [ALPHA_BOUNDS[0]] * h, [-np.inf] * k]
    upper = np.r_[y.min(), [ALPHA_BOUNDS[1]] * h, [np.inf] * k]
    best = None
    for alpha in (0.1, 0.3, 0.7, 1.5):  # `fit_ladders`' starting grid
        for e in (0.0, 0.5 * y.min(), 0.9 * y.min()):
            log_a = [np.mean(np.log(y[index == d] - e) + alpha * log_x[index == d]) for d in range(k)]
            x0 = np.clip(np.r_[e, [alpha] * h, log_a], lower, np.nextafter(upper, -np.inf))
            found = least_squares(residuals, x0, bounds=(lower, upper))
            if best is None or found.cost < best.cost:
                best = found
    t = best.x
    return {
        trial: float(t[0] + math.exp(t[1 + h + i] - t[1 + widths.index(head_dim[trial])] * math.log(
            rows[i]["params_non_embedding"] / N_REF
        )))
        for i, trial in enumerate(trials)
    }  # fmt: skip


def score(rows: list[dict[str, Any]], predicted: dict[int, float]) -> dict[str, Any]:
    """Median and worst |error| (the median's 95% bootstrap interval over designs) and Spearman."""
    from scipy import stats

    real = [r["real"] for r in rows]
    pred = [predicted[r["trial"]] for r in rows]
    errors = np.abs(np.array(pred) / np.array(real) - 1)
    interval = [math.nan, math.nan]
    if len(rows) >= 3:
        ci = stats.bootstrap(
            (errors,), np.median, n_resamples=2000, method="percentile", random_state=0
        ).confidence_interval
        interval = [float(ci.low), float(ci.high)]
    out = {
        "designs": len(rows), "median": float(np.median(errors)), "interval": interval,
        "worst": float(errors.max()),
        "errors": {r["trial"]: p / r["real"] - 1 for r, p in zip(rows, pred, strict=True)},
    }  # fmt: skip
    if len(rows) >= 3:
        proxy = [r["proxy_loss"] for r in rows]
        out["spearman_ladder"] = fs.rank_correlation(pred, real).to_dict()
        out["spearman_proxy"] = fs.rank_correlation(proxy, real).to_dict()
    return out


def _est(e: dict[str, Any]) -> str:
    return fs.estimate_text(e)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, default=RECORD, help="a ladder_accuracy.py record")
    parser.add_argument("--db", type=Path, default=DATA / "ladder_tp5" / "ladder-tiny-hf.db")
    parser.add_argument(
        "--held-out", default=",".join(map(str, HELD_OUT)), help="trials scored apart, comma-separated"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--smoke", action="store_true", help="the 8-design record")
    args = parser.parse_args()
    record, held = args.record, [int(t) for t in args.held_out.split(",") if t]
    if args.smoke:
        record, held = SMOKE_RECORD, list(SMOKE_HELD_OUT)
    rows, head_dim = load(record, args.db)
    widths = {r["trial"]: head_dim[r["trial"]] for r in rows}
    print(
        f"{len(rows)} designs with a real run ({record.name}); head_dim "
        + ", ".join(f"{w}: {sum(v == w for v in widths.values())}" for w in sorted(set(widths.values())))
        + f"; held out: {', '.join(map(str, held)) or '-'}"
    )
    results = {}
    for name, law in (("shared alpha", shared_alpha), ("alpha by head_dim", alpha_by_head_dim)):
        predicted = law(rows, head_dim)
        results[name] = {}
        for subset, chosen in (("held out", [r for r in rows if r["trial"] in held]), ("all", rows)):
            if not chosen:
                continue
            s = results[name][subset] = score(chosen, predicted)
            spearman = (
                f"; Spearman ladder {_est(s['spearman_ladder'])}, proxy {_est(s['spearman_proxy'])}"
                if "spearman_ladder" in s
                else ""
            )
            low, high = s["interval"]
            interval = "" if math.isnan(low) else f" [{low:.2%}, {high:.2%}]"
            print(
                f"{name:<18} {subset:<8} {s['designs']:>2} designs: median |error| {s['median']:.2%}"
                f"{interval}, worst {s['worst']:.2%}{spearman}"
            )
        print(
            f"{'':<18} errors: "
            + ", ".join(f"{t} {e:+.2%}" for t, e in results[name]["all"]["errors"].items())
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
