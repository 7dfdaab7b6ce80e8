from __future__ import annotations

import math

import pytest

from archsearch.search.pruning import MultiObjectiveHalving, dominates


def test_dominance_needs_no_worse_everywhere_and_better_somewhere():
    assert dominates((1, 1), (1, 2)) and dominates((0, 2), (1, 2))
    assert not dominates((1, 2), (1, 2)) and not dominates((0, 3), (1, 2))


def test_nothing_is_pruned_before_min_trials_reached_the_rung():
    p = MultiObjectiveHalving((0.25, 0.5), min_trials=3)
    for n in range(3):
        assert p.decide(n, 0, loss=1.0, flops=1e6) is None
    assert p.decide(9, 0, loss=5.0, flops=2e6) is not None  # now 3 others, all dominate it


def test_a_cheap_trial_is_kept_whatever_the_loss_of_costlier_ones():
    p = MultiObjectiveHalving((0.5,), min_trials=2)
    for n, loss in enumerate([1.0, 1.1, 1.2, 1.3]):
        p.decide(n, 0, loss, flops=1e8)
    assert p.decide(10, 0, loss=3.0, flops=1e6) is None  # worse loss, but 100x cheaper: on the front


def test_the_reduction_factor_sets_how_many_dominators_prune():
    # n earlier trials, eta 3: pruned when ceil(n / 3) of them dominate it.
    p = MultiObjectiveHalving((0.5,), min_trials=4, reduction_factor=3)
    for n, loss in enumerate([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]):
        p.decide(n, 0, loss, flops=1e6)
    assert p.decide(10, 0, loss=1.5, flops=1e6) is None  # only trial 0 dominates it
    reason = p.decide(11, 0, loss=2.5, flops=1e6)
    assert (
        reason and "by 3 of 7 trials" in reason
    )  # 0, 1 and 10; ceil(7 / 3) = 3 and "trial 0: loss 1.0000" in reason


def test_a_diverged_loss_is_pruned_at_once():
    p = MultiObjectiveHalving((0.5,))
    assert "loss nan" in p.decide(0, 0, math.nan, 1e6)


def test_rungs_are_validated_and_located():
    p = MultiObjectiveHalving((0.25, 0.5))
    assert [p.rung_at(f) for f in (0.1, 0.25, 0.4, 0.75, 1.0)] == [None, 0, 0, 1, 1]
    for bad in [(0.5, 0.25), (0.0,), (1.0,), (0.5, 0.5)]:
        with pytest.raises(ValueError, match="increasing fractions"):
            MultiObjectiveHalving(bad)
