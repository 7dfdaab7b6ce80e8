"""Learning-rate schedules: shapes pinned at the points that matter (no torch needed)."""

from __future__ import annotations

import pytest

from archsearch.evaluators.settings import SCHEDULES

WARMUP, FLOOR = 0.1, 0.1
PROGRESS = [i / 100 for i in range(101)]


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_every_schedule_warms_up_linearly_to_the_peak(name):
    schedule = SCHEDULES[name]
    assert schedule(0.0, WARMUP, FLOOR) == pytest.approx(0.0, abs=1e-6)
    assert schedule(WARMUP / 2, WARMUP, FLOOR) == pytest.approx(0.5)
    assert schedule(WARMUP, WARMUP, FLOOR) == pytest.approx(1.0)


@pytest.mark.parametrize(("name", "end"), [("cosine", FLOOR), ("wsd", FLOOR), ("constant", 1.0)])
def test_where_each_schedule_ends(name, end):
    assert SCHEDULES[name](1.0, WARMUP, FLOOR) == pytest.approx(end)


def test_constant_stays_at_the_peak_after_warm_up():
    after = [SCHEDULES["constant"](p, WARMUP, FLOOR) for p in PROGRESS if p >= WARMUP]
    assert after == [1.0] * len(after)


def test_constant_is_cosine_with_no_decay():
    """The fidelity benchmark's constant-rate runs were first measured as cosine with floor 1.0."""
    for p in PROGRESS:
        assert SCHEDULES["constant"](p, WARMUP, FLOOR) == SCHEDULES["cosine"](p, WARMUP, 1.0)
