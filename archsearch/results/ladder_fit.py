"""The scaling law across size ladders: `L(N) = E + A_d * N^-alpha`, fitted jointly. Pure numpy + scipy.

A ladder trains one design (`space.scale.design_choices`) at several sizes with tokens in
proportion to its parameters; at a fixed ratio of tokens to parameters the Chinchilla law
`E + A / N^alpha + B / D^beta` (Hoffmann et al. 2022) is a law in N alone
(docs/explanations/scaling.md).
Here the exponent `alpha` and the irreducible loss `E` are shared by every design and only the
coefficient `A_d` is the design's own: the few constants that conditional scaling laws share across
architectures (Bian et al. 2025), so a handful of rungs per design pins them. With one exponent the
designs' curves never cross: the law ranks designs by `A_d` at every size, and what it adds to a
plain ranking is the loss itself, with an interval, at the size a user trains.

How:
1. `scipy.optimize.least_squares` on the losses (nats per token), parameters `E`, `alpha` and
   `ln a_d` with `a_d = A_d * n_ref^-alpha` (N measured in units of `n_ref`, so the coefficients
   stay near 1 whatever the sizes), `0 <= E <= min(loss)` and `alpha` in (0, 4]; several starts,
   the lowest cost kept (E and alpha trade off over a short ladder, so one start can stall).
2. The interval: a bootstrap over rungs, stratified by design (each design's rungs drawn with
   replacement, so every design stays in), each resample refitted from the full fit; a resample
   that leaves a design on one size, or fewer points than constants, is drawn again. A prediction's
   interval is the 2.5th and 97.5th percentiles of the resamples' predictions.
3. The error grows with the distance extrapolated (OLMo 2024; DataDecide 2025): every prediction
   carries it, the target over the largest rung of its design.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from archsearch.errors import ArchsearchError

N_REF = 1e6  # sizes are fitted in units of 1M parameters: A_d stays O(1) from 10k to 10B
ALPHA_BOUNDS = (1e-3, 4.0)  # Chinchilla 0.34, Kaplan 0.076 (non-embedding): far inside
DEFAULT_RESAMPLES = 200  # percentile interval; 200 keeps a fit of 8 ladders to about a second
MAX_REDRAWS = 20  # per resample, when a draw leaves a design on one size
# An E below this fraction of the lowest rung loss sits on its bound 0 (the solver stops a little
# inside a bound: 3e-5 nats for rungs of a law with no floor): the rungs did not pin it.
FLOOR_TOLERANCE = 1e-3
# Starting points: the exponent from shallow to steep, E from none to just under the best loss.
_ALPHA_STARTS = (0.1, 0.3, 0.7, 1.5)
_E_STARTS = (0.0, 0.5, 0.9)


class LadderFitError(ArchsearchError):
    """Rungs that cannot be fitted: too few, a design on one size, a size or loss that is not finite
    and positive."""


@dataclass(frozen=True)
class RungPoint:
    """One trained rung: a design at one size and the loss it reached."""

    design: Hashable  # e.g. a trial number
    n: float  # parameters (the ladder fits non-embedding ones)
    loss: float  # held-out nats per token


@dataclass(frozen=True)
class Prediction:
    """The law's loss for one design at one size, with its bootstrap interval."""

    design: Hashable
    n: float
    loss: float
    low: float  # 2.5th percentile over the resamples
    high: float  # 97.5th percentile
    n_low: float  # the design's smallest and largest rung
    n_high: float

    @property
    def distance(self) -> float:
        """How far the prediction reaches: the target over the largest rung (> 1: extrapolated)."""
        return self.n / self.n_high

    @property
    def extrapolated(self) -> bool:
        return not self.n_low <= self.n <= self.n_high

    def to_dict(self) -> dict[str, Any]:
        return {
            "design": self.design, "n": self.n, "loss": self.loss, "low": self.low, "high": self.high,
            "n_low": self.n_low, "n_high": self.n_high, "distance": self.distance,
            "extrapolated": self.extrapolated,
        }  # fmt: skip


