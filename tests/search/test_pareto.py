from __future__ import annotations

import numpy as np
import pytest
from optuna._hypervolume import compute_hypervolume  # the reference implementation (WFG)

from archsearch.search.pareto import hypervolume, knee_index, pareto_front, pareto_mask, reference_point


def _brute_mask(v: np.ndarray) -> np.ndarray:
    return np.array(
        [not any(np.all(o <= r) and np.any(o < r) for o in v) and not np.isnan(r).any() for r in v]
    )


@pytest.mark.parametrize("m", [2, 3, 4])
@pytest.mark.parametrize("seed", range(5))
def test_the_front_matches_a_brute_force_check(m, seed):
    rng = np.random.default_rng(seed)
    v = rng.integers(0, 6, size=(60, m)).astype(float)  # many ties and duplicates
    v[rng.integers(0, 60, 3), 0] = np.nan
    assert (pareto_mask(v) == _brute_mask(v)).all()


@pytest.mark.parametrize("m", [2, 3])
@pytest.mark.parametrize("seed", range(5))
def test_hypervolume_matches_optunas(m, seed):
    rng = np.random.default_rng(seed)
    v = rng.random((40, m))
    ref = np.full(m, 1.1)
    front = v[pareto_mask(v)]
    assert hypervolume(v, ref) == pytest.approx(compute_hypervolume(front, ref), rel=1e-9)


def test_hypervolume_vectors():
    assert hypervolume(np.array([[1.0, 1.0]]), (2.0, 3.0)) == 2.0
    assert hypervolume(np.array([[1.0, 2.0], [2.0, 1.0]]), (3.0, 3.0)) == 3.0
    assert hypervolume(np.array([[5.0, 5.0]]), (3.0, 3.0)) == 0.0  # beyond the reference
    assert hypervolume(np.array([[0.0, 0.0, 0.0]]), (1.0, 2.0, 3.0)) == 6.0


def test_the_knee_is_the_balanced_point_on_a_log_flops_scale():
    # loss falls slowly with 10x FLOPs steps: the middle point is closest to the ideal corner.
    front = np.array([[3.0, 1e6], [2.1, 1e7], [2.0, 1e9]])
    assert knee_index(front, ("loss", "flops")) == 1


def test_pareto_front_sorts_by_loss_and_states_its_reference():
    numbers = [10, 11, 12, 13]
    values = np.array([[2.0, 1e8], [3.0, 1e6], [2.5, 1e9], [np.nan, 1e5]])
    front = pareto_front(numbers, values, ("loss", "flops"))
    assert front.numbers == (10, 11) and front.knee in (10, 11)
    assert front.reference == pytest.approx((3.3, 1e9 * 10**0.1))
    fixed = pareto_front(numbers, values, ("loss", "flops"), reference=(4.0, 1e10))
    assert fixed.hypervolume > front.hypervolume > 0
    assert pareto_front([1], np.array([[np.nan, 1.0]]), ("loss", "flops")) is None


def test_the_reference_point_lies_beyond_a_negative_loss():
    # A size-adjusted loss can be negative: the margin still moves the reference away from the front.
    values = np.array([[-2.0, 1e6], [-3.0, 1e8]])
    assert reference_point(values, ("loss", "flops")) == pytest.approx((-1.8, 1e8 * 10**0.1))
    assert reference_point(values[:, :1] * -1, ("loss",)) == pytest.approx((3.3,))
