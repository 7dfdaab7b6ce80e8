from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from archsearch.search.fidelity import (
    average_ranks,
    iso_pair_agreement,
    kendall,
    noise_floor,
    spearman,
)

# The measured calibration set the proxy-fidelity benchmark scores against, shipped in the repo.
CALIBRATION = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "fidelity_tiny_2026-11-23.json"


def test_average_ranks_share_ties():
    assert average_ranks([10, 20, 20, 5]).tolist() == [2.0, 3.5, 3.5, 1.0]
    assert average_ranks([3, 3, 3]).tolist() == [2.0, 2.0, 2.0]


def test_spearman_by_hand():
    # One swapped neighbour of 4: sum d^2 = 2, rho = 1 - 6 * 2 / (4 * 15) = 0.8.
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    # Ties: ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4) give 4.5 / sqrt(4.5 * 5) = 3 / sqrt(10).
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(3 / math.sqrt(10))


def test_kendall_by_hand():
    # 6 pairs, one discordant: (5 - 1) / 6.
    assert kendall([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(2 / 3)
    # tau-b: 5 concordant, 1 pair tied in a only: 5 / sqrt(5 * 6).
    assert kendall([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(5 / math.sqrt(30))
    assert kendall([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


@pytest.mark.parametrize("measure", [spearman, kendall], ids=["spearman", "kendall"])
def test_undefined_correlations_are_nan(measure):
    assert math.isnan(measure([1, 1, 1], [1, 2, 3]))
    assert math.isnan(measure([1], [2]))


@pytest.mark.parametrize("measure", [spearman, kendall], ids=["spearman", "kendall"])
def test_bad_input_is_rejected(measure):
    with pytest.raises(ValueError, match="lengths differ"):
        measure([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="NaN"):
        measure([1, float("nan")], [1, 2])


def test_iso_pair_agreement_by_hand():
    # Pairs within 25%: (0, 1) ratio 1.2 disagrees, (0, 2) ratio 1.25 (the edge) agrees,
    # (1, 2) agrees; everything against the 200-parameter shape is out.
    params = [100, 120, 125, 200]
    assert iso_pair_agreement([1, 2, 3, 4], [2, 1, 3, 4], params) == (2, 3)
    assert iso_pair_agreement([1, 2, 3, 4], [2, 1, 3, 4], params, tolerance=0.1) == (1, 1)
    # A tie on one side only disagrees; a tie on both agrees.
    assert iso_pair_agreement([1, 1], [1, 2], [100, 100]) == (0, 1)
    assert iso_pair_agreement([1, 1], [2, 2], [100, 100]) == (1, 1)
    with pytest.raises(ValueError, match="> 0"):
        iso_pair_agreement([1, 2], [1, 2], [0, 1])


def test_noise_floor_pools_by_degrees_of_freedom():
    # Shape 1: ss 2 (1 dof); shape 2: ss 6 (2 dof); the single seed adds nothing: sqrt(8 / 3).
    assert noise_floor([[1, 3], [2, 2, 5], [7]]) == pytest.approx(math.sqrt(8 / 3))
    assert noise_floor({"a": [1, 3], "b": [2, 2, 5]}) == pytest.approx(math.sqrt(8 / 3))
    assert noise_floor([[1], [2]]) is None
    assert noise_floor([]) is None


def test_the_tiny_calibration_set():
    """The measured tiny calibration set: the proxy ranks the 10x runs worse than counting does."""
    trials = json.loads(CALIBRATION.read_text())["trials"]
    proxy = np.array([t["proxy"]["val_loss"] for t in trials])
    long = np.array([t["x10"]["val_loss"] for t in trials])
    params = np.array([t["params_total"] for t in trials], dtype=float)
    flops = np.array([t["flops_forward_per_token"] for t in trials])
    assert len(trials) == 14
    assert round(spearman(proxy, long), 2) == 0.44
    assert round(spearman(-params, long), 2) == 0.75
    assert round(spearman(-flops, long), 2) == 0.76
    assert iso_pair_agreement(proxy, long, params) == (11, 14)
