"""The search driver, in process: real and stand-in evaluations on a shared local Ray."""

from __future__ import annotations

import math
import os
import signal
import sys
from dataclasses import replace

import optuna
import pytest
from ray import cloudpickle  # Ray vendors it

from archsearch.errors import Terminated
from archsearch.search import driver as driver_module
from archsearch.search.driver import (
    SearchError,
    SearchOptions,
    SetupFailureError,
    objective_values,
    run_search,
)
from archsearch.storage import Storage
from archsearch.trial import TrialOutcome
from tests.specs import LOCAL_PROFILE, tiny_spec

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers need not import tests/
pytestmark = pytest.mark.usefixtures("ray_session")


@pytest.fixture
def db(tmp_path):
    with Storage.open(f"sqlite:///{tmp_path / 'trials.db'}") as storage:
        yield storage


def _result(request, loss=None):
    """What a worker returns, without training: the loss grows with width (for the front)."""
    cfg = request.config
    loss = 1.0 + cfg.d_model / 1000 + cfg.n_layers / 100 if loss is None else loss
    return TrialOutcome(status="complete", train={"val_loss": loss, "tokens": 1, "val_curve": [[1, loss]]})


def instant(request, known=None, board=None):
    return _result(request)


def _optuna_states(db, study):
    trials = optuna.load_study(study_name=study, storage=db.url).trials
    return sorted(t.state.name for t in trials)


def test_a_search_trains_profiles_and_records_every_trial(db):
    objectives = 'minimize = ["loss", "flops", "step_time"]\nstep_time_device = "h100-sxm"'
    spec = tiny_spec(profile=LOCAL_PROFILE, objectives=objectives)
    summary = run_search(spec, db, SearchOptions(study="s", trials=3, workers=2))
    records = db.trials("s")
    assert [r.status for r in records] == ["complete"] * 3 and summary.signal is None
    for r in records:
        assert r.config is not None and r["d_model"] == r.config.d_model
        assert 0 < r["loss"] < 6 and r["tokens_trained"] >= 2048 and r["step_time_device"] == "h100-sxm"
        assert {p.device for p in db.profiles(r.id)} == {"local", "h100-sxm"}
        assert len(db.curves(r.id)["val"]) == 4
    assert db.measurements() and db.devices()
    assert {d.info["threads"] for d in db.devices()} == {1}  # a CPU trial's threads: its one Ray CPU
    study = optuna.load_study(study_name="s", storage=db.url)
    assert [t.values[1] for t in study.trials] == [r["flops_forward_per_token"] for r in records]
    assert {t.number for t in study.best_trials} == set(summary.front.front.numbers)


def test_a_study_is_resumed_only_when_asked_and_only_from_the_same_space(db):
    spec = tiny_spec()
    run_search(spec, db, SearchOptions(study="s", trials=2), evaluate_fn=instant)
    with pytest.raises(SearchError, match=r"already exists \(2 finished trials\): pass --resume"):
        run_search(spec, db, SearchOptions(study="s", trials=3), evaluate_fn=instant)
    other = tiny_spec(proxy="tokens = 4096\nbatch_size = 4\ndevice = 'cpu'")
    with pytest.raises(SearchError, match="created from a different space file"):
        run_search(other, db, SearchOptions(study="s", trials=3, resume=True), evaluate_fn=instant)
    run_search(spec, db, SearchOptions(study="s", trials=5, resume=True), evaluate_fn=instant)
    counts = db.counts("s")  # duplicates of earlier shapes do not count: 5 trained, none lost
    assert counts["complete"] == 5 and set(counts) <= {"complete", "duplicate"}
    assert _optuna_states(db, "s") == ["COMPLETE"] * 5 + ["PRUNED"] * counts.get("duplicate", 0)


def test_a_worker_killed_mid_trial_is_retried_and_the_crash_recorded(db, tmp_path):
    marker = tmp_path / "crashed"

    def crash_once(request, known=None, board=None):
        if request.number == 1 and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return _result(request)

    run_search(tiny_spec(), db, SearchOptions(study="s", trials=3, retries=1), evaluate_fn=crash_once)
    records = db.trials("s")
    assert [(r.status, r.attempts) for r in records] == [("complete", 1), ("complete", 2), ("complete", 1)]
    assert records[1].reason.startswith("attempt 1: worker died")
    assert _optuna_states(db, "s") == ["COMPLETE"] * 3


