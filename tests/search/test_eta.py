"""A search's ETA (`driver.search_eta`, `SearchProgress.eta_s`): fixed numbers, no Ray, no clock."""

from __future__ import annotations

import pytest

from archsearch.search.driver import SearchProgress, search_eta


@pytest.mark.parametrize(
    ("walls", "remaining", "workers", "eta"),
    [
        ((60.0, 120.0, 90.0), 10, 4, 90.0 * 10 / 4),  # the mean per wave of 4: 2.5 waves
        ((60.0, 120.0, 90.0), 8, 1, 720.0),  # one at a time
        ((30.0,), 3, 4, 30.0),  # fewer left than workers: one wave, not a fraction of one
        ((30.0,), 4, 4, 30.0),
        ((10.0, 20.0), 1, 1, 15.0),
        ((10.0, 20.0), 0, 2, 0.0),  # nothing left
        ((10.0, 20.0), -1, 2, 0.0),  # another driver finished more than asked for
        ((), 5, 2, None),  # no trial finished yet: nothing to estimate from
        ((), 0, 2, 0.0),
    ],
    ids=["waves", "one-worker", "last-wave", "one-full-wave", "last-trial", "done", "overshot", "unknown",
         "done-unknown"],
)  # fmt: skip
def test_the_eta_is_the_mean_wall_time_per_wave_of_workers(walls, remaining, workers, eta):
    assert search_eta(walls, remaining, workers) == (None if eta is None else pytest.approx(eta))


def test_workers_below_one_are_refused():
    with pytest.raises(ValueError, match="workers must be at least 1, got 0"):
        search_eta((1.0,), 3, 0)


def test_a_snapshot_counts_what_is_left_from_its_target_and_finished_trials():
    counts = {"complete": 3, "pruned": 1, "failed": 1, "rejected": 4, "duplicate": 2, "running": 2}
    snapshot = SearchProgress(
        target=20, counts=counts, best_loss=1.5, front_size=2, elapsed_s=500.0, workers=2,
        wall_times_s=(100.0, 100.0, 100.0, 40.0, 10.0),
    )  # fmt: skip
    assert snapshot.finished == 5  # rejected and duplicate trials trained nothing and count not
    assert snapshot.eta_s == pytest.approx(70.0 * 15 / 2)
    assert SearchProgress(target=3, counts={}, best_loss=None, front_size=0, elapsed_s=0.0).eta_s is None
