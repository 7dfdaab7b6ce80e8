"""Promotion's pure parts: the contenders, the rungs, PASHA's stopping rule and the line that says
where a front ranked them."""

from __future__ import annotations

import numpy as np
import pytest

from archsearch.search.pareto import pareto_front
from archsearch.search.promotion import (
    AUTO_MARGIN,
    KNEE_NEIGHBOURS,
    RULES,
    PromoteError,
    PromoteSettings,
    Spent,
    contenders,
    order_holds,
    promotion_tokens,
    ranking_line,
    spent_tokens,
    stall_checked,
)
from archsearch.storage import PromotionRanking, PromotionRecord, SeedMean
from archsearch.trial import STALLED

OBJECTIVES = ("loss", "flops")


def test_the_front_and_the_shapes_within_the_margin_contend():
    # Trials 0-2 form the front; 3 is 0.05 behind trial 1 (a tie at 0.063), 4 far behind.
    numbers = [10, 11, 12, 13, 14]
    values = np.array([[3.0, 1e6], [2.8, 2e6], [2.6, 4e6], [2.85, 2e6], [3.5, 3e6]])
    assert contenders(numbers, values, OBJECTIVES, margin=AUTO_MARGIN)[:4] == (10, 11, 12, 13)
    # With no margin, 13 contends only as one of the knee's nearest shapes off the front.
    chosen = contenders(numbers, values, OBJECTIVES, margin=0.0)
    assert {10, 11, 12} <= set(chosen) and len(chosen) == 3 + min(KNEE_NEIGHBOURS, 2)


def test_at_most_max_contenders_contend_the_knee_and_those_nearest_it():
    # A front of 8 along one curve, each a tie with the next: all contend without a bound.
    numbers = list(range(8))
    values = np.array([[3.0 - 0.1 * i, 2.0**i * 1e6] for i in range(8)])
    assert contenders(numbers, values, OBJECTIVES, margin=0.0) == tuple(numbers)
    chosen = contenders(numbers, values, OBJECTIVES, margin=0.0, most=3)
    knee = pareto_front(numbers, values, OBJECTIVES).knee
    assert len(chosen) == 3 and knee in chosen
    assert max(chosen) - min(chosen) == 2  # the knee and its two nearest, a run along the curve
    assert PromoteSettings().max_contenders == 8


def test_the_knees_nearest_neighbours_contend_even_outside_the_margin():
    numbers = list(range(6))
    values = np.array([[3.0, 1e6], [2.5, 4e6], [2.0, 16e6], [2.7, 5e6], [3.4, 20e6], [3.6, 30e6]])
    chosen = contenders(numbers, values, OBJECTIVES, margin=0.0)
    assert set(chosen) == {0, 1, 2} | {3, 4}  # the knee is 1; 3 and 4 are nearest it off the front


def test_no_trials_no_contenders():
    assert contenders([], np.zeros((0, 2)), OBJECTIVES, 0.1) == ()


def test_an_order_holds_unless_two_contenders_swap_by_more_than_the_noise():
    before = {1: 2.0, 2: 2.1, 3: 2.5}
    assert order_holds(before, {1: 1.8, 2: 1.9, 3: 2.3}, epsilon=0.05)
    assert not order_holds(before, {1: 1.95, 2: 1.8, 3: 2.3}, epsilon=0.05)  # 1 and 2 swapped by 0.15
    assert order_holds(before, {1: 1.85, 2: 1.82, 3: 2.3}, epsilon=0.05)  # swapped inside the noise: a tie
    assert order_holds(before, {1: 1.8}, epsilon=0.0)  # one in common: nothing to reorder
    assert RULES["pasha"] is order_holds


@pytest.mark.parametrize(
    ("cap", "multiples"),
    [(1, ()), (2, (2.0,)), (4, (2.0, 4.0)), (6, (2.0, 4.0, 6.0)), (8.0, (2.0, 4.0, 8.0))],
)
def test_rungs_double_up_to_the_cap(cap, multiples):
    assert PromoteSettings(cap=cap).multiples == multiples