def test_without_retries_a_killed_worker_fails_its_trial_and_the_search_goes_on(db):
    def crash_on_one(request, known=None, board=None):
        if request.number == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return _result(request)

    run_search(tiny_spec(), db, SearchOptions(study="s", trials=3, retries=0), evaluate_fn=crash_on_one)
    assert [r.status for r in db.trials("s")] == ["complete", "failed", "complete"]
    assert "worker died" in db.trials("s")[1].reason
    assert _optuna_states(db, "s") == ["COMPLETE", "COMPLETE", "FAIL"]


def test_an_exception_in_the_evaluation_fails_that_trial_with_its_message(db):
    def broken(request, known=None, board=None):
        if request.number == 0:
            raise ValueError("boom")
        return _result(request)

    run_search(tiny_spec(), db, SearchOptions(study="s", trials=2, retries=3), evaluate_fn=broken)
    first = db.trials("s")[0]
    assert (first.status, first.attempts) == ("failed", 1)  # a bug is not retried
    assert first.reason == "error in the evaluation: ValueError: boom"


# A continuous knob: the space cannot be enumerated, so it is sampled as is and the budget
# rejects points (an enumerable space proposes only feasible ones: `SearchSpace.sample`).
CONTINUOUS = """vocab_size = 256
seq_len = 32
d_model = [64, 128]
aspect_ratio = [32, 64]
activation = ["gelu", "swiglu"]
head_dim = [32]
d_ff_ratio = { min = 2.0, max = 4.0 }"""


def test_an_enumerable_space_under_a_budget_proposes_only_shapes_to_train(db):
    spec = tiny_spec(budget="params = { max = 200_000 }")
    run_search(spec, db, SearchOptions(study="s", trials=3, sampler="random"), evaluate_fn=instant)
    counts = db.counts("s")
    assert counts["complete"] == 3 and "rejected" not in counts, counts


def test_points_outside_the_budget_are_rejected_before_any_compute(db):
    spec = tiny_spec(model=CONTINUOUS, budget="params = { max = 200_000 }")

    def record(request, known=None, board=None):
        return _result(request)

    run_search(spec, db, SearchOptions(study="s", trials=4, sampler="random"), evaluate_fn=record)
    counts = db.counts("s")
    assert counts["complete"] == 4 and counts.get("rejected", 0) >= 1, counts
    rejected = db.trials("s", "rejected")
    assert all("params" in r.reason and r["loss"] is None for r in rejected)
    assert all(r["params_total"] <= 200_000 for r in db.trials("s", "complete"))


def test_dominated_trials_are_pruned_at_a_rung_with_the_reason(db):
    # Every trial reports the same FLOPs and a worse loss at the first rung than the one before,
    # so from the second on each is dominated by all before it.
    spec = tiny_spec(
        model="vocab_size = 256\nseq_len = 32\nd_model = [64, 128, 192, 256]\n"
        "aspect_ratio = 32\nhead_dim = 32",
        search="trials = 4\nprune = true\nrungs = [0.25]\nprune_min_trials = 1",
    )

    def report_rung(request, known=None, board=None):
        import ray

        loss = 1.0 + request.number
        reason = ray.get(board.decide.remote(request.number, 0, loss, 1e6))
        if reason:
            train = {"val_loss": loss, "val_curve": [[1, loss]]}
            return TrialOutcome(status="pruned", reason=reason, pruned_rung=0.25, train=train)
        return _result(request, loss)

    run_search(spec, db, SearchOptions(study="s", trials=4, workers=1), evaluate_fn=report_rung)
    records = [r for r in db.trials("s") if r.status != "duplicate"]
    assert [r.status for r in records] == ["complete", "pruned", "pruned", "pruned"]
    assert all(r["pruned_rung"] == 0.25 and "dominated at rung 0.25" in r.reason for r in records[1:])
    trials = {t.number: t for t in optuna.load_study(study_name="s", storage=db.url).trials}
    assert [trials[r.number].state.name for r in records] == ["COMPLETE", "PRUNED", "PRUNED", "PRUNED"]
    # Their curves stay in archsearch's table: TPE reads a pruned trial's intermediate values
    # through study.direction, which raises in a multi-objective study (`_Driver._describe`).
    assert all(trials[r.number].intermediate_values == {} for r in records[1:])
    assert trials[records[0].number].intermediate_values


