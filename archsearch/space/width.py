"""MLP width analysis: gated parity sizes and ReLU feature-retention risk.

Background: docs/explanations/shape-costs.md, "MLP width".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from archsearch.errors import ConfigError

# Up to this many hidden units the risk is summed exactly in integers: at m = 131072, n = 16384
# (d_model 16384 at 8x) that takes about 0.13 s on this project's 2-core machines. Past it the
# sum runs in log space, whose cost grows only with n.
EXACT_MAX_UNITS = 1 << 17


def gated_d_ff(d_model: int, multiple_of: int = 256, plain_ratio: float | Fraction = 4) -> int:
    """Hidden width of a gated (GLU) MLP with the parameters of a plain one of `plain_ratio` x.

    A gated MLP has three matrices to a plain MLP's two, so it takes 2/3 of the plain width,
    rounded *up* to `multiple_of` (LLaMA's rule: `d_model = 4096` gives 11008).

    Raises:
        ConfigError: a non-positive size, multiple or ratio.
    """
    for name, value in (("d_model", d_model), ("multiple_of", multiple_of)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if not (math.isfinite(plain_ratio) and plain_ratio > 0):
        raise ConfigError(f"plain_ratio must be positive and finite, got {plain_ratio!r}")
    # Fraction keeps int(8 * d / 3) exact where a float product could land just below an integer.
    hidden = math.floor(Fraction(2) * Fraction(plain_ratio) * d_model / 3)
    return multiple_of * -(-hidden // multiple_of)


@dataclass(frozen=True)
class FeatureLoss:
    """Risk that a ReLU expansion keeps fewer active units than it has inputs.

    Attributes:
        risk: `P(K < n)` for `K ~ Binomial(m, 1/2)`; 0.0 when it underflows a float.
        log10_risk: `log10(P(K < n))`, finite even where `risk` underflows.
        exact: summed in exact integer arithmetic (else in log space).
    """

    risk: float
    log10_risk: float
    exact: bool


@lru_cache(maxsize=4096)
def relu_feature_loss(n: int, m: int) -> FeatureLoss:
    """`P(K < n)` where `K ~ Binomial(m, 1/2)` counts the active units of `m` ReLU units.

    Each of the `m = d_ff` hidden units is taken as independently active with probability 1/2;
    the expansion loses features when fewer than `n = d_model` are active.
    The sum runs over `k = 0 .. n-1`: `k >= n` keeps enough units, including `k = m`.

    Args:
        n: input features (d_model), positive.
        m: hidden units (d_ff), positive.

    Raises:
        ConfigError: `n` or `m` is not a positive integer.
    """
    for name, value in (("n", n), ("m", m)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if n > m:
        return FeatureLoss(risk=1.0, log10_risk=0.0, exact=True)
    if m <= EXACT_MAX_UNITS:
        total, term = 0, 1  # term = C(m, k)
        for k in range(n):
            total += term
            term = term * (m - k) // (k + 1)
        # math.log10 takes arbitrarily large ints, so the log never underflows.
        log10_risk = math.log10(total) - m * math.log10(2)
        return FeatureLoss(risk=total / (1 << m), log10_risk=log10_risk, exact=True)
    return _log_space_feature_loss(n, m)


def _log_space_feature_loss(n: int, m: int) -> FeatureLoss:
    """The same sum in log space, bounded in time and memory whatever the sizes.

    Where the sum holds the mode `m / 2`, it is `1 - P(K <= m - n)` by symmetry (at least about
    1/2); either way the tail left is summed from its largest term down (`_ln_lower_tail`).
    """
    if 2 * (n - 1) >= m:
        ln_risk = math.log1p(-math.exp(_ln_lower_tail(m - n, m)))
    else:
        ln_risk = _ln_lower_tail(n - 1, m)
    return FeatureLoss(risk=math.exp(ln_risk), log10_risk=ln_risk / math.log(10), exact=False)


# The tail is summed down from its largest term until the terms fall this far below it (e^-60:
# what is left cannot move a float), at most _MAX_TERMS terms. Summing every term took a list
# and an lgamma per unit of d_model: `width 1e23` ran out of memory after minutes.
_NEGLIGIBLE_NATS = 60.0
_MAX_TERMS = 100_000


def _ln_lower_tail(h: int, m: int) -> float:
    """`ln P(K <= h)` for `K ~ Binomial(m, 1/2)` and `0 <= h < m / 2`.

    The terms fall away from `h` by the ratio `k / (m - k + 1)`, slowly only where `h` is within a
    few `sqrt(m)` of `m / 2` with `m` in the billions; past `_MAX_TERMS` there the normal
    approximation (continuity-corrected, error O(1 / sqrt(m))) takes over.
    """
    top = math.lgamma(m + 1) - math.lgamma(h + 1) - math.lgamma(m - h + 1) - m * math.log(2)
    total, relative, k = 1.0, 0.0, h  # terms relative to the top one
    for _ in range(_MAX_TERMS):
        if k == 0 or relative < -_NEGLIGIBLE_NATS:
            return top + math.log(total)
        relative += math.log(k / (m - k + 1))
        k -= 1
        total += math.exp(relative)
    z = (h + 0.5 - m / 2) / (math.sqrt(m) / 2)
    if z > -30:
        return math.log(0.5 * math.erfc(-z / math.sqrt(2)))
    return -z * z / 2 - math.log(-z) - 0.5 * math.log(2 * math.pi)  # Mills' ratio: erfc underflows
