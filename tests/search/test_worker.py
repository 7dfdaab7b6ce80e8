"""The Ray task body, called in process: train, judge at the rungs, profile, return plain data."""

from __future__ import annotations

import json
import math

import pytest
import torch

from archsearch.evaluators import profiler
from archsearch.evaluators.settings import TrainError, usable_cores
from archsearch.search import worker
from archsearch.search.worker import TrialRequest, run_trial, trial_cores
from archsearch.space.costs import param_counts
from archsearch.space.knobs import config_from_knobs

CFG = config_from_knobs(d_model=64, n_layers=1, head_dim=32, vocab_size=256, seq_len=32)

# Modelled profiles only, for the tests whose assertions are not about the local one: timing the
# local kernels is about a fifth of a tiny trial's time.
NO_LOCAL = dict(local=False, devices=["h100-sxm"], batch=None, dtype="bf16", min_run_time=0.002)


def _plain(**overrides):
    request = dict(
        number=3,
        config=CFG.to_dict(),
        proxy=dict(tokens=4096, batch_size=4, evals=4, eval_batches=1, device="cpu"),
        data=None,
        profile=dict(local=True, devices=["h100-sxm"], batch=None, dtype="bf16", min_run_time=0.002),
        step_time_device="h100-sxm",
        rungs=[0.25, 0.5],
    )
    return {**request, **overrides}


def _request(**overrides):
    return TrialRequest.from_dict(_plain(**overrides))


def test_a_request_is_plain_data_both_ways():
    request = _request()
    assert TrialRequest.from_dict(json.loads(json.dumps(request.to_dict()))) == request
    with pytest.raises(TrainError):
        _request(proxy=dict(tokens=-1))  # settings are validated as the request is built


def test_a_complete_trial_returns_plain_results_profiles_and_new_kernel_times():
    out = run_trial(_request())
    json.dumps(out.to_dict())  # plain data only: it crosses process boundaries
    assert out.status == "complete" and out.train["tokens"] >= 4096
    assert {p["device"]: p["modelled"] for p in out.profiles} == {"local": False, "h100-sxm": True}
    assert out.step_time_device == "h100-sxm" and out.step_time_s > 0
    assert out.measurements and out.device["fingerprint"]
    known = {m["key"]: m["seconds"] for m in out.measurements}
    again = run_trial(_request(), known)
    assert again.measurements == ()  # every kernel came from the known times


def test_the_cores_of_a_trial_are_the_whole_cpus_ray_gave_it():
    assert trial_cores(None) is None  # not from a search: the trainer's own choice
    assert trial_cores(0.5) == trial_cores(1.0) == 1
    assert trial_cores(1.9) == min(1, usable_cores())
    assert trial_cores(1e6) == usable_cores()


def test_a_cpu_trial_trains_and_profiles_on_its_threads_and_restores_the_count(two_threads):
    out = run_trial(_request(cpus=1.0))
    assert out.status == "complete"
    assert out.train["threads"] == 1 and out.device["threads"] == 1  # capped by its one CPU
    assert torch.get_num_threads() == 2
    profile = dict(local=False, devices=["h100-sxm"], batch=None, dtype="bf16", min_run_time=0.002)
    proxy = {**_plain()["proxy"], "threads": 2}  # a space file's [proxy] threads, as given
    out = run_trial(_request(proxy=proxy, profile=profile, rungs=[], cpus=1.0))
    assert out.train["threads"] == 2 and out.device["threads"] == 2
    assert torch.get_num_threads() == 2


def test_the_judge_is_asked_once_per_rung_and_can_prune():
    asked = []

    def judge(number, rung, loss, flops):
        asked.append((number, rung))
        return "dominated at rung 0.5" if rung == 1 else None

    out = run_trial(_request(), judge=judge)
    assert asked == [(3, 0), (3, 1)]
    assert (out.status, out.pruned_rung, out.reason) == ("pruned", 0.5, "dominated at rung 0.5")
    assert out.profiles == ()  # no profiling spent on a pruned shape
    assert out.train["tokens"] < 4096


def test_with_a_loss_rule_the_judge_sees_the_loss_objective_not_the_raw_loss():
    judged, plain = [], []
    # One thread, declared: a count chosen from the free cores could differ between the two runs
    # (a busy machine), and another reduction order is another loss.
    proxy = {**_plain()["proxy"], "threads": 1}
    rule = {"size_beta": 0.3, "extrapolate": 2.0}
    # The judge's losses come before any profiling: no local one.
    loss_rule = _request(loss_rule=rule, proxy=proxy, profile=NO_LOCAL)
    run_trial(loss_rule, judge=lambda n, r, loss, f: judged.append(loss))
    out = run_trial(_request(proxy=proxy, profile=NO_LOCAL), judge=lambda n, r, loss, f: plain.append(loss))
    credit = 0.3 * math.log(param_counts(CFG).total / 1e6)
    # The curve so far ends at the rung: no change at the first evaluation, the last interval's
    # at the second.
    first, second = plain
    assert judged == pytest.approx([first - credit, second + 2.0 * (second - first) - credit])
    assert [loss for _, loss in out.train["val_curve"][:2]] == pytest.approx(plain)


