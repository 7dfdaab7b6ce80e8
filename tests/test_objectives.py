"""Each objective is defined once (`space.objectives`) and every place that uses one can."""

from __future__ import annotations

import pytest

from archsearch.errors import ArchsearchError
from archsearch.search.driver import objective_values
from archsearch.space import preset
from archsearch.space.objectives import OBJECTIVES, parse_objectives
from archsearch.storage.query import ALIASES, COLUMNS
from archsearch.trial import TrialOutcome
from tests.specs import tiny_spec

STEP_TIME = 'minimize = ["loss", "flops", "step_time"]\nstep_time_device = "local"'


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_every_objective_is_a_stored_column_a_query_alias_and_an_optuna_value(name):
    objective = OBJECTIVES[name]
    assert objective.column in COLUMNS and COLUMNS[objective.column] == "number"
    assert ALIASES.get(name, name) == objective.column
    spec = tiny_spec(objectives=STEP_TIME)
    outcome = TrialOutcome(status="complete", train={"val_loss": 2.5}, step_time_s=0.1)
    values = dict(zip(spec.objectives, objective_values(spec, outcome, preset("byte-1m")), strict=True))
    assert set(values) == set(OBJECTIVES) and values[name] > 0


@pytest.mark.parametrize(
    "names", ["flops,loss", "loss", "loss,loss", "loss,latency", "loss,flops,step_time,flops", ""]
)
def test_one_rule_for_every_objective_list(names):
    with pytest.raises(ArchsearchError, match="must be loss then one or two of flops, step_time"):
        parse_objectives(names)