def test_seed_repeats_add_the_proxys_own_budget_as_the_first_rung_at_consecutive_seeds():
    assert PromoteSettings().seeds == 1 and PromoteSettings().rungs == (2.0, 4.0)  # as before seeds
    assert PromoteSettings(cap=1).rungs == ()  # nothing to train: one seed at the proxy's budget
    assert PromoteSettings(cap=1, seeds=3).rungs == (1.0,)  # seed repeats alone
    assert PromoteSettings(cap=4, seeds=2).rungs == (1.0, 2.0, 4.0)
    assert PromoteSettings(seeds=3).seed_list(5) == (5, 6, 7)  # the first pass's seed first
    assert PromoteSettings(seeds=3).seed_list(2**32 - 1) == (2**32 - 1, 0, 1)  # Optuna's range wraps
    assert PromoteSettings(seeds=1).seed_list(5) == (5,)
    assert PromoteSettings(seeds=3).to_dict()["seeds"] == 3


def test_climb_with_seed_repeats_trains_the_proxys_budget_first_and_tests_the_order_after_it():
    from archsearch.search.promotion import CAPPED, HELD, Climb, climb

    first = {0: 1.0, 1: 1.1}
    means = {0: 1.2, 1: 1.1}  # at 3 seeds the proxy's budget orders them the other way

    def budget(multiple: float) -> int:
        return int(100 * multiple)

    asked: list[int] = []

    def train(b: int) -> dict[int, float]:
        asked.append(b)
        return dict(means)

    # Cap 1: the seed repeats alone, ranked at the proxy's budget; no order test against one seed.
    assert climb(PromoteSettings(cap=1, seeds=3, margin=0.01), first, budget, train) == Climb(
        (100,), 100, CAPPED
    )
    # Cap 2: the 2x rung is compared with the means at 1x (the same order: held), not with `first`.
    asked.clear()
    held = climb(PromoteSettings(cap=4, seeds=3, margin=0.01), first, budget, train)
    assert held == Climb((100, 200), 200, HELD) and asked == [100, 200]


def test_auto_margin_is_the_documented_seed_noise():
    assert PromoteSettings().margin_nats == AUTO_MARGIN == 0.063
    assert PromoteSettings(margin=0.02).margin_nats == 0.02


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        (dict(cap=0.99), "cap: must be a number from 1"),
        (dict(cap=True), "cap: must be a number from 1"),
        (dict(cap=float("inf")), "cap: must be a number from 1"),
        (dict(cap=2048), "cap: must be a number from 1 to 1024"),
        (dict(rule="sha"), "rule: unknown rule 'sha'; valid: pasha, cap"),
        (dict(rule=["pasha"]), r"rule: unknown rule \['pasha'\]"),
        (dict(margin="noise"), 'margin: must be "auto" or a number'),
        (dict(margin=float("nan")), 'margin: must be "auto" or a number'),
        (dict(max_contenders=1), "max_contenders: must be a whole number >= 2"),
        (dict(max_contenders=True), "max_contenders: must be a whole number >= 2"),
        (dict(max_contenders=8.0), "max_contenders: must be a whole number >= 2"),
        (dict(seeds=0), "seeds: must be a whole number from 1 to 64"),
        (dict(seeds=1.5), "seeds: must be a whole number from 1 to 64"),
        (dict(seeds=3.0), "seeds: must be a whole number from 1 to 64"),
        (dict(seeds="3"), "seeds: must be a whole number from 1 to 64"),
        (dict(seeds=True), "seeds: must be a whole number from 1 to 64"),
        (dict(seeds=65), "seeds: must be a whole number from 1 to 64"),
        (dict(stall_seeds=-1), "stall_seeds: must be a whole number from 0 to 63"),
        (dict(stall_seeds=2.0), "stall_seeds: must be a whole number from 0 to 63"),
        (dict(stall_seeds=False), "stall_seeds: must be a whole number from 0 to 63"),
        (dict(stall_seeds=64), "stall_seeds: must be a whole number from 0 to 63"),
    ],
)
def test_bad_settings_are_refused(settings, match):
    with pytest.raises(PromoteError, match=match):
        PromoteSettings(**settings)


