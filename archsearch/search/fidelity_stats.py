"""Fidelity measures that can decide: each with a 95% bootstrap interval
over shapes, and the measures a user acts on (front recall, the knee's regret).

A rank correlation over a few shapes is mostly noise, and two predictors are compared by their
paired difference on the same shapes, not by two separate correlations. The statistics are
scipy's (`scipy.stats.spearmanr`, `kendalltau` (tau-b), `bootstrap`); written here is only what
scipy has no function for: pairs judged against the reference's own noise, and the front measures.
Background: docs/explanations/proxy-fidelity.md.

Every predictor is "lower is better", as every archsearch objective: pass parameter count and
FLOPs negated. Intervals are percentile intervals of `RESAMPLES` paired resamples of the shapes,
seeded: the same data give the same interval. The two correlations are computed here in batched
form (ranks by `scipy.stats.rankdata`), for all resamples at once: called once per resample,
`spearmanr` took 12 s per interval of 56 shapes on 2 cores, where the batched form takes well
under a second; the tests hold them equal to scipy's on fixed data.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from archsearch.search.pareto import knee_index, pareto_mask

RESAMPLES = 2000  # paired resamples of the shapes per interval: the 2.5% tails each hold 50
CONFIDENCE = 0.95
SEED = 0


@dataclass(frozen=True)
class Estimate:
    """A statistic on the shapes at hand, with its bootstrap interval."""

    value: float
    low: float
    high: float

    def to_dict(self) -> dict[str, float | None]:
        """JSON-ready: an undefined value or bound (NaN) is None."""
        return {k: (v if math.isfinite(v) else None) for k, v in dataclasses.asdict(self).items()}

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


def estimate_text(e: Mapping[str, float | None], spec: str = ".2f", value_spec: str | None = None) -> str:
    """An estimate as `Estimate.to_dict()` writes it, as "value [low, high]"; "-" for a part that
    is undefined (None or NaN: too few shapes to resample)."""

    def f(x: float | None, fmt: str) -> str:
        return "-" if x is None or math.isnan(x) else format(x, fmt)

    return f"{f(e['value'], value_spec or spec)} [{f(e['low'], spec)}, {f(e['high'], spec)}]"


def _arrays(*columns: Sequence[float]) -> list[np.ndarray]:
    out = [np.asarray(c, dtype=float).ravel() for c in columns]
    if len({len(c) for c in out}) != 1:
        raise ValueError(f"lengths differ: {', '.join(str(len(c)) for c in out)}")
    if any(np.isnan(c).any() for c in out):
        raise ValueError("NaN in the values ranked")
    if len(out[0]) < 3:
        raise ValueError(f"a rank correlation needs at least 3 shapes, got {len(out[0])}")
    return out


def _spearman(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray | float:
    """Spearman along `axis` (every other axis a batch of resamples): Pearson of the average
    ranks (`scipy.stats.rankdata`), as `scipy.stats.spearmanr` computes it for one pair, but for
    a whole batch of resamples at once; NaN where a side is constant."""
    from scipy import stats

    rx = stats.rankdata(np.moveaxis(x, axis, -1), axis=-1)
    ry = stats.rankdata(np.moveaxis(y, axis, -1), axis=-1)
    rx -= rx.mean(axis=-1, keepdims=True)
    ry -= ry.mean(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (rx * ry).sum(-1) / np.sqrt((rx * rx).sum(-1) * (ry * ry).sum(-1))
    return float(r) if np.ndim(r) == 0 else r


def _kendall(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray | float:
    """Kendall's tau-b along `axis` (corrected for ties on either side, as
    `scipy.stats.kendalltau`), batched over resamples; NaN where a side is constant."""
    x, y = np.moveaxis(x, axis, -1), np.moveaxis(y, axis, -1)
    i, j = np.triu_indices(x.shape[-1], k=1)
    sx, sy = np.sign(x[..., i] - x[..., j]), np.sign(y[..., i] - y[..., j])
    with np.errstate(invalid="ignore", divide="ignore"):
        t = (sx * sy).sum(-1) / np.sqrt((sx != 0).sum(-1) * (sy != 0).sum(-1))
    return float(t) if np.ndim(t) == 0 else t


STATISTICS = {"spearman": _spearman, "kendall": _kendall}


def _interval(statistic, columns: list[np.ndarray], seed: int) -> tuple[float, float]:
    """Percentile interval of `statistic(*columns, axis=-1)` over paired resamples of the rows
    (`scipy.stats.bootstrap`, vectorised). NaN where a resample leaves a column constant (a
    handful of shapes at most: with distinct values that takes every draw to hit one shape)."""
    import warnings

    from scipy import stats

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a constant resample's NaN makes the interval NaN
        result = stats.bootstrap(
            tuple(columns), statistic, paired=True, vectorized=True, n_resamples=RESAMPLES, batch=250,
            confidence_level=CONFIDENCE, method="percentile", rng=np.random.default_rng(seed),
        )  # fmt: skip
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def _repeats(predicted: Sequence[float] | Sequence[Sequence[float]]) -> list[np.ndarray]:
    """One row per repeat of the predictor (proxy seeds, say): a 1-D sequence is one repeat."""
    a = np.asarray(predicted, dtype=float)
    if a.ndim == 1:
        return [a]
    if a.ndim != 2 or len(a) == 0:
        raise ValueError(f"predicted must be one or more rows of values, got shape {a.shape}")
    return list(a)


def rank_correlation(
    predicted: Sequence[float] | Sequence[Sequence[float]],
    target: Sequence[float],
    method: str = "spearman",
    seed: int = SEED,
) -> Estimate:
    """Spearman (or Kendall tau-b) of `predicted` against `target` with its 95% interval.

    `predicted` may hold several repeats (rows: the proxy at several seeds): the statistic is then
    the mean of the repeats' correlations, each resample drawing the same shapes for all of them.

    Raises:
        ValueError: unknown method, lengths differ, NaN, or fewer than 3 shapes.
    """
    if method not in STATISTICS:
        raise ValueError(f"unknown method {method!r}; valid: {', '.join(STATISTICS)}")
    *rows, y = _arrays(*_repeats(predicted), target)
    stat = STATISTICS[method]

    def mean_corr(*columns: np.ndarray, axis: int = -1) -> np.ndarray | float:
        return sum(stat(r, columns[-1], axis=axis) for r in columns[:-1]) / (len(columns) - 1)

    low, high = _interval(mean_corr, [*rows, y], seed)
    return Estimate(float(mean_corr(*rows, y)), low, high)


def paired_difference(
    predicted: Sequence[float] | Sequence[Sequence[float]],
    baseline: Sequence[float],
    target: Sequence[float],
    method: str = "spearman",
    seed: int = SEED,
) -> Estimate:
    """How much better `predicted` ranks `target` than `baseline` does, on the same shapes:
    corr(predicted, target) - corr(baseline, target) (the repeats' mean, for several rows of
    `predicted`), the interval from resampling the shapes once for both, so that the shapes' own
    difficulty cancels."""
    if method not in STATISTICS:
        raise ValueError(f"unknown method {method!r}; valid: {', '.join(STATISTICS)}")
    *rows, b, y = _arrays(*_repeats(predicted), baseline, target)
    stat = STATISTICS[method]

    def diff(*columns: np.ndarray, axis: int = -1) -> np.ndarray | float:
        *rows_, b_, y_ = columns
        return sum(stat(r, y_, axis=axis) for r in rows_) / len(rows_) - stat(b_, y_, axis=axis)

    low, high = _interval(diff, [*rows, b, y], seed)
    return Estimate(float(diff(*rows, b, y)), low, high)


def pair_accuracy(
    predicted: Sequence[float],
    target: Sequence[float],
    noise: float = 0.0,
    within: Sequence[bool] | None = None,
) -> tuple[int, int]:
    """Pairs ordered right among those the reference tells apart.

    A pair counts when its reference gap exceeds `noise` (the reference's own seed noise: closer
    pairs are ties the reference cannot order) and, with `within`, both shapes are in that block
    (the iso-size block, say). It is right when `predicted` orders it as `target` does; a tie in
    `predicted` is wrong.

    Returns:
        (right, counted).
    """
    p, t = (np.asarray(v, dtype=float).ravel() for v in (predicted, target))
    if len(p) != len(t):
        raise ValueError(f"lengths differ: {len(p)} and {len(t)}")
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    i, j = np.triu_indices(len(p), k=1)
    counted = np.abs(t[i] - t[j]) > noise
    if within is not None:
        member = np.asarray(within, dtype=bool).ravel()
        if len(member) != len(p):
            raise ValueError(f"lengths differ: {len(p)} and {len(member)}")
        counted &= member[i] & member[j]
    right = np.sign(p[i] - p[j]) == np.sign(t[i] - t[j])
    return int((right & counted).sum()), int(counted.sum())


def seed_noise(first: Sequence[float], second: Sequence[float]) -> float:
    """The reference's seed noise as a gap: the root-mean-square difference between two seeds of
    the same shape, sqrt(mean((a - b)^2)). Two shapes whose references differ by less are as far
    apart as one shape from itself: `pair_accuracy` does not judge them. (The sd of one run is
    this over sqrt(2).)"""
    a, b = (np.asarray(v, dtype=float).ravel() for v in (first, second))
    if len(a) != len(b) or len(a) == 0:
        raise ValueError(f"need paired seeds of at least one shape, got {len(a)} and {len(b)}")
    return float(np.sqrt(np.mean((a - b) ** 2)))


def front_recall(
    predicted: Sequence[float], target: Sequence[float], flops: Sequence[float]
) -> tuple[int, int]:
    """How many members of the reference front (target loss against FLOPs) the predictor's front
    (its loss against the same FLOPs) holds: (held, reference front size)."""
    p, t, f = (np.asarray(v, dtype=float).ravel() for v in (predicted, target, flops))
    ours = pareto_mask(np.column_stack([p, f]))
    theirs = pareto_mask(np.column_stack([t, f]))
    return int((ours & theirs).sum()), int(theirs.sum())


def knee_regret(predicted: Sequence[float], target: Sequence[float], flops: Sequence[float]) -> float:
    """The knee's regret at the reference: the target loss of the knee of the predictor's front
    (`pareto.knee_index`, as `export --knee` picks it) minus the best target loss among shapes of
    equal or lower FLOPs. 0 when the knee is the best the reference knows at its cost."""
    p, t, f = (np.asarray(v, dtype=float).ravel() for v in (predicted, target, flops))
    front = np.flatnonzero(pareto_mask(np.column_stack([p, f])))
    knee = front[knee_index(np.column_stack([p[front], f[front]]), ["loss", "flops"])]
    return float(t[knee] - t[f <= f[knee]].min())


def measures(
    predicted: Sequence[float] | Sequence[Sequence[float]],
    target: Sequence[float],
    flops: Sequence[float],
    *,
    params_predictor: Sequence[float],
    flops_predictor: Sequence[float],
    noise: float = 0.0,
    within: Sequence[bool] | None = None,
) -> dict[str, object]:
    """Every deciding measure of one predictor (one or more repeats) on one set of shapes, as
    JSON-ready data: Spearman and Kendall with intervals, the paired differences against the two
    free predictors (-params and -FLOPs, lower is better), pairs beyond `noise` (and inside
    `within`, the iso-size block, where given), front recall and the knee's regret, each summed
    or averaged over the repeats."""
    rows = _repeats(predicted)
    pairs = [pair_accuracy(r, target, noise) for r in rows]
    inside = [pair_accuracy(r, target, noise, within=within) for r in rows] if within is not None else []
    recall = [front_recall(r, target, flops) for r in rows]
    return {
        "spearman": rank_correlation(rows, target).to_dict(),
        "kendall": rank_correlation(rows, target, "kendall").to_dict(),
        "vs_params": paired_difference(rows, params_predictor, target).to_dict(),
        "vs_flops": paired_difference(rows, flops_predictor, target).to_dict(),
        "pairs": [sum(p[0] for p in pairs), sum(p[1] for p in pairs)],
        "iso_pairs": [sum(p[0] for p in inside), sum(p[1] for p in inside)],
        "front_recall": [sum(r[0] for r in recall), sum(r[1] for r in recall)],
        "knee_regret": float(np.mean([knee_regret(r, target, flops) for r in rows])),
    }