@dataclass(frozen=True)
class LadderFit:
    """The fitted law, its residuals and its bootstrap resamples.

    `boot` holds one row per resample: E, alpha, then ln a_d in `designs` order.
    """

    designs: tuple[Hashable, ...]
    e: float
    alpha: float
    log_a: tuple[float, ...]  # ln a_d, a_d = A_d * n_ref^-alpha, in `designs` order
    n_ref: float
    points: tuple[RungPoint, ...]
    boot: np.ndarray  # (resamples, 2 + designs)
    redraws: int  # resamples drawn again because they left a design on one size

    @property
    def floor_pinned(self) -> bool:
        """Whether the rungs pin the irreducible loss E: not when the fit left it on its lower
        bound, 0, where a short ladder of small models puts it (their losses still fall steeply),
        and the law then falls without limit: far past the rungs it predicts too low a loss."""
        return self.e > FLOOR_TOLERANCE * min(p.loss for p in self.points)

    def backtest(self) -> dict[Hashable, tuple[float, float]]:
        """The ladder's own check of its extrapolation: the law fitted again without the top rung of
        every design that has 3 sizes or more, each of those top rungs predicted from the rest.

        Returns:
            By design: (predicted / measured - 1, the distance: the top rung over the largest one
            left). Empty when no design has 3 sizes, or the rest cannot be fitted.
        """
        tops: dict[Hashable, RungPoint] = {}
        for d in self.designs:
            mine = [p for p in self.points if p.design == d]
            if len({p.n for p in mine}) >= 3:
                tops[d] = max(mine, key=lambda p: p.n)
        rest = [p for p in self.points if not (p.design in tops and p.n == tops[p.design].n)]
        try:
            fit = fit_ladders(rest, n_ref=self.n_ref, resamples=0) if tops else None
        except LadderFitError:
            fit = None
        if fit is None:
            return {}
        out = {}
        for d, top in tops.items():
            below = max(p.n for p in rest if p.design == d)
            out[d] = (float(fit.loss(d, top.n)) / top.loss - 1, top.n / below)
        return out

    def coefficient(self, design: Hashable) -> float:
        """A_d of `L = E + A_d N^-alpha` with N in parameters."""
        return math.exp(self.log_a[self._index(design)]) * self.n_ref**self.alpha

    def _index(self, design: Hashable) -> int:
        try:
            return self.designs.index(design)
        except ValueError:
            raise LadderFitError(f"no ladder for {design!r} in the fit") from None

    def loss(self, design: Hashable, n: float | np.ndarray) -> float | np.ndarray:
        """The fitted law's loss of `design` at `n` parameters."""
        return _law(self.e, self.alpha, self.log_a[self._index(design)], np.asarray(n, float) / self.n_ref)

    def predict(self, design: Hashable, n: float) -> Prediction:
        """The loss of `design` at `n` parameters with its 95% bootstrap interval.

        Raises:
            LadderFitError: `design` is not in the fit, or `n` is not a positive number.
        """
        if not (isinstance(n, numbers.Real) and math.isfinite(n) and n > 0):
            raise LadderFitError(f"a prediction needs a positive size, got {n!r}")
        i = self._index(design)
        x = n / self.n_ref
        samples = _law(self.boot[:, 0], self.boot[:, 1], self.boot[:, 2 + i], x)
        low, high = (
            (float(v) for v in np.percentile(samples, [2.5, 97.5])) if len(samples) else (math.nan, math.nan)
        )
        sizes = [p.n for p in self.points if p.design == design]
        return Prediction(design, float(n), float(self.loss(design, n)), low, high, min(sizes), max(sizes))

    @property
    def residuals(self) -> np.ndarray:
        """Fitted minus measured loss per point, in `points` order (nats per token)."""
        return np.array([self.loss(p.design, p.n) - p.loss for p in self.points], dtype=float)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the constants, per-design coefficients, each point's residual, and the
        resamples' spread of E and alpha."""
        res = self.residuals
        rel = res / np.array([p.loss for p in self.points])

        def q(v: np.ndarray) -> list[float] | None:
            return [float(x) for x in np.percentile(v, [2.5, 97.5])] if len(v) else None

        return {
            "law": "L(N) = E + A_d * N^-alpha",
            "E": self.e,
            "alpha": self.alpha,
            "n_ref": self.n_ref,
            "A": {str(d): self.coefficient(d) for d in self.designs},
            "designs": list(self.designs),
            "residuals": [
                {"design": p.design, "n": p.n, "loss": p.loss, "fitted": p.loss + r, "residual": r}
                for p, r in zip(self.points, res.tolist(), strict=True)
            ],
            "rmse": float(np.sqrt(np.mean(res**2))),
            "max_abs_relative_residual": float(np.max(np.abs(rel))),
            "resamples": len(self.boot),
            "redraws": self.redraws,
            "E_interval": q(self.boot[:, 0]),
            "E_pinned": self.floor_pinned,
            "backtest": [
                {"design": d, "relative_error": err, "distance": dist}
                for d, (err, dist) in self.backtest().items()
            ],
            "alpha_interval": q(self.boot[:, 1]),
        }


def _law(e: Any, alpha: Any, log_a: Any, x: Any) -> Any:
    """E + a x^-alpha with x = N / n_ref, as exp(ln a - alpha ln x) (no overflow for large x)."""
    return e + np.exp(log_a - alpha * np.log(x))