def test_the_ranking_line_says_the_budget_and_how_the_rest_are_placed():
    ranked = PromotionRanking(contenders=(2, 5), budget=8192, proxy_tokens=2048, ranked={})
    assert ranking_line(ranked) == (
        "ranked at 8,192 tokens (4x the proxy) for the 2 promoted contenders (trials 2, 5); the other "
        "trials estimated there: their value at the proxy's 2,048 tokens plus the contenders' median change"
    )
    unfinished = PromotionRanking(contenders=(7,), budget=None, proxy_tokens=2048, ranked={})
    assert ranking_line(unfinished) == (
        "ranked at the proxy's 2,048 tokens for every trial: no budget past the proxy's was completed by "
        "all of the 1 promoted contender (trial 7)"
    )
    unknown = PromotionRanking(contenders=(1, 2), budget=4000, proxy_tokens=None, ranked={})
    assert ranking_line(unknown).startswith("ranked at 4,000 tokens for the 2 promoted contenders")
    repeated = PromotionRanking(contenders=(2, 5), budget=2048, proxy_tokens=2048, ranked={}, seeds=3)
    assert ranking_line(repeated).startswith(
        "ranked at 2,048 tokens (1x the proxy), each the mean of 3 seeds, for the 2 promoted contenders "
        "(trials 2, 5); the other trials estimated there"
    )
    unrepeated = PromotionRanking(contenders=(7,), budget=None, proxy_tokens=2048, ranked={}, seeds=3)
    assert ranking_line(unrepeated) == (
        "ranked at the proxy's 2,048 tokens for every trial: no budget at all 3 seeds was completed by "
        "all of the 1 promoted contender (trial 7)"
    )


def test_the_ranking_line_names_the_stall_checked_trials():
    mean = SeedMean(trial_number=4, budget_tokens=2048, seeds=(0, 1, 2), val_loss=2.5, objective=2.5,
                    loss_change=0.0, runs=())  # fmt: skip
    checked = PromotionRanking((2, 5), budget=8192, proxy_tokens=2048, ranked={}, checked={4: mean})
    assert ranking_line(checked).endswith(
        "median change; trial 4, whose first pass stalled, by its mean over 3 seeds there (stall checks)"
    )
    only = PromotionRanking(contenders=(), budget=None, proxy_tokens=2048, ranked={}, checked={4: mean})
    assert ranking_line(only) == (
        "ranked at the proxy's 2,048 tokens for every trial, none promoted yet; trial 4, whose first pass "
        "stalled, by its mean over 3 seeds there (stall checks)"
    )


def test_stall_checks_train_contenders_that_stalled_once_and_choose_again_until_none_is_left():
    values = {0: 1.0, 1: 1.5, 2: 1.6, 3: 1.7}  # trial 0 stalled, then trained at its one lucky seed
    stalled, checked = {0, 2}, []

    def choose():  # the two best, as `contenders` would give them
        return sorted(sorted(values, key=values.get)[:2])

    def check(numbers):
        checked.append(tuple(numbers))
        values.update({n: 3.0 for n in numbers if n == 0})  # it stalls at the other seeds
        return True

    assert stall_checked(choose, stalled.__contains__, check) == (1, 2)  # trial 2 checked in turn
    assert checked == [(0,), (2,)]
    values[0] = 1.0
    assert stall_checked(choose, stalled.__contains__, lambda numbers: False) is None  # stopped
    assert stall_checked(choose, lambda n: False, check) == (0, 1)  # nothing stalled: nothing checked


def test_stall_checks_take_the_seeds_after_the_first_pass_and_none_with_seed_repeats():
    assert PromoteSettings().stall_seeds == 2 and PromoteSettings().check_seeds(5) == (6, 7)
    assert PromoteSettings(stall_seeds=0).check_seeds(5) == ()
    assert PromoteSettings(seeds=3).check_seeds(5) == ()  # every contender is averaged over seeds already
    assert PromoteSettings(stall_seeds=1).check_seeds(2**32 - 1) == (0,)
    assert PromoteSettings(stall_seeds=1).to_dict()["stall_seeds"] == 1


def test_promotion_tokens_count_what_each_run_trained():
    budgets = {1: [4096, 8192], 2: [4096]}  # trial 1 to 4x, trial 2 to 2x, of a 2,048-token proxy
    # Resumed: each rung trains only past the last one; afresh: every rung from step 0.
    assert promotion_tokens(2048, budgets, {1: True, 2: True}) == 2048 + 4096 + 2048
    assert promotion_tokens(2048, budgets, {1: False, 2: False}) == 4096 + 8192 + 4096
    assert promotion_tokens(2048, {}, {}) == 0


