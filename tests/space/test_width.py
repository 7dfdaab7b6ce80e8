from __future__ import annotations

import math
from fractions import Fraction

import pytest

from archsearch.errors import ConfigError
from archsearch.space import gated_d_ff, relu_feature_loss
from archsearch.space.width import _log_space_feature_loss


@pytest.mark.parametrize(("d_model", "d_ff"), [(4096, 11008), (5120, 13824), (8192, 22016), (2048, 5632)])
def test_gated_d_ff_follows_llamas_rule(d_model, d_ff):
    assert gated_d_ff(d_model, multiple_of=256) == d_ff


def test_gated_d_ff_keeps_plain_parity():
    # 3 * d * d_ff >= 2 * d * (4d), within one multiple.
    for d in (64, 96, 768, 1000, 4096):
        d_ff = gated_d_ff(d, multiple_of=64)
        assert 3 * d_ff >= 8 * d > 3 * (d_ff - 64)
        assert d_ff % 64 == 0


def test_gated_d_ff_ratio_is_exact():
    assert gated_d_ff(3, multiple_of=1, plain_ratio=Fraction(4)) == 8
    assert gated_d_ff(768, multiple_of=1, plain_ratio=3) == 1536


@pytest.mark.parametrize("bad", [0, -64, 2.5, True])
def test_gated_d_ff_rejects_bad_sizes(bad):
    with pytest.raises(ConfigError, match="must be a positive integer"):
        gated_d_ff(bad)


def exact_risk(n: int, m: int) -> Fraction:
    return Fraction(sum(math.comb(m, k) for k in range(n)), 2**m)


@pytest.mark.parametrize(("n", "m"), [(1, 1), (1, 2), (2, 2), (3, 5), (4, 8), (10, 20), (10, 40), (33, 65)])
def test_small_sizes_are_exact(n, m):
    result = relu_feature_loss(n, m)
    assert result.exact
    assert result.risk == float(exact_risk(n, m))
    assert result.log10_risk == pytest.approx(math.log10(exact_risk(n, m)), rel=1e-12)


def test_all_units_active_is_not_a_loss():
    # n = m: only K = m keeps n features, so the risk is 1 - 2^-m.
    assert relu_feature_loss(5, 5).risk == 1 - 2**-5
    assert relu_feature_loss(1, 1).risk == 0.5


def test_more_inputs_than_units_always_loses():
    assert relu_feature_loss(10, 9).risk == 1.0


def test_two_x_stays_near_half_while_four_x_vanishes():
    # At m = 2n the risk is (1 - C(2n, n) / 4^n) / 2, which tends to 1/2 from below.
    for n in (64, 1024, 16384):
        closed_form = float((1 - Fraction(math.comb(2 * n, n), 4**n)) / 2)
        assert relu_feature_loss(n, 2 * n).risk == pytest.approx(closed_form, rel=1e-12)
        assert 0.46 < closed_form < 0.5
    assert relu_feature_loss(64, 256).log10_risk < -9
    assert relu_feature_loss(1024, 4096).log10_risk < -200


def test_underflow_returns_finite_log10():
    result = relu_feature_loss(16384, 8 * 16384)
    assert result.risk == 0.0
    assert math.isfinite(result.log10_risk)
    assert result.log10_risk == pytest.approx(-18012.652297553577, rel=1e-9)


def test_risk_falls_with_width():
    logs = [relu_feature_loss(512, m).log10_risk for m in (1024, 1536, 2048, 4096)]
    assert logs == sorted(logs, reverse=True)


@pytest.mark.parametrize(("n", "m"), [(16, 64), (512, 1024), (1000, 3000), (4096, 16384), (16384, 131072)])
def test_log_space_agrees_with_exact(n, m):
    assert _log_space_feature_loss(n, m).log10_risk == pytest.approx(
        relu_feature_loss(n, m).log10_risk, rel=1e-9, abs=1e-12
    )


def test_past_exact_limit_uses_log_space():
    result = relu_feature_loss(16384, 140_000)
    assert not result.exact
    assert result.log10_risk < relu_feature_loss(16384, 131072).log10_risk


@pytest.mark.parametrize(("n", "m"), [(0, 4), (4, 0), (2.0, 4), (True, 4)])
def test_bad_sizes(n, m):
    with pytest.raises(ConfigError, match="must be a positive integer"):
        relu_feature_loss(n, m)