def test_without_rungs_the_judge_is_never_asked():
    out = run_trial(_request(rungs=[], profile=NO_LOCAL), judge=lambda *a: pytest.fail("asked"))
    assert out.status == "complete"


def test_a_training_failure_comes_back_as_a_failed_result():
    out = run_trial(_request(proxy=dict(tokens=4096, batch_size=4, lr=1e30, precision="fp32", device="cpu")))
    assert out.status == "failed" and "loss" in out.reason.lower()


def test_the_local_step_time_is_the_trainers_measured_step_in_its_precision(monkeypatch):
    monkeypatch.setenv(profiler.CPU_BF16_ENV, "none")  # any host: an AVX2-only CPU
    profile = dict(local=True, devices=["h100-sxm"], batch=None, dtype="auto", min_run_time=0.002)
    out = run_trial(_request(profile=profile, step_time_device="local", rungs=[]))
    assert out.status == "complete", out.reason
    train = out.train
    assert out.step_time_device == "local"
    assert out.step_time_s == train["step_time_s"] > 0
    assert train["step_time_steps"] == train["steps"] - 3
    local = next(p for p in out.profiles if p["device"] == "local")
    assert local["dtype"] == train["precision"] == "fp32"  # profiled as trained: never emulated bf16
    assert local["step_time_s"] == train["step_time_s"]
    report = local["report"]
    parts = report["kernel_time_s"] + report["memory_time_s"] + report["residual_s"]
    assert parts == pytest.approx(report["measured_step_s"], rel=1e-12)
    h100 = next(p for p in out.profiles if p["device"] == "h100-sxm")
    assert h100["dtype"] == "bf16" and h100["report"]["residual_s"] is None  # modelled: no real step
    assert train["mfu"] is None or 0 < train["mfu"] <= 1
    assert any(m["kind"] == "peak" for m in out.measurements)  # the MFU peak goes to the database


def test_a_profile_at_another_batch_times_its_own_real_step():
    profile = dict(local=True, devices=[], batch=2, dtype="fp32", min_run_time=0.002)
    proxy = dict(tokens=4096, batch_size=4, evals=4, eval_batches=1, device="cpu", precision="fp32")
    out = run_trial(_request(profile=profile, proxy=proxy, step_time_device="local", rungs=[]))
    (local,) = out.profiles
    assert local["batch"] == 2 and out.step_time_s == local["step_time_s"]
    assert out.step_time_s != out.train["step_time_s"]  # a batch of 2, not the trainer's 4
    assert local["report"]["measured_steps"] == 10  # trainer.MEASURE_STEPS


def _plateau(monkeypatch, min_steps: int) -> None:
    """Every loss counts as the unigram plateau (token frequencies 'score' 0 nats: no loss is
    below it), and runs of `min_steps` steps by half their budget are long enough to be judged."""
    monkeypatch.setattr(worker, "_unigram_loss", lambda *args: 0.0)
    monkeypatch.setattr(worker, "STALL_MIN_STEPS", min_steps)
    monkeypatch.setattr(worker, "STALL_MIN_TOKENS", 1)


def test_a_run_stalled_at_the_unigram_loss_is_trained_again_with_a_longer_warm_up(
    monkeypatch, training_warmups
):
    _plateau(monkeypatch, min_steps=1)
    asked = []
    rule = {"size_beta": None, "extrapolate": 2.0}
    out = run_trial(_request(profile=NO_LOCAL, loss_rule=rule), judge=lambda *args: asked.append(args))
    assert training_warmups == [0.05, worker.STALL_WARMUP]  # stopped at half its budget, then again
    assert out.status == "complete" and out.train["tokens"] >= 4096  # the retry ran to its end
    assert out.reason.startswith("stalled at the unigram loss (") and "with a 5% warm-up" in out.reason
    assert out.reason.endswith("trained again with a 50% warm-up")
    # Neither run was judged on a loss from the plateau: the first stopped at half its budget
    # (its 25% eval skipped), and the retry is not stall-checked but judged as any run.
    assert [rung for _, rung, _, _ in asked] == [0, 1]
    # The outcome's curve, which the trial's change is taken from, is the retry's whole run, and
    # the rungs were judged on its changes.
    curve = [loss for _, loss in out.train["val_curve"]]
    assert len(curve) == 4 and curve[-1] == out.train["val_loss"]
    told = [loss for *_, loss, _ in asked]
    assert told == pytest.approx([curve[0], curve[1] + 2.0 * (curve[1] - curve[0])])
    assert [p["device"] for p in out.profiles] == ["h100-sxm"]  # profiled as any complete trial


