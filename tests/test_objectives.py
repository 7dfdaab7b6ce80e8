"""Each objective is defined once (`space.objectives`) and every place that uses one can."""

from __future__ import annotations

import math

import pytest

from archsearch.errors import ArchsearchError
from archsearch.search.driver import objective_values
from archsearch.space import preset
from archsearch.space.costs import param_counts
from archsearch.space.objectives import (
    OBJECTIVES,
    LossRule,
    curve_change,
    loss_objective,
    parse_objectives,
)
from archsearch.storage.query import ALIASES, COLUMNS
from archsearch.trial import TrialOutcome
from tests.specs import LOCAL_PROFILE, tiny_spec


def _spec_with(name: str):
    """A spec minimising `name` beside the loss, with what that objective needs."""
    if name == "loss":
        return tiny_spec()
    tables = {"objectives": f'minimize = ["loss", "{name}"]'}
    if name == "step_time":
        tables["objectives"] += '\nstep_time_device = "local"'
        tables["profile"] = LOCAL_PROFILE
    if name in ("prefill_time", "decode_time"):
        tables["serve"] = 'device = "h100-sxm"'
    return tiny_spec(**tables)


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_every_objective_is_a_stored_column_a_query_alias_and_an_optuna_value(name):
    objective = OBJECTIVES[name]
    assert objective.column in COLUMNS and COLUMNS[objective.column] == "number"
    assert ALIASES.get(name, name) == objective.column
    spec = _spec_with(name)
    outcome = TrialOutcome(
        status="complete", train={"val_loss": 2.5}, step_time_s=0.1, prefill_time_s=0.2, decode_time_s=0.01
    )
    values = dict(zip(spec.objectives, objective_values(spec, outcome, preset("byte-1m")), strict=True))
    assert name in values and values[name] > 0


@pytest.mark.parametrize(
    "names", ["flops,loss", "loss", "loss,loss", "loss,latency", "loss,flops,step_time,flops", ""]
)
def test_one_rule_for_every_objective_list(names):
    with pytest.raises(ArchsearchError, match="must be loss then one or two of flops, step_time"):
        parse_objectives(names)


def test_the_size_adjusted_loss_credits_each_e_fold_of_parameters_by_beta():
    assert loss_objective(2.5, 0.0, 1e6, 0.15) == 2.5  # a 1M-parameter shape keeps its loss
    assert loss_objective(2.5, 0.0, 1e6 * math.e, 0.15) == pytest.approx(2.35)
    assert loss_objective(2.5, 0.0, 1e6 / math.e**2, 0.15) == pytest.approx(2.8)
    assert loss_objective(2.5, -0.3, 123, None) == 2.5  # a study without either: the loss as it is
    for params, beta in ((0, 0.1), (1e6, -0.1), (1e6, math.inf)):
        with pytest.raises(ValueError):
            loss_objective(2.5, 0.0, params, beta)


def test_the_loss_objective_carries_the_loss_on_by_its_last_change_then_credits_size():
    # 2.5 + 2 x (-0.1) - 0.15 x ln(e) = 2.5 - 0.2 - 0.15
    assert loss_objective(2.5, -0.1, 1e6 * math.e, 0.15, 2.0) == pytest.approx(2.15)
    assert loss_objective(2.5, -0.1, 1e6, None, 2.0) == pytest.approx(2.3)  # no beta: no size credit
    assert loss_objective(2.5, 0.05, 1e6, 0.15, 3.0) == pytest.approx(2.65)  # a rising curve is debited
    for extrapolate in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="extrapolate must be a finite number >= 0"):
            loss_objective(2.5, -0.1, 1e6, 0.15, extrapolate)
    rule = LossRule(0.15, 2.0)
    assert rule.value(2.5, -0.1, 1e6 * math.e) == loss_objective(2.5, -0.1, 1e6 * math.e, 0.15, 2.0)
    assert rule.value(2.5, None, 1e6) == 2.5  # a row without a stored change: 0
    assert rule.formula() == "loss + 2 x change - 0.1500 ln(params / 1M)"
    assert LossRule().plain and not LossRule(None, 2.0).plain and not LossRule(0.0).plain
    with pytest.raises(ValueError, match="extrapolate"):
        LossRule(0.15, -2.0)


@pytest.mark.parametrize(
    ("curve", "change"),
    [
        pytest.param([], 0.0, id="empty"),
        pytest.param([(100, 3.0)], 0.0, id="one-point"),
        pytest.param([(100, 3.0), (200, 2.6)], -0.4, id="two-points"),
        pytest.param([(100, 3.1), (200, 2.8), (300, 2.5), (400, 2.45)], -0.05, id="many"),
        pytest.param([(100, 2.4), (200, 2.5)], 0.1, id="rising"),
        pytest.param([(100, 3.0), (200, 2.7), (300, math.nan)], -0.3, id="non-finite-left-out"),
    ],
)
def test_the_change_is_the_curves_last_interval(curve, change):
    assert curve_change(curve) == pytest.approx(change)


def test_a_study_with_a_size_beta_tells_optuna_the_size_adjusted_loss():
    cfg = preset("byte-1m")
    outcome = TrialOutcome(status="complete", train={"val_loss": 2.5})
    plain = objective_values(tiny_spec(), outcome, cfg)
    credited = objective_values(tiny_spec(objectives="size_beta = 0.2"), outcome, cfg)
    params = param_counts(cfg).total
    assert plain[0] == 2.5 and credited[0] == pytest.approx(2.5 - 0.2 * math.log(params / 1e6))
    assert credited[1:] == plain[1:]  # the other objectives are as they were


def test_a_study_with_extrapolate_tells_optuna_the_loss_carried_on_by_its_curves_last_change():
    cfg = preset("byte-1m")
    curve = [[100, 3.0], [200, 2.7], [300, 2.6]]
    outcome = TrialOutcome(status="complete", train={"val_loss": 2.6, "val_curve": curve})
    params = param_counts(cfg).total
    told = objective_values(tiny_spec(objectives="size_beta = 0.2\nextrapolate = 2.0"), outcome, cfg)
    assert told[0] == pytest.approx(2.6 + 2.0 * -0.1 - 0.2 * math.log(params / 1e6))
    assert objective_values(tiny_spec(objectives="extrapolate = 2.0"), outcome, cfg)[0] == pytest.approx(2.4)