def _study_with_a_dead_drivers_trial(db, lease_s: float):
    """One complete trial, then a driver that died mid-trial: Optuna RUNNING, archsearch running
    with a lease `lease_s` from now (negative: already expired)."""
    spec = tiny_spec()
    run_search(spec, db, SearchOptions(study="s", trials=1), evaluate_fn=instant)
    study = optuna.load_study(study_name="s", storage=db.optuna_storage())
    first = db.trials("s")[0].params
    study.enqueue_trial({**first, "d_model": 192 - first["d_model"]})  # the other width: no duplicate
    trial = study.ask()
    cfg = spec.space.sample(trial)
    slot = db.claim_trial("s", 10, lease_s=lease_s)
    db.assign_trial(
        slot, number=trial.number, optuna_trial_id=trial._trial_id, params=trial.params, config=cfg
    )
    return spec, slot


def test_a_stale_lease_is_swept_and_its_point_re_queued_on_resume(db):
    spec, _ = _study_with_a_dead_drivers_trial(db, lease_s=-1)
    run_search(spec, db, SearchOptions(study="s", trials=3, resume=True), evaluate_fn=instant)
    records = [r for r in db.trials("s") if r.status != "duplicate"]  # the sampler may repeat a shape
    assert [r.status for r in records] == ["complete", "interrupted", "complete", "complete"]
    assert "lease expired" in records[1].reason
    assert records[2].params == records[1].params  # the interrupted point ran first on resume
    states = {t.number: t.state.name for t in optuna.load_study(study_name="s", storage=db.url).trials}
    assert [states[r.number] for r in records] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]


def test_a_shape_evaluated_before_is_not_trained_again(db, monkeypatch):
    # Two points in the space, four trials asked for: after both points ran, every sample is a
    # duplicate; Optuna is told the earlier result, and the search stops with a clear reason.
    monkeypatch.setattr(driver_module, "MAX_REJECTIONS", 5)
    spec = tiny_spec(
        model="vocab_size = 256\nseq_len = 32\nd_model = [64, 128]\naspect_ratio = 32\nhead_dim = 32"
    )

    def count(request, known=None, board=None):
        return _result(request)

    with pytest.raises(SearchError, match="space may be exhausted"):
        run_search(spec, db, SearchOptions(study="s", trials=4, sampler="random"), evaluate_fn=count)
    counts = db.counts("s")
    assert counts["complete"] == 2 and counts["duplicate"] >= 5
    duplicate = db.trials("s", "duplicate")[0]
    assert duplicate.reason.startswith("same shape as trial") and duplicate["loss"] is None
    study = optuna.load_study(study_name="s", storage=db.url)
    # Optuna is not told the result twice: a duplicate is an infeasible PRUNED sample, so the
    # sampler is steered off the point and the front holds each shape once.
    trained = {t.number for t in study.trials if t.state.name == "COMPLETE"}
    assert trained == {0, 1} and {t.number for t in study.best_trials} <= trained
    duplicates = [t for t in study.trials if t.number not in trained]
    assert all(t.state.name == "PRUNED" and t.constraints == {"new_shape": 1.0} for t in duplicates)
    assert all(t.user_attrs["archsearch_reason"].startswith("duplicate of trial") for t in duplicates)