def fit_ladders(
    points: Iterable[RungPoint],
    *,
    n_ref: float = N_REF,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> LadderFit:
    """Fit `L = E + A_d N^-alpha` to every design's rungs at once, with a bootstrap over rungs.

    Args:
        points: the rungs; each design needs at least 2 sizes, and all of them together more
            points than the law has constants (designs + 2).
        n_ref: the size unit of the fit (only conditioning: the law does not depend on it).
        resamples: bootstrap resamples (0: no interval; predictions' bounds are then NaN).
        seed: seeds the resamples, so a fit is reproducible.

    Returns:
        The `LadderFit`, designs in the order they first appear.

    Raises:
        LadderFitError: no points, a design with fewer than 2 distinct sizes, no more points than
            constants, or a size or loss that is not a finite positive number.
    """
    points = tuple(points)
    if not points:
        raise LadderFitError("no rungs to fit")
    for p in points:
        for what, v in (("size", p.n), ("loss", p.loss)):
            if not (isinstance(v, numbers.Real) and math.isfinite(v) and v > 0):
                raise LadderFitError(
                    f"design {p.design!r}: a rung's {what} must be a finite positive number, got {v!r}"
                )
    designs = tuple(dict.fromkeys(p.design for p in points))
    for d in designs:
        sizes = {p.n for p in points if p.design == d}
        if len(sizes) < 2:
            raise LadderFitError(
                f"design {d!r} has a ladder of {len(sizes)} size; a ladder needs at least 2 rungs of "
                "different sizes"
            )
    constants = len(designs) + 2
    if len(points) <= constants:
        raise LadderFitError(
            f"{len(points)} rungs over {len(designs)} designs cannot fit {constants} constants "
            f"(E, alpha and one A per design): give at least {constants + 1}"
        )
    index = np.array([designs.index(p.design) for p in points])
    x = np.array([p.n for p in points], dtype=float) / n_ref
    y = np.array([p.loss for p in points], dtype=float)
    theta = _best_start_fit(index, x, y, len(designs))
    boot, redraws = _bootstrap(index, x, y, len(designs), theta, resamples, seed)
    return LadderFit(
        designs=designs,
        e=float(theta[0]),
        alpha=float(theta[1]),
        log_a=tuple(float(v) for v in theta[2:]),
        n_ref=float(n_ref),
        points=points,
        boot=boot,
        redraws=redraws,
    )


def _solve(
    index: np.ndarray, x: np.ndarray, y: np.ndarray, k: int, x0: np.ndarray
) -> tuple[np.ndarray, float]:
    """One least-squares fit from `x0`: (theta, cost). theta = E, alpha, ln a_1..k."""
    from scipy.optimize import least_squares

    log_x = np.log(x)
    lower = np.r_[0.0, ALPHA_BOUNDS[0], np.full(k, -np.inf)]
    upper = np.r_[float(np.min(y)), ALPHA_BOUNDS[1], np.full(k, np.inf)]
    x0 = np.clip(x0, lower, np.nextafter(upper, -np.inf))

    def residuals(t: np.ndarray) -> np.ndarray:
        return t[0] + np.exp(t[2 + index] - t[1] * log_x) - y

    def jacobian(t: np.ndarray) -> np.ndarray:
        term = np.exp(t[2 + index] - t[1] * log_x)
        jac = np.zeros((len(y), 2 + k))
        jac[:, 0] = 1.0
        jac[:, 1] = -term * log_x
        jac[np.arange(len(y)), 2 + index] = term
        return jac

    found = least_squares(residuals, x0, jac=jacobian, bounds=(lower, upper), method="trf", x_scale="jac")
    return found.x, float(found.cost)


def _best_start_fit(index: np.ndarray, x: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """The lowest-cost fit over a grid of starting exponents and floors (see the module docstring)."""
    best, best_cost = None, math.inf
    floor = float(np.min(y))
    for alpha in _ALPHA_STARTS:
        for fraction in _E_STARTS:
            e = fraction * floor
            # Each design's ln a from its own rungs at this (E, alpha): ln(L - E) + alpha ln x, averaged.
            log_a = [
                float(np.mean(np.log(y[index == d] - e) + alpha * np.log(x[index == d]))) for d in range(k)
            ]
            theta, cost = _solve(index, x, y, k, np.array([e, alpha, *log_a]))
            if cost < best_cost:
                best, best_cost = theta, cost
    assert best is not None  # the grid is not empty
    return best


def _bootstrap(
    index: np.ndarray, x: np.ndarray, y: np.ndarray, k: int, theta: np.ndarray, resamples: int, seed: int
) -> tuple[np.ndarray, int]:
    """Refits on resamples of the rungs, stratified by design; (rows of theta, redraws)."""
    rng = np.random.default_rng(seed)
    groups = [np.flatnonzero(index == d) for d in range(k)]
    rows, redraws = [], 0
    for _ in range(resamples):
        for _attempt in range(MAX_REDRAWS):
            take = np.concatenate([rng.choice(g, size=len(g), replace=True) for g in groups])
            if (
                all(len(np.unique(x[take][index[take] == d])) >= 2 for d in range(k))
                and len({(int(i), float(v)) for i, v in zip(index[take], x[take], strict=True)}) >= k + 2
            ):
                break
            redraws += 1
        else:
            continue  # a design with two rungs rarely keeps both: this resample is left out
        refit, _ = _solve(index[take], x[take], y[take], k, theta)
        rows.append(refit)
    return (np.array(rows) if rows else np.empty((0, 2 + k))), redraws


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> np.ndarray:
    """|predicted - measured| / measured, elementwise: how the benchmark scores a prediction."""
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    return np.abs(p - m) / m
