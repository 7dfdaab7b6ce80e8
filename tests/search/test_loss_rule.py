"""A study's loss objective with `[objectives] extrapolate`, read alike by everything that ranks
trials: what Optuna is told (`driver.objective_values`), the front (`pareto.study_front`), the
export selectors (`selection.select`) and the report's trials table. Written through the storage
API: no training, no Ray (as `tests/results/studies.py`).

Two shapes of one size and cost (GELU and ReLU MLPs of the same widths) end their proxy at the same
loss; the ReLU one's curve still falls steeply there, the GELU one's has flattened. A third, larger
shape gives the front its other end.
"""

from __future__ import annotations

import pytest

from archsearch.search.driver import objective_values
from archsearch.search.pareto import study_front, study_fronts
from archsearch.search.selection import Choice, select
from archsearch.space.costs import flop_counts
from archsearch.space.knobs import config_from_knobs
from archsearch.storage import Storage
from archsearch.trial import TrialOutcome
from tests.specs import tiny_spec

FLAT, STEEP, LARGE = 0, 1, 2
SHAPES = {  # number: (d_model, activation, held-out curve)
    FLAT: (64, "gelu", [[1000, 2.08], [2000, 2.03], [3000, 2.0]]),  # last change -0.03
    STEEP: (64, "relu", [[1000, 2.9], [2000, 2.4], [3000, 2.0]]),  # last change -0.4
    LARGE: (128, "gelu", [[1000, 2.2], [2000, 1.95], [3000, 1.9]]),  # last change -0.05
}
BETA = "size_beta = 0.15"
CARRIED = "size_beta = 0.15\nextrapolate = 2.0"
ONLY = "extrapolate = 2.0"  # no size credit


def _config(number: int):
    d_model, activation, _ = SHAPES[number]
    return config_from_knobs(d_model=d_model, n_layers=2, head_dim=32, vocab_size=256, seq_len=32,
                             activation=activation)  # fmt: skip


def _study(db: Storage, name: str, objectives: str) -> None:
    spec = tiny_spec(objectives=f"minimize = ['loss', 'flops']\n{objectives}")
    db.create_study(name, spec_fingerprint=spec.fingerprint, spec_source=spec.source, spec=spec.to_dict(),
                    objectives=spec.objectives)  # fmt: skip
    for number, (_, _, curve) in SHAPES.items():
        slot = db.claim_trial(name, 100, 60)
        db.assign_trial(slot, number=number, optuna_trial_id=number, params={}, config=_config(number))
        train = {"val_loss": curve[-1][1], "tokens": 3000, "val_curve": curve}
        db.finish_trial(slot, TrialOutcome(status="complete", train=train))


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    with Storage.open(f"sqlite:///{tmp_path_factory.mktemp('db') / 'trials.db'}") as st:
        _study(st, "beta", BETA)
        _study(st, "carried", CARRIED)
        _study(st, "only", ONLY)
        yield st


def test_the_two_shapes_tie_in_size_cost_and_end_loss():
    flat, steep = _config(FLAT), _config(STEEP)
    assert flop_counts(flat).forward == flop_counts(steep).forward
    assert SHAPES[FLAT][2][-1][1] == SHAPES[STEEP][2][-1][1]


@pytest.mark.parametrize(("study", "objectives"), [("beta", BETA), ("carried", CARRIED), ("only", ONLY)])
def test_optuna_is_told_what_the_front_ranks(db, study, objectives):
    spec = tiny_spec(objectives=objectives)
    front = study_front(db, study)
    told = {r.number: objective_values(spec, r, r.config)[0] for r in db.trials(study)}
    ranked = dict(zip(front.trial_numbers, front.trial_values[:, 0], strict=True))
    assert ranked == pytest.approx(told)
    assert db.require_study(study).loss_rule == spec.loss_rule == front.loss_rule
    if study == "only":  # the study's own objective credits no size, nor does its front
        assert front.to_dict()["size_beta"] is None and front.loss_rule.formula() == "loss + 2 x change"
        assert [f.loss_rule for f in study_fronts(db, ["only"])] == [spec.loss_rule]


def test_with_extrapolate_the_still_falling_shape_ranks_above_the_flattened_one(db):
    plain, carried = study_front(db, "beta"), study_front(db, "carried")
    # Size credit alone cannot tell them apart: equal rows, both on the front.
    assert {FLAT, STEEP} <= set(plain.front.numbers)
    # Carried on by its last change twice, the steep curve's loss is 2.0 - 0.8 (before the same size
    # credit), the flat one's 2.0 - 0.06: the flat shape is dominated.
    assert STEEP in carried.front.numbers and FLAT not in carried.front.numbers
    values = dict(zip(carried.trial_numbers, carried.trial_values[:, 0], strict=True))
    assert values[FLAT] - values[STEEP] == pytest.approx(2.0 * (0.4 - 0.03))
    assert carried.loss_rule.extrapolate == 2.0 and carried.size_beta == 0.15
    shown = carried.to_dict()
    assert (shown["loss"], shown["size_beta"], shown["extrapolate"]) == ("adjusted", 0.15, 2.0)
    member = next(m for m in shown["front"] if m["number"] == STEEP)
    assert member["loss"] == 2.0 and member["adjusted_loss"] == pytest.approx(values[STEEP])


def test_the_export_selectors_choose_by_the_extrapolated_objective(db):
    limit = str(flop_counts(_config(FLAT)).forward)  # admits the two tied shapes only
    choice = Choice("hf", best_under_flops=limit)
    best = {s: select(db, s, choice).members[0].number for s in ("beta", "carried")}
    assert best == {"beta": FLAT, "carried": STEEP}  # a tie goes to the lower number; the change breaks it
    front = select(db, "carried", Choice("hf", front=True))
    assert [m.number for m in front.members] == list(study_front(db, "carried").front.numbers)


def test_the_proxy_loss_stays_available_as_measured(db):
    proxy = study_front(db, "carried", loss="proxy")
    assert proxy.loss_rule is None and {FLAT, STEEP} & set(proxy.front.numbers)
    values = dict(zip(proxy.trial_numbers, proxy.trial_values[:, 0], strict=True))
    assert values[FLAT] == values[STEEP] == 2.0


def test_the_report_shows_the_rule_and_each_trials_objective(db):
    from archsearch.results.html import render
    from archsearch.results.report import build_report

    page = render(build_report(db, ["carried"]))
    front = study_front(db, "carried")
    values = dict(zip(front.trial_numbers, front.trial_values[:, 0], strict=True))
    assert "the loss is adjusted: loss + 2 x change - 0.1500 ln(params / 1M)" in page
    for n in SHAPES:  # the trials table's "adjusted loss" column
        assert f'<td data-sort="{float(values[n])!r}">{values[n]:.4f}</td>' in page, n