def test_a_replay_trains_another_studys_shapes_first_in_order_and_never_twice(db):
    # A wider space than the tiny one (18 points) so that two sampler seeds draw different shapes.
    model = "vocab_size = 256\nseq_len = 32\nd_model = [64, 128]\naspect_ratio = [16, 32, 64]\n"
    model += "head_dim = 32\nactivation = ['gelu', 'swiglu', 'relu']"
    source = tiny_spec(model=model)
    run_search(source, db, SearchOptions(study="a", trials=4, sampler="random", seed=1), evaluate_fn=instant)
    shapes = [r.config for r in db.trials("a", "complete")]
    numbers = [f"a#{r.number}" for r in db.trials("a", "complete")]
    other_proxy = tiny_spec(model=model, proxy="tokens = 2048\nbatch_size = 4\nseed = 1\ndevice = 'cpu'")
    options = SearchOptions(study="b", trials=3, sampler="random", seed=7, replay="a")
    run_search(other_proxy, db, options, evaluate_fn=instant)
    assert [r.config for r in db.trials("b")] == shapes[:3]
    resumed = SearchOptions(study="b", trials=6, sampler="random", seed=7, replay="a", resume=True)
    run_search(other_proxy, db, resumed, evaluate_fn=instant)
    replayed = [r.config for r in db.trials("b", "complete")]
    assert replayed[:4] == shapes and len(set(map(repr, replayed))) == 6 and "duplicate" not in db.counts("b")
    study = optuna.load_study(study_name="b", storage=db.url)
    attrs = [t.user_attrs.get("replayed_from") for t in study.trials]
    assert attrs[:4] == numbers and attrs[4:] == [None, None]


def test_a_replay_of_a_missing_study_or_another_space_is_refused_before_any_trial(db):
    spec = tiny_spec()
    with pytest.raises(SearchError, match="--replay: no study 'nope' in this database"):
        run_search(spec, db, SearchOptions(study="b", trials=2, replay="nope"), evaluate_fn=instant)
    run_search(spec, db, SearchOptions(study="a", trials=2), evaluate_fn=instant)
    wider = tiny_spec(budget="params = { max = 200_000 }")
    with pytest.raises(SearchError, match="study 'a' searched another space"):
        run_search(wider, db, SearchOptions(study="c", trials=2, replay="a"), evaluate_fn=instant)
    assert db.counts("c") == {}


def test_a_shape_running_in_another_slot_is_not_trained_twice(db, monkeypatch):
    # One point in the space and two workers: the second sample is the shape the first worker
    # is training, recorded as its duplicate at once instead of training it again.
    monkeypatch.setattr(driver_module, "MAX_REJECTIONS", 5)
    spec = tiny_spec(model="vocab_size = 256\nseq_len = 32\nd_model = [64]\naspect_ratio = 32\nhead_dim = 32")
    with pytest.raises(SearchError, match="space may be exhausted"):
        run_search(
            spec, db, SearchOptions(study="s", trials=3, workers=2, sampler="random"), evaluate_fn=instant
        )
    records = db.trials("s")
    assert [r.status for r in records].count("complete") == 1
    assert records[1].status == "duplicate" and records[1].reason.startswith("same shape as trial 0")


def test_a_duplicate_another_driver_told_optuna_first_is_left_as_it_told_it(db, monkeypatch):
    # Between this driver finishing a duplicate's row and telling Optuna, another driver's
    # start-up sweep may tell Optuna the same from the database (seen under load: two drivers on
    # one study, and one ended in UpdateFinishedTrialError). This driver goes on.
    monkeypatch.setattr(driver_module, "MAX_REJECTIONS", 3)
    spec = tiny_spec(model="vocab_size = 256\nseq_len = 32\nd_model = [64]\naspect_ratio = 32\nhead_dim = 32")
    end_trial = db.end_trial

    def end_then_a_peer_sweeps(trial_id, status, reason):
        end_trial(trial_id, status, reason)
        if status == "duplicate":  # what the peer's `_tell_recorded` tells of a finished duplicate row
            (number,) = [r.number for r in db.trials("s") if r.id == trial_id]
            peer = optuna.load_study(study_name="s", storage=db.url)
            peer.tell(number, state=optuna.trial.TrialState.PRUNED)

    monkeypatch.setattr(db, "end_trial", end_then_a_peer_sweeps)
    with pytest.raises(SearchError, match="space may be exhausted"):
        run_search(spec, db, SearchOptions(study="s", trials=3, sampler="random"), evaluate_fn=instant)
    assert db.counts("s") == {"complete": 1, "duplicate": 3}
    assert _optuna_states(db, "s") == ["COMPLETE"] + ["PRUNED"] * 3


