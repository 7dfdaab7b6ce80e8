"""Each objective is defined once (`space.objectives`) and every place that uses one can."""

from __future__ import annotations

import math

import pytest

from archsearch.errors import ArchsearchError
from archsearch.search.driver import objective_values
from archsearch.space import preset
from archsearch.space.costs import param_counts
from archsearch.space.objectives import OBJECTIVES, parse_objectives, size_adjusted_loss
from archsearch.storage.query import ALIASES, COLUMNS
from archsearch.trial import TrialOutcome
from tests.specs import tiny_spec


def _spec_with(name: str):
    """A spec minimising `name` beside the loss, with what that objective needs."""
    if name == "loss":
        return tiny_spec()
    tables = {"objectives": f'minimize = ["loss", "{name}"]'}
    if name == "step_time":
        tables["objectives"] += '\nstep_time_device = "local"'
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
    assert size_adjusted_loss(2.5, 1e6, 0.15) == 2.5  # a 1M-parameter shape keeps its loss
    assert size_adjusted_loss(2.5, 1e6 * math.e, 0.15) == pytest.approx(2.35)
    assert size_adjusted_loss(2.5, 1e6 / math.e**2, 0.15) == pytest.approx(2.8)
    assert size_adjusted_loss(2.5, 123, None) == 2.5  # a study without a beta: the loss as it is
    for params, beta in ((0, 0.1), (1e6, -0.1), (1e6, math.inf)):
        with pytest.raises(ValueError):
            size_adjusted_loss(2.5, params, beta)


def test_a_study_with_a_size_beta_tells_optuna_the_size_adjusted_loss():
    cfg = preset("byte-1m")
    outcome = TrialOutcome(status="complete", train={"val_loss": 2.5})
    plain = objective_values(tiny_spec(), outcome, cfg)
    credited = objective_values(tiny_spec(objectives="size_beta = 0.2"), outcome, cfg)
    params = param_counts(cfg).total
    assert plain[0] == 2.5 and credited[0] == pytest.approx(2.5 - 0.2 * math.log(params / 1e6))
    assert credited[1:] == plain[1:]  # the other objectives are as they were
