"""The deciding fidelity measures on fixed data with known answers."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from archsearch.search.fidelity_stats import (
    Estimate,
    estimate_text,
    front_recall,
    knee_regret,
    pair_accuracy,
    paired_difference,
    rank_correlation,
    seed_noise,
)

TARGET = [2.0, 2.1, 2.3, 2.2, 2.6, 2.5, 2.9, 3.0]  # the reference's losses
PERFECT = [t + 10 for t in TARGET]  # any increasing map ranks perfectly


def test_a_perfect_ranking_is_one_with_a_degenerate_interval():
    est = rank_correlation(PERFECT, TARGET)
    # every resample repeats shapes in both columns alike, so it ranks perfectly too
    assert (est.value, est.low, est.high) == pytest.approx((1.0, 1.0, 1.0))
    assert rank_correlation([-t for t in TARGET], TARGET, "kendall").value == pytest.approx(-1.0)


def test_an_estimate_reads_as_its_value_and_interval_with_undefined_parts_a_dash():
    assert estimate_text(Estimate(0.3712, -0.35, 0.8).to_dict(), value_spec=".3f") == "0.371 [-0.35, 0.80]"
    assert estimate_text(Estimate(0.5, float("nan"), float("nan")).to_dict()) == "0.50 [-, -]"
    assert estimate_text({"value": None, "low": 0.1, "high": float("nan")}, ".1%") == "- [10.0%, -]"


def test_the_values_are_scipys_and_the_interval_holds_them():
    rng = np.random.default_rng(3)
    target = rng.normal(size=30)
    predicted = target + rng.normal(size=30)
    est = rank_correlation(predicted, target)
    assert est.value == pytest.approx(stats.spearmanr(predicted, target).statistic)
    assert est.low < est.value < est.high
    tau = rank_correlation(predicted, target, "kendall")
    assert tau.value == pytest.approx(stats.kendalltau(predicted, target).statistic)
    assert rank_correlation(predicted, target) == est  # seeded: the same interval every time


def test_the_batched_correlations_equal_scipys_with_ties():
    from archsearch.search.fidelity_stats import STATISTICS

    rng = np.random.default_rng(9)
    x, y = np.round(rng.normal(size=(2, 40)), 0)  # few distinct values: many ties on both sides
    assert STATISTICS["spearman"](x, y) == pytest.approx(stats.spearmanr(x, y).statistic)
    assert STATISTICS["kendall"](x, y) == pytest.approx(stats.kendalltau(x, y).statistic)
    batch = STATISTICS["spearman"](np.stack([x, y]), np.stack([y, x]), axis=-1)
    assert batch == pytest.approx([stats.spearmanr(x, y).statistic] * 2)


def test_more_shapes_narrow_the_interval():
    rng = np.random.default_rng(5)
    widths = []
    for n in (14, 200):
        target = rng.normal(size=n)
        est = rank_correlation(target + rng.normal(scale=0.5, size=n), target)
        widths.append(est.high - est.low)
    assert widths[1] < widths[0] / 2  # about 1/sqrt(n): 14 shapes cannot decide, 200 can


def test_the_paired_difference_is_the_difference_of_the_correlations():
    rng = np.random.default_rng(7)
    target = rng.normal(size=40)
    good = target + rng.normal(scale=0.3, size=40)
    poor = target + rng.normal(scale=3.0, size=40)
    diff = paired_difference(good, poor, target)
    expected = stats.spearmanr(good, target).statistic - stats.spearmanr(poor, target).statistic
    assert diff.value == pytest.approx(expected)
    assert diff.low > 0  # clearly better: the interval excludes 0
    assert paired_difference(good, good, target) == Estimate(0.0, 0.0, 0.0)


def test_repeats_average_their_correlations_over_the_same_resampled_shapes():
    rng = np.random.default_rng(11)
    target = rng.normal(size=25)
    repeats = [target + rng.normal(scale=0.7, size=25) for _ in range(3)]
    mean = rank_correlation(repeats, target)
    assert mean.value == pytest.approx(np.mean([stats.spearmanr(r, target).statistic for r in repeats]))
    assert mean.low < mean.value < mean.high
    baseline = target + rng.normal(scale=2.0, size=25)
    diff = paired_difference(repeats, baseline, target)
    assert diff.value == pytest.approx(mean.value - stats.spearmanr(baseline, target).statistic)
    # Averaging repeats narrows the interval against one repeat's
    single = rank_correlation(repeats[0], target)
    assert mean.high - mean.low < single.high - single.low


def test_pairs_inside_the_reference_noise_are_not_judged():
    # gaps: (0,1) 0.1, (0,2) 0.3, (1,2) 0.2; the predictor orders (1, 2) wrongly
    predicted, target = [1.0, 3.0, 2.0], [2.0, 2.1, 2.3]
    assert pair_accuracy(predicted, target) == (2, 3)
    assert pair_accuracy(predicted, target, noise=0.15) == (1, 2)  # (0,1) is a tie to the reference
    assert pair_accuracy(predicted, target, noise=0.25) == (1, 1)
    assert pair_accuracy(predicted, target, within=[False, True, True]) == (0, 1)
    assert pair_accuracy([1.0, 1.0, 2.0], target) == (2, 3)  # a predicted tie is wrong


def test_seed_noise_is_the_rms_gap_between_two_seeds_of_a_shape():
    assert seed_noise([1.0, 2.0], [1.2, 1.7]) == pytest.approx(np.sqrt((0.04 + 0.09) / 2))
    with pytest.raises(ValueError, match="paired seeds"):
        seed_noise([1.0], [])


def test_front_recall_and_knee_regret():
    flops = [1.0, 2.0, 3.0, 4.0]
    target = [3.0, 2.5, 2.0, 1.9]  # every shape on the reference front
    assert front_recall(target, target, flops) == (4, 4)
    predicted = [3.0, 2.0, 2.5, 2.4]  # shape 1 dominates 2 and 3 in the predictor's eyes
    assert front_recall(predicted, target, flops) == (2, 4)
    # The predictor's front is shapes 0 and 1; its knee is shape 1 (the lower loss of the two,
    # equally far from the ideal point), the best at its FLOPs to the reference: no regret.
    assert knee_regret(predicted, target, flops) == 0.0
    # A predictor that puts the knee on shape 2 while shape 1 is better at lower cost:
    assert knee_regret([3.0, 2.8, 1.0, 2.9], [3.0, 2.0, 2.5, 1.9], flops) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (([1.0, 2.0], [1.0, 2.0]), "at least 3 shapes"),
        (([1.0, 2.0, 3.0], [1.0, 2.0]), "lengths differ"),
        (([1.0, float("nan"), 3.0], [1.0, 2.0, 3.0]), "NaN"),
    ],
)
def test_bad_input_is_refused(args, match):
    with pytest.raises(ValueError, match=match):
        rank_correlation(*args)