def test_a_resume_waits_for_a_dead_drivers_lease_and_ends_with_nothing_running(db, caplog, monkeypatch):
    # A driver killed mid-trial, its lease still running when the resume starts: the resume used
    # to stop with that row still running, one trial short. Now it waits for the lease, then
    # re-runs the point. The lease runs out once the resume is waiting (not on a clock: no race).
    spec, slot = _study_with_a_dead_drivers_trial(db, lease_s=3600)
    wait = driver_module._Driver._wait_for_dead_leases

    def lease_runs_out_while_waiting(self):
        waiting = wait(self)
        db.renew_leases([slot], lease_s=-1)
        return waiting

    monkeypatch.setattr(driver_module._Driver, "_wait_for_dead_leases", lease_runs_out_while_waiting)
    with caplog.at_level("WARNING", logger=driver_module.__name__):
        run_search(spec, db, SearchOptions(study="s", trials=3, resume=True), evaluate_fn=instant)
    counts = db.counts("s")
    assert counts["complete"] == 3 and counts["interrupted"] == 1 and "running" not in counts
    assert "waiting up to" in caplog.text and "for the lease to expire" in caplog.text


def test_a_live_drivers_running_trial_is_not_waited_for(db):
    # A lease that is renewed belongs to a driver at work: the idle driver stops watching it.
    spec = tiny_spec()
    run_search(spec, db, SearchOptions(study="s", trials=1), evaluate_fn=instant)
    slot = db.claim_trial("s", 10, lease_s=3600)
    driver = driver_module._Driver(spec, db, SearchOptions(study="s", trials=2, resume=True), None)
    driver.open_study()
    assert driver._wait_for_dead_leases()  # first sight: it may be a dead driver's
    assert driver._wait_for_dead_leases()  # not renewed yet: still waiting
    db.renew_leases([slot], lease_s=3600)
    assert not driver._wait_for_dead_leases()  # renewed: its driver is alive and will record it
    assert db.counts("s")["running"] == 1


def _niceness():
    return os.nice(0)


def test_a_local_ray_runs_trials_at_the_driver_priority_not_ray_background_nice():
    """Ray's default worker niceness (15) starved trials on a busy machine (`start_local_ray`)."""
    import ray

    assert ray.get(ray.remote(_niceness).remote()) == os.nice(0)


def test_optunas_own_view_of_the_study_matches_archsearchs(db):
    """What optuna-dashboard and `optuna.load_study` read: no rejected sample as a failure, the
    same front, learning curves and the shape of every trained trial."""
    spec = tiny_spec(model=CONTINUOUS, budget="params = { max = 200_000 }")
    summary = run_search(spec, db, SearchOptions(study="s", trials=4, sampler="random"), evaluate_fn=instant)
    records = {r.number: r for r in db.trials("s")}
    rejected = [n for n, r in records.items() if r.status == "rejected"]
    assert rejected  # the budget refuses some samples, which trained nothing
    study = optuna.load_study(study_name="s", storage=db.url)
    assert all(t.state.name != "FAIL" for t in study.trials)
    assert {t.number for t in study.best_trials} == set(summary.front.front.numbers)
    for t in study.trials:
        record = records[t.number]
        if record.status in ("rejected", "duplicate"):
            constraint = {"rejected": "valid_shape", "duplicate": "new_shape"}[record.status]
            assert t.state.name == "PRUNED" and t.constraints == {constraint: 1.0}
            assert t.user_attrs["archsearch_reason"].startswith(record.status[:-1])
        else:
            assert t.state.name == "COMPLETE" and t.constraints == {}
            assert t.intermediate_values == {1: pytest.approx(record["loss"])}  # the eval curve
            assert t.user_attrs["shape"] == record.config.describe()
            assert t.user_attrs["params"] == record["params_total"]
            assert t.user_attrs["flops_per_token"] == record["flops_forward_per_token"]