def test_climb_stops_when_the_order_holds_at_the_cap_or_when_training_is_stopped():
    from archsearch.search.promotion import CAPPED, HELD, Climb, climb
    from archsearch.trial import INTERRUPTED

    settings = PromoteSettings(cap=8, margin=0.01)  # rungs 2x, 4x, 8x
    first = {0: 1.0, 1: 1.1}
    swapped = {0: 1.2, 1: 1.1}

    def budget(multiple: float) -> int:
        return int(100 * multiple)

    held = climb(settings, first, budget, lambda b: dict(first))
    assert held == Climb((200,), 200, HELD)
    flips = iter([swapped, first, swapped])  # the order flips at every rung: the cap ends it
    assert climb(settings, first, budget, lambda b: next(flips)) == Climb((200, 400, 800), 800, CAPPED)
    # A stop keeps the rungs done; a rung one contender did not complete ranks nothing.
    stopped = iter([swapped, None])
    assert climb(settings, first, budget, lambda b: next(stopped)) == Climb((200,), 200, INTERRUPTED)
    assert climb(settings, first, budget, lambda b: {0: 1.2}) == Climb((200,), None, HELD)
    # The rule "cap" never holds: an order unchanged at every rung still trains on to the cap.
    to_cap = PromoteSettings(cap=8, margin=0.01, rule="cap")
    assert climb(to_cap, first, budget, lambda b: dict(first)) == Climb((200, 400, 800), 800, CAPPED)
    assert RULES["cap"](first, first, 0.01) is False


def _promotion(number: int, budget: int, resumed: int | None, reason: str | None = None) -> PromotionRecord:
    return PromotionRecord(
        id=0, study="s", trial_id=number, trial_number=number, budget_tokens=budget, status="complete",
        reason=reason, val_loss=2.0, objective=2.0, val_curve=(), wall_time_s=1.0, host="h", claimed_at=0.0,
        lease_expires_at=None, finished_at=1.0, resumed_tokens=resumed,
    )  # fmt: skip


def test_the_tokens_spent_are_those_each_promotion_trained_resumed_or_from_step_0():
    # Trial 1 resumed both rungs; trial 2's kept state was gone, so it trained 4,000 from step 0
    # though its settings keep one; trial 3 was stored before the start was recorded: as planned.
    complete = [_promotion(1, 4000, 2000), _promotion(1, 8000, 4000)]
    complete += [_promotion(2, 4000, 0), _promotion(3, 4000, None)]
    spent = spent_tokens(2000, complete, {1: True, 2: True, 3: True})
    assert spent == Spent(tokens=2000 + 4000 + 4000 + 2000, resumed=2, afresh=1, unknown=1)
    assert spent_tokens(2000, [_promotion(3, 4000, None)], {3: False}).tokens == 4000


def test_a_seed_repeat_trained_again_for_stalling_counts_the_stalled_run_too():
    # The repeat at the proxy's budget (2,000) stalled: its whole run was judged, then retrained.
    stalled = _promotion(1, 2000, 0, f"{STALLED} after 1,000 tokens at 5.4 nats")
    assert spent_tokens(2000, [stalled, _promotion(2, 2000, 0)], {}).tokens == 2000 * 2 + 2000
    # A failure's reason is not a stall: counted once, as any promotion.
    assert spent_tokens(2000, [_promotion(3, 2000, 0, "out of memory")], {}).tokens == 2000


def test_shapes_not_promoted_are_placed_at_the_budget_by_the_contenders_median_change():
    # Contenders 1-3 fell by 0.3, 0.4 and 0.5 from their first pass; 4 and 5 were not promoted.
    first = {1: 2.0, 2: 2.1, 3: 2.2, 4: 2.05, 5: None}
    placed, shift = PromotionRanking.place(first, {1: 1.7, 2: 1.7, 3: 1.7})
    assert shift == pytest.approx(-0.4)
    assert placed == {1: 1.7, 2: 1.7, 3: 1.7, 4: pytest.approx(1.65), 5: None}
    # Measured against the others' first pass, 4 would trail every contender; placed, it leads two.
    assert placed[4] < placed[1] and first[4] > 1.7
    # A contender without a first-pass value still ranks by its promotion and moves no shift.
    assert PromotionRanking.place({1: None, 2: 2.0}, {1: 1.5}) == ({1: 1.5, 2: 2.0}, 0.0)
