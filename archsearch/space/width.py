"""MLP width analysis (BRIEF.md section 2): gated parity sizes and ReLU feature-retention risk."""

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
    if plain_ratio <= 0:
        raise ConfigError(f"plain_ratio must be positive, got {plain_ratio!r}")
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
    the expansion loses features when fewer than `n = d_model` are active (BRIEF.md section 2).
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
    """The same sum as a log-sum-exp of `log C(m, k) - m log 2`, via `lgamma`."""
    log_m_fact = math.lgamma(m + 1)
    logs = [log_m_fact - math.lgamma(k + 1) - math.lgamma(m - k + 1) for k in range(n)]
    peak = max(logs)
    log_total = peak + math.log(math.fsum(math.exp(x - peak) for x in logs))
    ln_risk = log_total - m * math.log(2)
    log10_risk = ln_risk / math.log(10)
    return FeatureLoss(risk=math.exp(ln_risk), log10_risk=log10_risk, exact=False)