def test_each_run_records_the_settings_that_ran_not_the_space_files_defaults(db):
    spec = tiny_spec()  # its [search] table: tpe, seed 0, pruning on
    options = SearchOptions(study="s", trials=1, sampler="random", seed=1, prune=False)
    run_search(spec, db, options, evaluate_fn=instant)
    recorded = sum(db.counts("s").values())
    run_search(spec, db, SearchOptions(study="s", trials=2, resume=True), evaluate_fn=instant)
    first, second = (run.settings for run in db.search_runs("s"))
    assert (first["sampler"], first["seed"], first["prune"], first["sampler_seed"]) == ("random", 1, False, 1)
    assert (second["sampler"], second["resume"], second["trials"]) == ("tpe", True, 2)
    assert second["sampler_seed"] == 0 + recorded  # its own stream: the seed plus the trials before it


def test_a_study_with_a_size_beta_tells_optuna_its_loss_credited_for_size(db):
    """Optuna, the front and the progress line rank the size-adjusted loss; the row and Optuna's
    `proxy_loss` attribute keep the proxy loss as measured."""
    spec = tiny_spec(objectives="size_beta = 0.5", search="trials = 4\nprune = false")
    summary = run_search(spec, db, SearchOptions(study="s", trials=4, sampler="random"), evaluate_fn=instant)
    records = {r.number: r for r in db.trials("s")}
    study = optuna.load_study(study_name="s", storage=db.url)
    told = {}
    for t in study.trials:
        record = records[t.number]
        if record.status != "complete":
            continue
        cfg = record.config
        assert record["loss"] == pytest.approx(1.0 + cfg.d_model / 1000 + cfg.n_layers / 100)  # `_result`
        assert t.user_attrs["proxy_loss"] == record["loss"]
        told[t.number] = t.values[0]
        assert told[t.number] == pytest.approx(record["loss"] - 0.5 * math.log(record["params_total"] / 1e6))
    assert len(told) >= 2
    front = summary.front
    assert front.size_beta == 0.5 and {t.number for t in study.best_trials} == set(front.front.numbers)
    assert dict(zip(front.trial_numbers, front.trial_values[:, 0], strict=True)) == pytest.approx(told)


def _falling(request, known=None, board=None):
    """`_result`'s loss at the end of a curve whose last interval fell by d_model / 2000."""
    out = _result(request)
    loss, fall = out.train["val_loss"], request.config.d_model / 2000
    return replace(out, train={**out.train, "val_curve": [[1, loss + 3 * fall], [2, loss + fall], [3, loss]]})


def test_a_study_with_extrapolate_tells_optuna_its_loss_carried_on_by_the_last_change(db):
    """What Optuna is told, the stored change and the summary's front agree, and a resumed run
    (its values read back from the rows) tells the same."""
    spec = tiny_spec(objectives="size_beta = 0.5\nextrapolate = 2.0", search="trials = 4\nprune = false")
    summary = run_search(spec, db, SearchOptions(study="s", trials=3, sampler="random"), evaluate_fn=_falling)
    records = {r.number: r for r in db.trials("s")}
    told = {}
    for t in optuna.load_study(study_name="s", storage=db.url).trials:
        record = records[t.number]
        if record.status != "complete":
            continue
        fall = record.config.d_model / 2000
        assert record["loss_change"] == pytest.approx(-fall)
        expected = record["loss"] - 2.0 * fall - 0.5 * math.log(record["params_total"] / 1e6)
        assert t.values[0] == pytest.approx(expected) and t.user_attrs["proxy_loss"] == record["loss"]
        assert objective_values(spec, record, record.config) == pytest.approx(t.values)  # from the row
        told[t.number] = t.values[0]
    assert len(told) >= 2
    front = summary.front
    assert front.loss_rule == spec.loss_rule
    assert dict(zip(front.trial_numbers, front.trial_values[:, 0], strict=True)) == pytest.approx(told)


