"""Non-finite numbers: a NaN or infinite loss fails its trial with the reason and the search goes
on, on SQLite as on PostgreSQL, and every backend stores such numbers alike.

The suite's earlier NaN test (`tests/evaluators/test_trainer.py`) checked the trainer's result
only, never what the database made of it: the NaN point on the validation curve reached
`archsearch_curves.loss` (NOT NULL), which SQLite's driver binds as NULL, so the write failed and
stopped the search there, while PostgreSQL stored the NaN.
"""

from __future__ import annotations

import math
import os
import sys

import optuna
import pytest
from ray import cloudpickle  # Ray vendors it

from archsearch.search.driver import SearchOptions, run_search
from archsearch.storage import Storage
from archsearch.trial import TrialOutcome
from tests.specs import tiny_spec

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers need not import tests/
pytestmark = pytest.mark.usefixtures("ray_session")

# An evaluation after every step: the first step's training loss is finite (taken before the
# update), the evaluation after it is not. With fewer evaluations the training loss turns NaN
# first and no NaN reaches the curve: the case the issue hit needs the evaluation to come first.
DIVERGING = "tokens = 2048\nbatch_size = 4\nevals = 16\neval_batches = 1\ndevice = 'cpu'\nlr = 1e9"


def _optuna_states(url: str, study: str = "s") -> list[str]:
    """Optuna's states of the trained trials (duplicate samples, told PRUNED, left out)."""
    trials = optuna.load_study(study_name=study, storage=url).trials
    return sorted(t.state.name for t in trials if t.state.name != "PRUNED")


def _trained(db: Storage) -> list:
    return [r for r in db.trials("s") if r.status != "duplicate"]


def test_a_diverging_proxy_fails_each_trial_with_the_reason_and_the_search_finishes(backend_url):
    # A divergence as a user meets it: `[proxy] lr = 1e9`, a valid value, trained for real.
    with Storage.open(backend_url) as db:
        summary = run_search(tiny_spec(proxy=DIVERGING), db, SearchOptions(study="s", trials=3))
        records = _trained(db)
        assert summary.front is None and [r.status for r in records] == ["failed"] * 3, db.counts("s")
        for record in records:
            assert record.reason.startswith("non-finite loss: validation loss is "), record.reason
            assert record["loss"] is None
            curves = db.curves(record.id)
            assert all(math.isfinite(loss) for kind in curves.values() for _, loss in kind), curves
    assert _optuna_states(backend_url) == ["FAIL"] * 3


def _stub(request, known=None, board=None):
    """Trial 0 ends complete with a NaN loss and a NaN point on its curve; the others are fine."""
    loss = math.nan if request.number == 0 else 2.0 + request.config.d_model / 1000
    curve = [[64, 3.0], [128, math.nan], [192, math.inf]] if request.number == 0 else [[64, loss]]
    return TrialOutcome(status="complete", train={"val_loss": loss, "tokens": 192, "val_curve": curve})


def test_a_complete_outcome_with_a_nan_loss_is_a_failed_trial_and_the_search_goes_on(backend_url):
    with Storage.open(backend_url) as db:
        run_search(tiny_spec(), db, SearchOptions(study="s", trials=3), evaluate_fn=_stub)
        first, *rest = _trained(db)
        assert (first.status, first.reason) == ("failed", "non-finite loss: the proxy loss is nan")
        assert [r.status for r in rest] == ["complete", "complete"]
        assert db.curves(first.id)["val"] == [(64, 3.0)]  # finite points only, on every backend
    assert _optuna_states(backend_url) == ["COMPLETE", "COMPLETE", "FAIL"]


def _bad_profile_once(marker):
    """The second trained trial's profile has a NaN step time, which its NOT NULL column refuses
    on every backend (`marker` counts the trials across Ray's worker processes)."""

    def evaluate(request, known=None, board=None):
        with open(marker, "a") as f:
            f.write("x")
        step = math.nan if os.path.getsize(marker) == 2 else 0.01
        profile = dict(device="local", modelled=False, dtype="fp32", batch=4, step_time_s=step,
                       tokens_per_second=1e4, report={})  # fmt: skip
        train = {"val_loss": 2.0 + request.config.d_model / 1000, "tokens": 64, "val_curve": [[64, 2.5]]}
        return TrialOutcome(status="complete", train=train, profiles=(profile,))

    return evaluate


def test_a_value_the_database_refuses_fails_that_trial_and_nothing_is_half_written(backend_url, tmp_path):
    evaluate = _bad_profile_once(str(tmp_path / "trials"))
    with Storage.open(backend_url) as db:
        run_search(tiny_spec(), db, SearchOptions(study="s", trials=3), evaluate_fn=evaluate)
        records = _trained(db)
        assert [r.status for r in records] == ["complete", "failed", "complete"]
        assert records[1].reason.startswith("its results could not be stored: "), records[1].reason
        assert "step_time_s" in records[1].reason
        assert db.curves(records[1].id) == {"train": [], "val": []} and db.profiles(records[1].id) == []
        assert "running" not in db.counts("s")
    assert _optuna_states(backend_url) == ["COMPLETE", "COMPLETE", "FAIL"]


def test_non_finite_numbers_are_stored_alike_on_every_backend(backend_url):
    # NaN becomes NULL (SQLite has no NaN; PostgreSQL would keep it); +-inf stay +-inf on both.
    with Storage.open(backend_url) as db:
        db.create_study("s", spec_fingerprint="f", spec_source="", spec={}, objectives=("loss", "flops"))
        slot = db.claim_trial("s", 10, 60)
        train = {
            "val_loss": math.nan, "bits_per_byte": math.inf, "tokens_per_second": -math.inf,
            "val_curve": [[1, 2.0], [2, math.nan], [3, -math.inf]], "loss_curve": [[1, math.inf]],
        }  # fmt: skip
        db.finish_trial(slot, TrialOutcome(status="failed", reason="diverged", train=train))
        (record,) = db.trials("s")
        assert record["loss"] is None
        assert (record["bits_per_byte"], record["tokens_per_second"]) == (math.inf, -math.inf)
        assert db.curves(record.id) == {"train": [], "val": [(1, 2.0)]}
        rows = db.trial_rows("s", ["loss", "bits_per_byte"])
        assert rows == [(None, math.inf)]
