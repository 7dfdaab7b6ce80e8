"""The judging script of `preregistered_noise_interval.md` (2026-11-28), kept beside its note.

For each subset of the stored seeds' rungs at the 4 sizes 2x apart: the shipped fit
(`fit_study_ladders`), its 95% interval (a bootstrap over rungs) and a parametric one (the fitted
losses times exp(sigma z), sigma the larger of the fit's relative residual spread and the
replicate seeds' pooled spread of ln loss), each scored on how many of the 12 real 2M losses it
covers and its median width.

    python benchmarks/data/ladder_tp5/noise_interval_2026-11-28.py
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

from ladder_seeds import DB, stored_rungs  # noqa: E402

from archsearch.results import ladder_fit as lf  # noqa: E402
from archsearch.results.ladder import fit_study_ladders  # noqa: E402
from archsearch.search.ladder_plan import rung_targets  # noqa: E402

RECORD = ROOT / "benchmarks" / "data" / "ladder_accuracy_tp5_b4_b16_d12_dense_seeds3.json"


def noise_boot(fit: lf.LadderFit, resamples: int = 200, seed: int = 0) -> tuple[np.ndarray, float, float]:
    """(resampled constants, sigma from the residuals, sigma from replicate seeds)."""
    pts, designs = fit.points, fit.designs
    index = np.array([designs.index(p.design) for p in pts])
    x = np.array([p.n for p in pts]) / fit.n_ref
    y = np.array([p.loss for p in pts])
    k = len(designs)
    fitted = np.array([fit.loss(p.design, p.n) for p in pts])
    s_res = float(np.sqrt(np.sum((y / fitted - 1) ** 2) / (len(y) - (k + 2))))
    groups: dict[tuple, list[float]] = {}
    for p in pts:
        groups.setdefault((p.design, p.n), []).append(float(np.log(p.loss)))
    reps = [g for g in groups.values() if len(g) > 1]
    s_rep = (
        float(
            np.sqrt(
                sum(np.sum((np.array(g) - np.mean(g)) ** 2) for g in reps) / sum(len(g) - 1 for g in reps)
            )
        )
        if reps
        else 0.0
    )
    sigma = max(s_res, s_rep)
    rng = np.random.default_rng(seed)
    theta = np.r_[fit.e, fit.alpha, fit.log_a]
    rows = [
        lf._solve(index, x, fitted * np.exp(sigma * rng.standard_normal(len(y))), k, theta)[0]
        for _ in range(resamples)
    ]
    return np.array(rows), s_res, s_rep


def main() -> None:
    rows = [r for r in json.loads(RECORD.read_text())["rows"] if r["real"] is not None]
    rungs = stored_rungs(DB, "ladder-tiny-hf", {r["trial"] for r in rows}, 5.0, 4)
    two_x = set(rung_targets(max(r.target_params for r in rungs), 4))
    rungs = [r for r in rungs if r.target_params in two_x]
    total = inside_total = 0
    every = True
    for n in (1, 2, 3):
        for subset in itertools.combinations((0, 1, 2), n):
            fit = fit_study_ladders([r for r in rungs if r.seed in subset])
            boot, s_res, s_rep = noise_boot(fit)
            old = new = 0
            w_old, w_new = [], []
            for row in rows:
                i, n_at = fit.designs.index(row["trial"]), float(row["params_non_embedding"])
                p = fit.predict(row["trial"], n_at)
                low, high = np.percentile(
                    lf._law(boot[:, 0], boot[:, 1], boot[:, 2 + i], n_at / fit.n_ref), [2.5, 97.5]
                )
                old += p.low <= row["real"] <= p.high
                new += low <= row["real"] <= high
                w_old.append((p.high - p.low) / p.loss)
                w_new.append((high - low) / p.loss)
            total += len(rows)
            inside_total += new
            every &= new >= 10
            print(
                f"seeds {'+'.join(map(str, subset)):<6} sigma residuals {s_res:.2%}, replicates {s_rep:.2%}: "
                f"inside shipped {old}/12 (width {np.median(w_old):.1%}), parametric {new}/12 "
                f"(width {np.median(w_new):.1%})"
            )
    print(
        f"every subset at least 10 of 12: {every}; pooled {inside_total}/{total} = {inside_total / total:.0%}"
    )


if __name__ == "__main__":
    main()