def test_snapshots_carry_the_finished_trials_wall_times_for_the_eta(db):
    seen = []
    options = SearchOptions(study="s", trials=3, workers=2, sampler="random")
    run_search(tiny_spec(model=CONTINUOUS), db, options, on_update=seen.append, evaluate_fn=instant)
    assert seen[0].wall_times_s == () and seen[0].eta_s is None  # nothing finished yet
    assert {p.workers for p in seen} == {2}
    assert [len(p.wall_times_s) for p in seen] == [p.finished for p in seen]
    assert seen[-1].eta_s == 0.0 and all(w >= 0 for w in seen[-1].wall_times_s)
    # A resume estimates from the trials earlier runs finished, before its own first one ends.
    resumed = []
    options = SearchOptions(study="s", trials=5, workers=2, sampler="random", resume=True)
    run_search(tiny_spec(model=CONTINUOUS), db, options, on_update=resumed.append, evaluate_fn=instant)
    assert resumed[0].wall_times_s == tuple(db.wall_times("s")[:3]) and resumed[0].eta_s is not None
    assert len(resumed[-1].wall_times_s) == 5 == resumed[-1].finished


def test_progress_is_shown_once_a_finished_trials_slot_is_refilled(db):
    """Each display after a result counts the trial started in its place: with 2 workers, 2 run
    until fewer than 2 are left to start (it read "1 running" for most of a 2-worker search)."""
    seen = []
    options = SearchOptions(study="s", trials=6, workers=2, sampler="random")
    run_search(tiny_spec(model=CONTINUOUS), db, options, on_update=seen.append, evaluate_fn=instant)
    shown = [(p.finished, p.counts["running"]) for p in seen]
    assert shown[-1] == (6, 0)
    assert all(running == min(2, 6 - finished) for finished, running in shown[:-1]), shown


@pytest.mark.parametrize("signal_error", [KeyboardInterrupt, Terminated])
def test_a_signal_before_the_first_trial_leaves_no_empty_study(db, monkeypatch, signal_error):
    """SIGINT or SIGTERM after the study row was written but before the run's own signal
    handlers (while the pool is armed, stopped drivers' trials swept) left an empty study that a
    plain rerun refused as existing."""

    def signalled(self):
        raise signal_error()

    monkeypatch.setattr(driver_module._Driver, "sweep", signalled)
    with pytest.raises(signal_error):
        run_search(tiny_spec(), db, SearchOptions(study="s", trials=2), evaluate_fn=instant)
    assert "s" not in db.study_names()
    monkeypatch.undo()
    run_search(tiny_spec(), db, SearchOptions(study="s", trials=2), evaluate_fn=instant)  # no --resume
    assert db.counts("s")["complete"] == 2


def _broken_install(request, known=None, board=None):
    raise ImportError("libtorch_cpu.so: cannot open shared object file")


@pytest.mark.usefixtures("ray_session")
def test_a_search_whose_trials_all_fail_the_same_way_stops_and_re_queues_them(tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    with Storage.open(url) as db, pytest.raises(SetupFailureError) as info:
        run_search(tiny_spec(), db, SearchOptions(study="s", trials=5), evaluate_fn=_broken_install)
    assert str(info.value).startswith(
        "the first 3 trials of this run all failed with the same error in the evaluation: ImportError: "
        "libtorch_cpu.so: cannot open shared object file (trials 0, 1, 2, re-queued): fix the setup"
    )
    with Storage.open(url) as db:
        failed = db.trials("s")
        assert [r.status for r in failed] == ["interrupted"] * 3  # not counted: the setup's fault
        run_search(tiny_spec(), db, SearchOptions(study="s", trials=5, resume=True), evaluate_fn=instant)
        counts = db.counts("s")
        assert counts["complete"] == 5 and set(counts) <= {"complete", "interrupted", "duplicate"}, counts
        rerun = [r.params for r in db.trials("s")[3:6]]
        assert rerun == [r.params for r in failed]  # the re-queued points ran first
    assert "RUNNING" not in {t.state.name for t in optuna.load_study(study_name="s", storage=url).trials}
