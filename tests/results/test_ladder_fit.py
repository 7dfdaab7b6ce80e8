"""The joint ladder law: it recovers known constants, states its interval and distance, refuses what
it cannot fit."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from archsearch.results.ladder_fit import LadderFitError, RungPoint, fit_ladders, relative_errors

E, ALPHA = 1.25, 0.34  # Chinchilla's exponent; a byte-level floor
A = {"a": 30.0, "b": 36.0, "c": 45.0}  # per design: b and c worse than a at every size
SIZES = (62_500, 125_000, 250_000, 500_000)


def _points(noise: float = 0.0, seed: int = 0, sizes=SIZES, designs=A) -> list[RungPoint]:
    rng = np.random.default_rng(seed)
    return [
        RungPoint(d, n, E + a * n**-ALPHA + noise * rng.standard_normal())
        for d, a in designs.items()
        for n in sizes
    ]


def test_the_fit_recovers_a_known_exponent_floor_and_coefficients():
    fit = fit_ladders(_points(), resamples=0)
    assert fit.alpha == pytest.approx(ALPHA, rel=1e-5)
    assert fit.e == pytest.approx(E, rel=1e-5)
    for design, a in A.items():
        assert fit.coefficient(design) == pytest.approx(a, rel=1e-4)
    assert np.max(np.abs(fit.residuals)) < 1e-8
    # Four times past the top rung, the law's own loss.
    p = fit.predict("b", 2e6)
    assert p.loss == pytest.approx(E + A["b"] * 2e6**-ALPHA, rel=1e-6)
    assert p.distance == pytest.approx(4.0) and p.extrapolated
    assert math.isnan(p.low) and math.isnan(p.high)  # no resamples, no interval
    assert fit.floor_pinned and fit.to_dict()["E_pinned"]


def test_rungs_still_falling_faster_than_any_floor_allows_leave_e_unpinned():
    """Losses that fall more steeply than a power law with a floor (short runs of tiny models, as
    the quick start's ladder): the fit puts E on its bound, 0, and says it did not pin it."""
    points = [RungPoint(d, n, a * n**-0.45) for d, a in A.items() for n in SIZES]
    fit = fit_ladders(points, resamples=0)
    assert fit.e == pytest.approx(0.0, abs=1e-4)
    assert not fit.floor_pinned and fit.to_dict()["E_pinned"] is False


def test_with_noise_the_interval_holds_the_truth_and_grows_with_the_distance():
    fit = fit_ladders(_points(noise=0.003, seed=1), resamples=200, seed=0)
    assert abs(fit.alpha - ALPHA) < 0.1 and abs(fit.e - E) < 0.15
    near, far = fit.predict("a", 2e6), fit.predict("a", 2e9)
    truth = E + A["a"] * 2e6**-ALPHA
    assert near.low <= truth <= near.high
    assert near.low < near.loss < near.high
    assert far.high - far.low > near.high - near.low  # further out, wider
    inside = fit.predict("a", 200_000)
    assert not inside.extrapolated and inside.distance == pytest.approx(0.4)
    assert len(fit.boot) == 200


def test_the_fit_is_reproducible_and_its_record_is_json():
    one = fit_ladders(_points(noise=0.003), resamples=50, seed=3)
    two = fit_ladders(_points(noise=0.003), resamples=50, seed=3)
    assert np.array_equal(one.boot, two.boot) and one.predict("c", 1e7) == two.predict("c", 1e7)
    record = json.loads(json.dumps(one.to_dict()))
    assert record["law"] == "L(N) = E + A_d * N^-alpha" and record["designs"] == ["a", "b", "c"]
    assert len(record["residuals"]) == 12 and record["resamples"] == 50
    low, high = record["alpha_interval"]
    assert low <= record["alpha"] <= high
    assert record["rmse"] == pytest.approx(float(np.sqrt(np.mean(one.residuals**2))))


def test_the_designs_share_the_exponent_so_the_ranking_is_the_same_at_every_size():
    fit = fit_ladders(_points(noise=0.002), resamples=0)
    for n in (1e5, 1e7, 1e10):
        losses = [fit.loss(d, n) for d in A]
        assert losses == sorted(losses)  # a < b < c by their coefficients


@pytest.mark.parametrize(
    "points, match",
    [
        ([], "no rungs to fit"),
        ([RungPoint("a", 1e5, 2.0), *_points(designs={"b": 30.0})], "design 'a' has a ladder of 1 size"),
        ([RungPoint("a", 1e5, 2.0), RungPoint("a", 1e5, 2.1)], "design 'a' has a ladder of 1 size"),
        (_points(sizes=SIZES[:3], designs={"a": 30.0}), "3 rungs over 1 designs cannot fit 3 constants"),
        (_points(sizes=SIZES[:2], designs={"a": 30.0, "b": 36.0}), "4 rungs over 2 designs cannot fit 4"),
        ([RungPoint("a", 1e5, 0.0), *_points()], "a rung's loss must be a finite positive number"),
        ([RungPoint("a", -1.0, 2.0), *_points()], "a rung's size must be a finite positive number"),
        ([RungPoint("a", 1e5, math.nan), *_points()], "a rung's loss must be"),
    ],
    ids=["none", "one-rung", "one-size", "one-design-three-rungs", "two-rungs-each", "zero-loss",
         "negative-size", "nan-loss"],
)  # fmt: skip
def test_what_cannot_be_fitted_is_refused_in_one_line(points, match):
    with pytest.raises(LadderFitError, match=match) as caught:
        fit_ladders(points, resamples=0)
    assert "\n" not in str(caught.value)


def test_predictions_refuse_an_unknown_design_or_size():
    fit = fit_ladders(_points(), resamples=0)
    with pytest.raises(LadderFitError, match="no ladder for 'z'"):
        fit.predict("z", 1e6)
    with pytest.raises(LadderFitError, match="positive size"):
        fit.predict("a", 0)


def test_two_designs_of_two_rungs_each_fit_when_one_has_a_third():
    points = _points(sizes=SIZES[:2], designs={"a": 30.0}) + _points(sizes=SIZES[:3], designs={"b": 40.0})
    fit = fit_ladders(points, resamples=20)
    assert fit.alpha == pytest.approx(ALPHA, rel=1e-4)
    assert len(fit.boot) + 0 <= 20  # resamples that keep a design on one size are drawn again or left out


def test_relative_errors():
    assert relative_errors([1.1, 0.9], [1.0, 1.0]).tolist() == pytest.approx([0.1, 0.1])


def test_the_backtest_predicts_each_top_rung_from_the_rungs_below_it():
    """On rungs of the law itself the top rungs come back exact, 2x past the rungs left; rungs that
    fall faster at the top than below (the tiny ladders' steep middle) come back too high."""
    tested = fit_ladders(_points(), resamples=0).backtest()
    assert set(tested) == set(A)
    assert all(abs(err) < 1e-6 and dist == pytest.approx(2.0) for err, dist in tested.values())
    two_sizes = [p for p in _points(sizes=SIZES[:2]) if p.design != "c"] + _points(designs={"c": 45.0})
    assert set(fit_ladders(two_sizes, resamples=0).backtest()) == {"c"}  # 2 sizes: not tested
    steep = [RungPoint(p.design, p.n, p.loss - (0.2 if p.n == SIZES[-1] else 0.0)) for p in _points()]
    fit = fit_ladders(steep, resamples=0)
    assert all(err > 0.05 for err, _ in fit.backtest().values())
    assert [b["design"] for b in fit.to_dict()["backtest"]] == list(A)


# The joint law L(N, D) = E + A_d / N^alpha + B / D^beta over rungs at several ratios.
B, BETA = 410.0, 0.28  # Chinchilla's beta and B
RATIOS = (10, 20, 40, 100)


def _joint_points(noise: float = 0.0, seed: int = 0, ratios=RATIOS) -> list[RungPoint]:
    rng = np.random.default_rng(seed)
    return [
        RungPoint(
            d, n, E + a * n**-ALPHA + B * (r * n) ** -BETA + noise * rng.standard_normal(), tokens=r * n
        )
        for d, a in A.items()
        for n in SIZES
        for r in ratios
    ]


def test_the_joint_fit_recovers_known_floor_exponents_and_data_term():
    fit = fit_ladders(_joint_points(), resamples=0)
    assert fit.joint and fit.to_dict()["law"] == "L(N, D) = E + A_d * N^-alpha + B * D^-beta"
    assert fit.e == pytest.approx(E, rel=1e-4)
    assert fit.alpha == pytest.approx(ALPHA, rel=1e-4)
    assert fit.beta == pytest.approx(BETA, rel=1e-4)
    assert fit.token_coefficient == pytest.approx(B, rel=1e-3)
    for design, a in A.items():
        assert fit.coefficient(design) == pytest.approx(a, rel=1e-3)
    # Four times past the top rung, at 1,000 tokens per parameter (10x past the top ratio).
    p = fit.predict("b", 2e6, tokens=2e9)
    assert p.loss == pytest.approx(E + A["b"] * 2e6**-ALPHA + B * 2e9**-BETA, rel=1e-6)
    assert p.tokens == 2e9 and p.to_dict()["tokens"] == 2e9
    assert p.distance == pytest.approx(4.0) and p.ratio_distance == pytest.approx(10.0)


def test_the_joint_fit_with_noise_holds_the_truth_in_its_interval():
    fit = fit_ladders(_joint_points(noise=0.003, seed=2), resamples=100, seed=0)
    assert abs(fit.alpha - ALPHA) < 0.1 and abs(fit.beta - BETA) < 0.1 and abs(fit.e - E) < 0.15
    p = fit.predict("a", 1e6, tokens=1e8)
    truth = E + A["a"] * 1e6**-ALPHA + B * 1e8**-BETA
    assert p.low <= truth <= p.high and p.low < p.loss < p.high
    assert abs(p.loss / truth - 1) < 0.01
    assert fit.boot.shape == (100, 2 + len(A) + 2)
    low, high = fit.to_dict()["beta_interval"]
    assert low <= fit.beta <= high


def test_the_joint_law_needs_the_tokens_to_predict_at():
    fit = fit_ladders(_joint_points(), resamples=0)
    with pytest.raises(LadderFitError, match="say the tokens to predict at"):
        fit.predict("a", 2e6)


def test_rungs_at_one_ratio_fit_the_old_law_and_refuse_tokens_at_another_ratio():
    # Tokens rounded to whole steps: a fraction of a percent off the one ratio.
    with_tokens = [RungPoint(p.design, p.n, p.loss, tokens=20.03 * p.n) for p in _points(noise=0.003)]
    old, new = fit_ladders(_points(noise=0.003), resamples=30), fit_ladders(with_tokens, resamples=30)
    assert not new.joint and new.beta is None
    assert (new.e, new.alpha, new.log_a) == (old.e, old.alpha, old.log_a)
    assert np.array_equal(new.boot, old.boot)
    assert new.predict("a", 2e6, tokens=40e6).loss == old.predict("a", 2e6).loss  # the rungs' ratio
    with pytest.raises(LadderFitError, match=r"one ratio \(20 tokens per parameter\) say nothing about 100"):
        new.predict("a", 2e6, tokens=200e6)
    with pytest.raises(LadderFitError, match="the rungs do not all carry their tokens"):
        old.predict("a", 2e6, tokens=40e6)
    assert "B" not in new.to_dict() and new.to_dict()["law"] == "L(N) = E + A_d * N^-alpha"


def test_a_rung_with_tokens_that_are_not_positive_is_refused():
    bad = [*_joint_points()[:-1], RungPoint("a", 1e5, 3.0, tokens=0.0)]
    with pytest.raises(LadderFitError, match="tokens must be a finite positive number"):
        fit_ladders(bad, resamples=0)
