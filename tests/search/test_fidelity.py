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
    size_adjusted_losses,
    spearman,
)

# The measured calibration set the proxy-fidelity benchmark scores against, shipped in the repo.
CALIBRATION = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "fidelity_tiny_2026-11-23.json"
# The proxy variants' recorded runs on those shapes (benchmarks/proxy_fidelity.py --out ...).
PROXY_RUNS = CALIBRATION.with_name("proxy_fidelity_cpu_2026-11-23.json")


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


def test_size_adjusted_losses_by_hand():
    # Sizes 1M, e M, e^2 M: ln(params / 1M) = 0, 1, 2 (sd sqrt(2/3)); losses 3.0, 2.8, 2.9 (sd
    # sqrt(0.02/3)): the equal-weight beta is 0.1 nats per e-fold.
    params = [1e6, math.e * 1e6, math.e**2 * 1e6]
    adjusted, beta = size_adjusted_losses([3.0, 2.8, 2.9], params)
    assert beta == pytest.approx(0.1)
    assert adjusted.tolist() == pytest.approx([3.0, 2.7, 2.7])
    adjusted, beta = size_adjusted_losses([3.0, 2.8, 2.9], params, beta=0.5)
    assert beta == 0.5 and adjusted.tolist() == pytest.approx([3.0, 2.3, 1.9])
    # A 1M-parameter shape keeps its loss; beta 0 is the proxy loss itself.
    assert size_adjusted_losses([2.5, 2.0], [1e6, 4e6], beta=0.0)[0].tolist() == [2.5, 2.0]


def test_the_default_beta_weighs_loss_and_size_equally():
    rng = np.random.default_rng(0)
    losses = rng.normal(2.5, 0.2, 30)
    params = np.exp(rng.uniform(11, 16, 30))
    adjusted, _ = size_adjusted_losses(losses, params)
    size = np.log(params)
    equal = (losses - losses.mean()) / losses.std() - (size - size.mean()) / size.std()
    assert average_ranks(adjusted).tolist() == average_ranks(equal).tolist()


def test_size_adjustment_without_spread_keeps_the_losses():
    adjusted, beta = size_adjusted_losses([2.0, 3.0], [5e5, 5e5])  # one size: nothing to credit
    assert beta == 0.0 and adjusted.tolist() == [2.0, 3.0]
    adjusted, beta = size_adjusted_losses([2.0], [2e6])
    assert beta == 0.0 and adjusted.tolist() == [2.0]
    adjusted, beta = size_adjusted_losses([], [])
    assert beta == 0.0 and adjusted.tolist() == []


@pytest.mark.parametrize(
    ("losses", "params", "beta", "match"),
    [
        ([1.0, 2.0], [1, 2, 3], None, "lengths differ"),
        ([1.0, float("nan")], [1, 2], None, "NaN"),
        ([1.0, float("inf")], [1, 2], None, "finite"),
        ([1.0, 2.0], [0, 2], None, "> 0"),
        ([1.0, 2.0], [1, 2], -0.1, ">= 0"),
        ([1.0, 2.0], [1, 2], float("nan"), ">= 0"),
    ],
    ids=["lengths", "nan-loss", "inf-loss", "zero-params", "negative-beta", "nan-beta"],
)
def test_size_adjustment_rejects_bad_input(losses, params, beta, match):
    with pytest.raises(ValueError, match=match):
        size_adjusted_losses(losses, params, beta)


@pytest.mark.parametrize(
    ("variant", "rho", "beta"),
    [
        ("tokens2x-constant", 0.921, 0.130),
        ("tokens2x-constant-seed1", 0.837, 0.166),
        ("tokens2x-constant-seed2", 0.824, 0.138),
        ("reference", 0.776, 0.136),
        ("reference-seed1", 0.807, 0.135),
    ],
)
def test_size_adjusted_proxy_on_the_tiny_calibration_set(variant, rho, beta):
    """The recorded proxy runs: the numbers the docstring and README state."""
    trials = json.loads(CALIBRATION.read_text())["trials"]
    runs = json.loads(PROXY_RUNS.read_text())[variant]["runs"]
    proxy = [runs[str(t["trial"])]["val_loss"] for t in trials]
    long = [t["x10"]["val_loss"] for t in trials]
    params = [t["params_total"] for t in trials]
    adjusted, used = size_adjusted_losses(proxy, params)
    assert round(used, 3) == beta
    assert round(spearman(adjusted, long), 3) == rho
    assert round(spearman(proxy, long), 3) < rho  # the adjustment helps on every recorded seed