def test_a_run_already_at_the_long_warm_up_or_too_short_to_tell_is_not_retried(monkeypatch, training_warmups):
    _plateau(monkeypatch, min_steps=1)
    proxy = {**_plain()["proxy"], "warmup": worker.STALL_WARMUP}
    out = run_trial(_request(proxy=proxy, profile=NO_LOCAL))
    assert training_warmups == [worker.STALL_WARMUP] and out.status == "complete" and out.reason is None
    # 32 steps in all, 16 by half the budget: fewer than STALL_MIN_STEPS, so short, not stalled.
    _plateau(monkeypatch, min_steps=17)
    training_warmups.clear()
    asked = []
    out = run_trial(_request(profile=NO_LOCAL), judge=lambda *args: asked.append(args))
    assert training_warmups == [0.05] and out.reason is None and len(asked) == 2  # judged as usual


def test_a_run_that_learns_is_never_retried(training_warmups):
    # 131,072 tokens in 256 steps: long enough to be checked at half its budget (65,536 tokens).
    proxy = {**_plain()["proxy"], "tokens": 131_072, "batch_size": 16}
    out = run_trial(_request(proxy=proxy, profile=NO_LOCAL, rungs=[]))
    assert out.status == "complete" and training_warmups == [0.05] and out.reason is None
    assert out.train["val_loss"] < worker._unigram_loss(None, 256, 32) - worker.STALL_MARGIN


def test_studies_of_one_shape_and_seed_sharing_a_cache_keep_their_states_apart():
    # One shape and seed, the settings promotion resumes from, in the run's shared cache: as two
    # searches of one space (or two test processes) with one ARCHSEARCH_CACHE.
    proxy = {**_plain()["proxy"], "tokens": 1024, "evals": 1, "schedule": "constant", "warmup_tokens": 256}
    ask = dict(proxy=proxy, profile=NO_LOCAL, step_time_device=None, rungs=[], keep_state=True)
    # Trial 3 of study "kept-a"; of a study "kept-a" in another database (created at another
    # time); of another study; trial 4 of the first.
    owners = [("kept-a", 1.0, 3), ("kept-a", 2.0, 3), ("kept-b", 1.0, 3), ("kept-a", 1.0, 4)]
    requests = [_request(**ask, study=s, created_at=c, number=n) for s, c, n in owners]
    paths = [worker.kept_state_path(r.study, r.created_at, r.number, CFG, r.proxy, None) for r in requests]
    assert len(set(paths)) == len(owners)
    try:
        assert run_trial(requests[0]).status == "complete" and paths[0].exists()
        kept, stat = paths[0].read_bytes(), paths[0].stat()
        for request, path in zip(requests[1:], paths[1:], strict=True):
            # Each trial starts by deleting the state at its own key, never at another's.
            assert run_trial(request).status == "complete" and path.exists()
            now = paths[0].stat()
            assert paths[0].read_bytes() == kept and (now.st_ino, now.st_mtime_ns) == (
                stat.st_ino,
                stat.st_mtime_ns,
            )
    finally:
        for path in paths:
            path.unlink(missing_ok=True)


def test_a_finished_run_is_judged_stalled_where_a_trial_would_have_stopped(monkeypatch):
    # 4 evaluations, 128 tokens a step, 1,024 tokens by half the budget; the unigram loss is 5.0,
    # so the plateau is from 4.9 up.
    judge = dict(evals=4, unigram_loss=5.0, tokens_per_step=128)
    curve = [(512, 5.2), (1024, 4.5), (1536, 4.95), (2048, 4.92)]
    assert worker.stalled_at(curve, **judge) is None  # too short to tell at the real minimums
    monkeypatch.setattr(worker, "STALL_MIN_STEPS", 8)
    monkeypatch.setattr(worker, "STALL_MIN_TOKENS", 1000)
    # The first evaluation at half the budget or later on the plateau is where it stalled.
    assert worker.stalled_at(curve, **judge) == (1536, 4.95)
    assert worker.stalled_at([(512, 5.2), (1024, 4.5), (1536, 4.5), (2048, 4.9)], **judge) == (2048, 4.9)
    # On the plateau before half the budget only: not stalled.
    assert worker.stalled_at([(512, 5.2), (1024, 4.5), (1536, 4.0), (2048, 3.5)], **judge) is None
