"""The scaling law across size ladders: `L(N) = E + A_d * N^-alpha`, fitted jointly, or with rungs
at several ratios of tokens to parameters `L(N, D) = E + A_d * N^-alpha + B * D^-beta`. Pure numpy + scipy.

A ladder trains one design (`space.scale_candidates.design_choices`) at several sizes with tokens in
proportion to its parameters; at a fixed ratio of tokens to parameters the Chinchilla law
`E + A / N^alpha + B / D^beta` (Hoffmann et al. 2022) is a law in N alone
(docs/explanations/scaling.md).
Here the exponent `alpha` and the irreducible loss `E` are shared by every design and only the
coefficient `A_d` is the design's own: the few constants that conditional scaling laws share across
architectures (Bian et al. 2025), so a handful of rungs per design pins them. With one exponent the
designs' curves never cross: the law ranks designs by `A_d` at every size, and what it adds to a
plain ranking is the loss itself, with an interval, at the size a user trains.

Rungs trained at several ratios of tokens to parameters (each `RungPoint` with its `tokens`) say
how the loss falls with data too: over them the whole Chinchilla law `L(N, D) = E + A_d / N^alpha
+ B / D^beta` is fitted, `E`, `alpha`, `B` and `beta` shared, and it predicts at any (N, D), a user
training far past 20 tokens per parameter included. Rungs at one ratio cannot tell `B / D^beta`
from the `N` term; over them the law in N alone is fitted, exactly as without tokens, and it
predicts at that ratio only.

How:
1. `scipy.optimize.least_squares` on the losses (nats per token), parameters `E`, `alpha` and
   `ln a_d` with `a_d = A_d * n_ref^-alpha` (N measured in units of `n_ref`, so the coefficients
   stay near 1 whatever the sizes), `0 <= E <= min(loss)` and `alpha` in (0, 4]; several starts,
   the lowest cost kept (E and alpha trade off over a short ladder, so one start can stall). The
   joint law adds `ln b` with `b = B * d_ref^-beta` (D in units of `D_REF`) and `beta` in (0, 4],
   starting from Chinchilla's beta.
2. The interval: a bootstrap over rungs, stratified by design (each design's rungs drawn with
   replacement, so every design stays in), each resample refitted from the full fit; a resample
   that leaves a design on one size, or fewer points than constants, is drawn again. A prediction's
   interval is the 2.5th and 97.5th percentiles of the resamples' predictions. For the joint law
   a resample must also keep rungs at more than one ratio.
3. The error grows with the distance extrapolated (OLMo 2024; DataDecide 2025): every prediction
   carries it, the target over the largest rung of its design.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from archsearch.errors import ArchsearchError

N_REF = 1e6  # sizes are fitted in units of 1M parameters: A_d stays O(1) from 10k to 10B
D_REF = 20 * N_REF  # tokens in units of Chinchilla's 20 per reference parameter: b stays O(1) too
# Tokens per parameter within this factor of each other are one ratio: a ladder rounds each rung's
# tokens to whole steps (0.1-3% off its ratio), while a second ratio worth fitting is 2x or more away.
RATIO_TOLERANCE = 1.1
ALPHA_BOUNDS = (1e-3, 4.0)  # Chinchilla 0.34, Kaplan 0.076 (non-embedding): far inside
DEFAULT_RESAMPLES = 200  # percentile interval; 200 keeps a fit of 8 ladders to about a second
MAX_REDRAWS = 20  # per resample, when a draw leaves a design on one size
# An E below this fraction of the lowest rung loss sits on its bound 0 (the solver stops a little
# inside a bound: 3e-5 nats for rungs of a law with no floor): the rungs did not pin it.
FLOOR_TOLERANCE = 1e-3
# Starting points: the exponent from shallow to steep, E from none to just under the best loss.
_ALPHA_STARTS = (0.1, 0.3, 0.7, 1.5)
_E_STARTS = (0.0, 0.5, 0.9)
# One start for beta, Chinchilla's 0.28: the grid over E and alpha already covers the trade-off
# that stalls a start, and each further start multiplies the fit's cost.
_BETA_STARTS = (0.3,)


class LadderFitError(ArchsearchError):
    """Rungs that cannot be fitted: too few, a design on one size, a size, loss or token count that
    is not finite and positive; or a prediction the rungs cannot make (tokens at a ratio they never
    trained at)."""


@dataclass(frozen=True)
class RungPoint:
    """One trained rung: a design at one size and the loss it reached, with the tokens it trained
    on where known (None: the law in N alone, at the ladder's one ratio)."""

    design: Hashable  # e.g. a trial number
    n: float  # parameters (the ladder fits non-embedding ones)
    loss: float  # held-out nats per token
    tokens: float | None = None  # training tokens of the rung


def _one_ratio(ratios: Sequence[float]) -> bool:
    """Whether tokens-per-parameter ratios all lie within `RATIO_TOLERANCE` of each other."""
    return max(ratios) <= RATIO_TOLERANCE * min(ratios)


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
    tokens: float | None = None  # the training tokens predicted at (None: the ladder's own ratio)
    ratio_high: float | None = None  # the design's largest tokens per parameter among its rungs

    @property
    def ratio_distance(self) -> float | None:
        """How far the prediction reaches in tokens per parameter: its ratio over the design's
        largest rung's (> 1: more tokens per parameter than any rung trained on); None without
        tokens."""
        if self.tokens is None or self.ratio_high is None:
            return None
        return self.tokens / self.n / self.ratio_high

    @property
    def distance(self) -> float:
        """How far the prediction reaches: the target over the largest rung (> 1: extrapolated)."""
        return self.n / self.n_high

    @property
    def extrapolated(self) -> bool:
        return not self.n_low <= self.n <= self.n_high

    def to_dict(self) -> dict[str, Any]:
        out = {
            "design": self.design, "n": self.n, "loss": self.loss, "low": self.low, "high": self.high,
            "n_low": self.n_low, "n_high": self.n_high, "distance": self.distance,
            "extrapolated": self.extrapolated,
        }  # fmt: skip
        if self.tokens is not None:
            out |= {
                "tokens": self.tokens,
                "ratio_high": self.ratio_high,
                "ratio_distance": self.ratio_distance,
            }
        return out


@dataclass(frozen=True)
class LadderFit:
    """The fitted law, its residuals and its bootstrap resamples.

    `boot` holds one row per resample: E, alpha, then ln a_d in `designs` order, then for the joint
    law ln b and beta. `beta` None: the law in N alone (rungs without tokens, or at one ratio).
    """

    designs: tuple[Hashable, ...]
    e: float
    alpha: float
    log_a: tuple[float, ...]  # ln a_d, a_d = A_d * n_ref^-alpha, in `designs` order
    n_ref: float
    points: tuple[RungPoint, ...]
    boot: np.ndarray  # (resamples, 2 + designs), + 2 for the joint law
    redraws: int  # resamples drawn again because they left a design on one size
    log_b: float | None = None  # ln b, b = B * d_ref^-beta: the joint law's data term
    beta: float | None = None  # the joint law's data exponent
    d_ref: float = D_REF

    @property
    def joint(self) -> bool:
        """Whether this is the joint law L(N, D) (rungs at more than one ratio of tokens to parameters)."""
        return self.beta is not None

    @property
    def ratios(self) -> tuple[float, float] | None:
        """The rungs' smallest and largest tokens per parameter; None where a rung has no tokens."""
        if any(p.tokens is None for p in self.points):
            return None
        r = [p.tokens / p.n for p in self.points]  # type: ignore[operator]
        return min(r), max(r)

    @property
    def token_coefficient(self) -> float | None:
        """B of the joint law's `B D^-beta` with D in tokens; None for the law in N alone."""
        if self.log_b is None or self.beta is None:
            return None
        return math.exp(self.log_b) * self.d_ref**self.beta

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
        return dict(self._backtests)

    @functools.cached_property
    def _backtests(self) -> dict[Hashable, tuple[float, float]]:
        # Fitted once per fit: a ladder's report reads it several times (its record, its table,
        # its backtest line), and each is a fit of its own from every starting point.
        tops: dict[Hashable, RungPoint] = {}
        for d in self.designs:
            mine = [p for p in self.points if p.design == d]
            if len({p.n for p in mine}) >= 3:
                tops[d] = max(mine, key=lambda p: (p.n, p.tokens or 0.0))
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
            out[d] = (float(fit.loss(d, top.n, top.tokens)) / top.loss - 1, top.n / below)
        return out

    def coefficient(self, design: Hashable) -> float:
        """A_d of `L = E + A_d N^-alpha` with N in parameters."""
        return math.exp(self.log_a[self._index(design)]) * self.n_ref**self.alpha

    def _index(self, design: Hashable) -> int:
        try:
            return self.designs.index(design)
        except ValueError:
            raise LadderFitError(f"no ladder for {design!r} in the fit") from None

    def loss(
        self, design: Hashable, n: float | np.ndarray, tokens: float | np.ndarray | None = None
    ) -> float | np.ndarray:
        """The fitted law's loss of `design` at `n` parameters (and, for the joint law, `tokens`
        training tokens; the law in N alone does not read them).

        Raises:
            LadderFitError: `design` is not in the fit, or the joint law is given no tokens.
        """
        i = self._index(design)
        value = _law(self.e, self.alpha, self.log_a[i], np.asarray(n, float) / self.n_ref)
        if not self.joint:
            return value
        if tokens is None:
            raise LadderFitError("the joint law L(N, D) needs the training tokens to give a loss at")
        return value + _law(0.0, self.beta, self.log_b, np.asarray(tokens, float) / self.d_ref)

    def predict(self, design: Hashable, n: float, tokens: float | None = None) -> Prediction:
        """The loss of `design` at `n` parameters trained on `tokens`, with its 95% bootstrap interval.

        The joint law predicts at any (n, tokens) and needs `tokens`. The law in N alone predicts at
        its rungs' one ratio of tokens to parameters: `tokens` None means that ratio, and tokens at
        that ratio (within `RATIO_TOLERANCE`) are accepted; at another ratio its rungs say nothing.

        Raises:
            LadderFitError: `design` is not in the fit; `n` or `tokens` is not a positive number;
                the joint law without `tokens`; or the law in N alone asked at tokens its rungs
                carry none of, or at another ratio than theirs.
        """
        if not (isinstance(n, numbers.Real) and math.isfinite(n) and n > 0):
            raise LadderFitError(f"a prediction needs a positive size, got {n!r}")
        if tokens is not None and not (
            isinstance(tokens, numbers.Real) and math.isfinite(tokens) and tokens > 0
        ):
            raise LadderFitError(f"a prediction needs a positive number of tokens, got {tokens!r}")
        i = self._index(design)
        ratios = self.ratios
        if self.joint and tokens is None:
            raise LadderFitError(
                "rungs at several ratios of tokens to parameters fit L(N, D): say the tokens to predict at"
            )
        if not self.joint and tokens is not None:
            if ratios is None:
                raise LadderFitError(
                    "the rungs do not all carry their tokens: the law in N alone predicts at their own "
                    "ratio only; predict without tokens"
                )
            if not _one_ratio([*ratios, tokens / n]):
                raise LadderFitError(
                    f"rungs at one ratio ({ratios[0]:.3g} tokens per parameter) say nothing about "
                    f"{tokens / n:.3g} tokens per parameter: train rungs at a second ratio to fit L(N, D)"
                )
        samples = _law(self.boot[:, 0], self.boot[:, 1], self.boot[:, 2 + i], n / self.n_ref)
        if self.joint:
            samples = samples + _law(0.0, self.boot[:, -1], self.boot[:, -2], tokens / self.d_ref)
        low, high = (
            (float(v) for v in np.percentile(samples, [2.5, 97.5])) if len(samples) else (math.nan, math.nan)
        )
        mine = [p for p in self.points if p.design == design]
        sizes = [p.n for p in mine]
        loss = float(self.loss(design, n, tokens))
        if tokens is None:
            return Prediction(design, float(n), loss, low, high, min(sizes), max(sizes))
        ratio_high = max(p.tokens / p.n for p in mine)  # type: ignore[operator]
        return Prediction(
            design, float(n), loss, low, high, min(sizes), max(sizes), float(tokens), ratio_high
        )

    @property
    def residuals(self) -> np.ndarray:
        """Fitted minus measured loss per point, in `points` order (nats per token)."""
        return np.array([self.loss(p.design, p.n, p.tokens) - p.loss for p in self.points], dtype=float)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the constants, per-design coefficients, each point's residual, and the
        resamples' spread of E and alpha."""
        res = self.residuals
        rel = res / np.array([p.loss for p in self.points])

        def q(v: np.ndarray) -> list[float] | None:
            return [float(x) for x in np.percentile(v, [2.5, 97.5])] if len(v) else None

        out = {
            "law": "L(N, D) = E + A_d * N^-alpha + B * D^-beta"
            if self.joint
            else "L(N) = E + A_d * N^-alpha",
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
        if self.joint:
            out |= {
                "B": self.token_coefficient,
                "beta": self.beta,
                "d_ref": self.d_ref,
                "beta_interval": q(self.boot[:, -1]),
                "ratios": list(self.ratios or ()),
            }
        return out


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
    """Fit `L = E + A_d N^-alpha` to every design's rungs at once, with a bootstrap over rungs; or,
    when every rung carries its tokens and their ratios to parameters differ by more than
    `RATIO_TOLERANCE`, the joint law `L = E + A_d N^-alpha + B D^-beta`.

    Args:
        points: the rungs; each design needs at least 2 sizes, and all of them together more
            points than the law has constants (designs + 2, + 2 more for the joint law).
        n_ref: the size unit of the fit (only conditioning: the law does not depend on it).
        resamples: bootstrap resamples (0: no interval; predictions' bounds are then NaN).
        seed: seeds the resamples, so a fit is reproducible.

    Returns:
        The `LadderFit`, designs in the order they first appear.

    Raises:
        LadderFitError: no points, a design with fewer than 2 distinct sizes, no more points than
            constants, or a size, loss or token count that is not a finite positive number.
    """
    points = tuple(points)
    if not points:
        raise LadderFitError("no rungs to fit")
    for p in points:
        for what, v in (("size", p.n), ("loss", p.loss), ("tokens", p.tokens)):
            if what == "tokens" and v is None:
                continue
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
    joint = all(p.tokens is not None for p in points) and not _one_ratio(
        [p.tokens / p.n for p in points]  # type: ignore[operator]
    )
    constants = len(designs) + (4 if joint else 2)
    if len(points) <= constants:
        which = "E, alpha, B, beta" if joint else "E, alpha"
        raise LadderFitError(
            f"{len(points)} rungs over {len(designs)} designs cannot fit {constants} constants "
            f"({which} and one A per design): give at least {constants + 1}"
        )
    index = np.array([designs.index(p.design) for p in points])
    x = np.array([p.n for p in points], dtype=float) / n_ref
    y = np.array([p.loss for p in points], dtype=float)
    t = np.array([p.tokens for p in points], dtype=float) / D_REF if joint else None
    k = len(designs)
    theta = _best_start_fit(index, x, y, k, t)
    boot, redraws = _bootstrap(index, x, y, k, theta, resamples, seed, t)
    return LadderFit(
        designs=designs,
        e=float(theta[0]),
        alpha=float(theta[1]),
        log_a=tuple(float(v) for v in theta[2 : 2 + k]),
        n_ref=float(n_ref),
        points=points,
        boot=boot,
        redraws=redraws,
        log_b=float(theta[-2]) if joint else None,
        beta=float(theta[-1]) if joint else None,
    )


def _solve(
    index: np.ndarray, x: np.ndarray, y: np.ndarray, k: int, x0: np.ndarray, t: np.ndarray | None = None
) -> tuple[np.ndarray, float]:
    """One least-squares fit from `x0`: (theta, cost). theta = E, alpha, ln a_1..k, and with tokens
    `t` (in units of `D_REF`) ln b, beta."""
    from scipy.optimize import least_squares

    log_x = np.log(x)
    lower = np.r_[0.0, ALPHA_BOUNDS[0], np.full(k, -np.inf)]
    upper = np.r_[float(np.min(y)), ALPHA_BOUNDS[1], np.full(k, np.inf)]
    if t is not None:
        log_t = np.log(t)
        lower = np.r_[lower, -np.inf, ALPHA_BOUNDS[0]]
        upper = np.r_[upper, np.inf, ALPHA_BOUNDS[1]]
    x0 = np.clip(x0, lower, np.nextafter(upper, -np.inf))

    def residuals(th: np.ndarray) -> np.ndarray:
        r = th[0] + np.exp(th[2 + index] - th[1] * log_x) - y
        return r if t is None else r + np.exp(th[-2] - th[-1] * log_t)

    def jacobian(th: np.ndarray) -> np.ndarray:
        term = np.exp(th[2 + index] - th[1] * log_x)
        jac = np.zeros((len(y), len(lower)))
        jac[:, 0] = 1.0
        jac[:, 1] = -term * log_x
        jac[np.arange(len(y)), 2 + index] = term
        if t is not None:
            data = np.exp(th[-2] - th[-1] * log_t)
            jac[:, -2] = data
            jac[:, -1] = -data * log_t
        return jac

    found = least_squares(residuals, x0, jac=jacobian, bounds=(lower, upper), method="trf", x_scale="jac")
    return found.x, float(found.cost)


def _best_start_fit(
    index: np.ndarray, x: np.ndarray, y: np.ndarray, k: int, t: np.ndarray | None = None
) -> np.ndarray:
    """The lowest-cost fit over a grid of starting exponents and floors (see the module docstring)."""
    best, best_cost = None, math.inf
    floor = float(np.min(y))
    # The joint law starts with the loss above E split evenly between its N and D terms.
    share, betas = (1.0, (None,)) if t is None else (0.5, _BETA_STARTS)
    for alpha in _ALPHA_STARTS:
        for beta in betas:
            for fraction in _E_STARTS:
                e = fraction * floor
                # Each design's ln a from its own rungs at this (E, alpha): ln(L - E) + alpha ln x, averaged.
                log_a = [
                    float(np.mean(np.log(share * (y[index == d] - e)) + alpha * np.log(x[index == d])))
                    for d in range(k)
                ]
                start = [e, alpha, *log_a]
                if t is not None:
                    start += [float(np.mean(np.log(share * (y - e)) + beta * np.log(t))), beta]
                theta, cost = _solve(index, x, y, k, np.array(start), t)
                if cost < best_cost:
                    best, best_cost = theta, cost
    assert best is not None  # the grid is not empty
    return best


def _bootstrap(
    index: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    k: int,
    theta: np.ndarray,
    resamples: int,
    seed: int,
    t: np.ndarray | None = None,
) -> tuple[np.ndarray, int]:
    """Refits on resamples of the rungs, stratified by design; (rows of theta, redraws). For the
    joint law (tokens `t`) a resample must also keep more than one ratio of tokens to parameters."""
    rng = np.random.default_rng(seed)
    groups = [np.flatnonzero(index == d) for d in range(k)]
    rows, redraws = [], 0
    for _ in range(resamples):
        for _attempt in range(MAX_REDRAWS):
            take = np.concatenate([rng.choice(g, size=len(g), replace=True) for g in groups])
            if t is None:
                distinct = {(int(i), float(v)) for i, v in zip(index[take], x[take], strict=True)}
            else:
                distinct = {
                    (int(i), float(v), float(w))
                    for i, v, w in zip(index[take], x[take], t[take], strict=True)
                }
            if (
                all(len(np.unique(x[take][index[take] == d])) >= 2 for d in range(k))
                and len(distinct) >= len(theta)
                and (t is None or not _one_ratio(list(t[take] / x[take])))
            ):
                break
            redraws += 1
        else:
            continue  # a design with two rungs rarely keeps both: this resample is left out
        refit, _ = _solve(index[take], x[take], y[take], k, theta, None if t is None else t[take])
        rows.append(refit)
    return (np.array(rows) if rows else np.empty((0, len(theta)))), redraws


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> np.ndarray:
    """|predicted - measured| / measured, elementwise: how the benchmark scores a prediction."""
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    return np.abs(p - m) / m
