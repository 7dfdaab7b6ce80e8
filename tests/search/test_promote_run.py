"""Promotion in a real search: contenders trained on at longer budgets on the search's Ray pool,
each exactly as one longer run, stored once, and neither lost nor repeated across a Ctrl-C."""

from __future__ import annotations

import dataclasses
import os
import signal
import statistics
import time

import optuna
import pytest

from archsearch.evaluators.trainer import train
from archsearch.search import promote_run, worker
from archsearch.search.driver import SearchOptions, run_search
from archsearch.search.pareto import study_front
from archsearch.search.pool import RayPool
from archsearch.search.validate import long_run
from archsearch.search.worker import kept_state_path, stall_retry, worker_dataset
from archsearch.space.knobs import config_from_knobs
from archsearch.storage import Storage
from tests.specs import tiny_spec

pytestmark = pytest.mark.usefixtures("ray_session")

# The constant schedule with a warm-up in tokens: a promotion resumes its trial's final state.
PROXY = "tokens = 2048\nbatch_size = 4\nevals = 2\neval_batches = 1\ndevice = 'cpu'\nprecision = 'fp32'\n"
FREE = PROXY + "schedule = 'constant'\nwarmup_tokens = 512\nthreads = 1"
SEARCH = "trials = 4\nprune = false\nseed = 3\npromote = {{ cap = {cap}, margin = {margin} }}"


@pytest.fixture
def db(tmp_path):
    with Storage.open(f"sqlite:///{tmp_path / 'trials.db'}") as storage:
        yield storage


@pytest.mark.long
def test_contenders_resume_to_the_loss_of_one_longer_run_and_are_stored_once(db, monkeypatch):
    spec = tiny_spec(proxy=FREE, search=SEARCH.format(cap=4, margin=0.5))
    kept_before: dict[int, bool] = {}  # each contender's first-pass state, there when promotion starts
    promote = promote_run._Promoter._train

    def seeing_kept_states(self, todo, budget, *check):
        for n, seed in todo:  # (trial number, seed): one seed here, the first pass's
            kept_before.setdefault(n, self.kept_state(self.records[n], seed).exists())
        return promote(self, todo, budget, *check)

    monkeypatch.setattr(promote_run._Promoter, "_train", seeing_kept_states)
    summary = run_search(spec, db, SearchOptions(study="s", trials=4, workers=2))
    promotion = summary.promotion
    assert summary.signal is None and promotion is not None and promotion.contenders
    assert promotion.budgets[0] == 4096 and promotion.stopped in ("held", "cap")
    stored = db.promotions("s")
    assert {p.status for p in stored} == {"complete"}
    assert kept_before == dict.fromkeys(promotion.contenders, True)  # resumed, not trained afresh
    # Each went on from its previous run's final state: the proxy's 2,048 tokens, then the rung before.
    assert all(p.resumed_tokens == p.budget_tokens // 2 for p in stored)
    assert (promotion.resumed, promotion.afresh) == (len(stored), 0)
    assert promotion.promotion_tokens == sum(p.budget_tokens // 2 for p in stored)
    assert {(p.trial_number, p.budget_tokens) for p in stored} == {
        (n, b) for n in promotion.contenders for b in promotion.budgets
    }
    first = next(p for p in stored if p.budget_tokens == 4096)
    cfg = db.trials_by_number("s", [first.trial_number])[0].config
    # One uninterrupted run at twice the proxy's tokens, as the worker trains it.
    data = worker_dataset(None, cfg.vocab_size, cfg.seq_len)
    straight = train(cfg, data, dataclasses.replace(spec.proxy, tokens=4096))
    assert first.val_loss == pytest.approx(straight.val_loss, rel=1e-6, abs=0)
    assert first.val_curve[-1][0] == 4096 and first.objective == first.val_loss  # the plain loss objective
    # Promotion ended: the kept states on this machine are gone.
    created = db.require_study("s").created_at
    assert not any(
        kept_state_path("s", created, r.number, r.config, spec.proxy, None).exists()
        for r in db.trials("s", "complete")
    )
    # A resume trains nothing again, and so starts no Ray for it.
    starts: list[bool] = []
    monkeypatch.setattr(RayPool, "start", lambda self: starts.append(True))
    again = run_search(spec, db, SearchOptions(study="s", trials=4, resume=True))
    assert starts == []
    assert again.promotion is not None and again.promotion.contenders == promotion.contenders
    assert db.promotions("s") == stored


def test_a_contender_whose_kept_state_is_gone_trains_from_step_0_and_is_counted_so(db, monkeypatch):
    spec = tiny_spec(proxy=FREE, search=SEARCH.format(cap=2, margin=1.0))
    promote = promote_run._Promoter._train

    def losing_kept_states(self, todo, budget, *check):
        for n, seed in todo:  # as on another machine, or after the cache was cleared
            self.kept_state(self.records[n], seed).unlink(missing_ok=True)
        return promote(self, todo, budget, *check)

    monkeypatch.setattr(promote_run._Promoter, "_train", losing_kept_states)
    promotion = run_search(spec, db, SearchOptions(study="s", trials=3, workers=2)).promotion
    stored = db.promotions("s", "complete")
    assert promotion is not None and stored and {p.resumed_tokens for p in stored} == {0}
    assert (promotion.resumed, promotion.afresh, promotion.unknown) == (0, len(stored), 0)
    assert promotion.promotion_tokens == 4096 * len(stored)  # each its whole budget, not 2,048 more


@pytest.mark.parametrize("seeds", [1, 2], ids=["one-seed", "seed-repeats"])
def test_a_signal_mid_promotion_loses_nothing_and_a_resume_repeats_nothing(db, monkeypatch, seeds):
    search = SEARCH.format(cap=2, margin=1.0).replace("margin = 1.0", f"margin = 1.0, seeds = {seeds}")
    spec = tiny_spec(proxy=FREE, search=search)
    store = promote_run._Promoter._store

    def store_then_interrupt(self, *args):
        store(self, *args)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C once the first promotion is stored

    monkeypatch.setattr(promote_run._Promoter, "_store", store_then_interrupt)
    stopped = run_search(spec, db, SearchOptions(study="s", trials=4, workers=1))
    assert stopped.signal == signal.SIGINT and stopped.promotion.stopped == "interrupted"
    done = [p for p in db.promotions("s") if p.status == "complete"]
    assert len(done) == 1
    # The promotions stopped here were released: a resume takes them at once, not after the lease.
    assert all(p.lease_expires_at <= time.time() for p in db.promotions("s") if p.status == "running")
    monkeypatch.setattr(promote_run._Promoter, "_store", store)
    resumed = run_search(spec, db, SearchOptions(study="s", trials=4, resume=True))
    assert resumed.signal is None and resumed.promotion.stopped in ("held", "cap")
    after = db.promotions("s")
    assert {p.status for p in after} == {"complete"}
    assert (
        {p.trial_number for p in after}
        == set(resumed.promotion.contenders)
        == set(stopped.promotion.contenders)
    )
    kept = next(p for p in after if p.id == done[0].id)
    assert kept == done[0]  # stored once: not trained again
    # Every contender at every seed of every rung, each once: at 2x, and with seed repeats the
    # second seed at the proxy's budget too.
    keys = [(p.trial_number, p.budget_tokens, p.seed) for p in after]
    rungs = [(2048, 1), (4096, 0), (4096, 1)] if seeds == 2 else [(4096, 0)]
    assert sorted(keys) == sorted((n, b, s) for n in resumed.promotion.contenders for b, s in rungs)


def test_the_cli_says_what_was_promoted_and_what_it_cost_and_trials_gives_the_ranked_objectives(tmp_path):
    import json

    from typer.testing import CliRunner

    from archsearch.cli import app
    from tests.specs import tiny_toml

    space = tmp_path / "space.toml"
    space.write_text(tiny_toml(proxy=FREE, search=SEARCH.format(cap=2, margin=1.0)))
    url = f"sqlite:///{tmp_path / 'trials.db'}"
    result = CliRunner().invoke(
        app, ["search", "--space", str(space), "--study", "s", "--trials", "3", "--storage", url]
    )
    assert result.exit_code == 0, result.output
    assert "promoted trials " in result.stderr and " to 4,096 tokens (" in result.stderr
    with Storage.open(url, read_only=True) as db:
        promoted = {p.trial_number: p for p in db.promotions("s")}
        first_pass = [r for r in db.trials("s") if r.status in ("complete", "pruned")]
        optuna_study = optuna.load_study(study_name="s", storage=db.optuna_storage())
        # Optuna's values stay the first pass; each rung is recorded on its study.
        assert {t.number: t.values[0] for t in optuna_study.trials if t.values} == {
            r.number: r["loss"] for r in first_pass
        }
        assert optuna_study.user_attrs == {
            "promoted_loss_4096": {str(n): p.objective for n, p in sorted(promoted.items())}
        }
    # 3 trials of 2,048 tokens; each contender resumed from its kept state, so 2,048 more each.
    n = len(promoted)
    assert (
        f"tokens trained: 6,144 first pass + {n * 2048:,} promotion ({n} resumed, 0 from step 0) = "
        f"{6144 + n * 2048:,}; without promotion 6,144 ({(6144 + n * 2048) / 6144:.2f}x that), "
        f"every trial at 10x 61,440 "
        f"({100 * (6144 + n * 2048) / 61440:.0f}% of that)"
    ) in " ".join(result.stderr.split())
    assert "ranked at 4,096 tokens (2x the proxy) for the" in " ".join(result.stdout.split())
    # The live line (piped: one per finished trial or promotion) counts the promotions with an ETA.
    live = [line for line in result.stderr.splitlines() if "; promotions " in line]
    assert live and live[-1].endswith("ETA 0:00:00") and f"promotions {n}/{n} done, 0 running" in live[-1]
    assert "(rung 1 of at most 1)" in live[-1]
    listed = CliRunner().invoke(app, ["trials", "--study", "s", "--storage", url, "--format", "json"])
    records = {r["number"]: r for r in json.loads(listed.stdout) if r["status"] == "complete"}
    assert promoted and set(promoted) <= set(records)
    for number, record in records.items():
        if number in promoted:  # every contender reached 4,096 tokens: ranked there
            assert (record["objective"], record["budget_tokens"]) == (promoted[number].objective, 4096)
            assert record["estimated"] is False
        else:  # estimated there: its first pass plus the contenders' median change
            assert (record["budget_tokens"], record["estimated"]) == (4096, True)
            shift = statistics.median(promoted[n].objective - records[n]["loss"] for n in promoted)
            assert record["objective"] == pytest.approx(record["loss"] + shift)


SEEDED = PROXY + "seed = 5\nthreads = 1"  # trained afresh at each budget (a warm-up fraction)


@pytest.mark.long
def test_seed_repeats_train_each_contender_at_two_more_seeds_and_rank_by_the_mean(db):
    """cap = 1, seeds = 3: each contender trained again at the proxy's budget at seeds 6 and 7
    (the study's 5 being its first pass), each run the very trial a study at that seed trains, and
    the front ranks the mean of the three."""
    spec = tiny_spec(
        proxy=SEEDED, search="trials = 4\nprune = false\nseed = 3\npromote = { cap = 1, seeds = 3 }"
    )
    promotion = run_search(spec, db, SearchOptions(study="s", trials=4, workers=2)).promotion
    assert promotion is not None and promotion.contenders and promotion.seeds == 3
    assert (promotion.budgets, promotion.ranked_at, promotion.stopped) == ((2048,), 2048, "cap")
    stored = db.promotions("s")
    assert len(stored) == 2 * len(promotion.contenders) and {p.status for p in stored} == {"complete"}
    assert sorted((p.trial_number, p.budget_tokens, p.seed) for p in stored) == sorted(
        (n, 2048, seed) for n in promotion.contenders for seed in (6, 7)
    )
    assert {p.resumed_tokens for p in stored} == {0}  # no kept state: every repeat from step 0
    assert promotion.promotion_tokens == 2048 * len(stored) and promotion.afresh == len(stored)
    # Ranked at the proxy's budget by the mean over seeds 5 (the trial), 6 and 7.
    ranking = db.promotion_ranking("s")
    assert (ranking.budget, ranking.seeds, ranking.contenders) == (2048, 3, promotion.contenders)
    trials = {r.number: r for r in db.trials("s", "complete")}
    ranked = db.ranked_objectives("s")
    for n in promotion.contenders:
        runs = [trials[n]["loss"], *(p.objective for p in stored if p.trial_number == n)]
        assert ranked[n] == (statistics.fmean(runs), 2048, False)
    assert all(ranked[n][1:] == (2048, True) for n in trials if n not in promotion.contenders)
    # A seed repeat is the trial a study at that proxy seed trains: the same shapes (the sampler's
    # seed is the same), seed 6, no promotion.
    at_6 = tiny_spec(
        proxy=SEEDED.replace("seed = 5", "seed = 6"), search="trials = 4\nprune = false\nseed = 3"
    )
    run_search(at_6, db, SearchOptions(study="at6", trials=4, workers=2))
    by_shape = {r.config: r["loss"] for r in db.trials("at6", "complete")}
    repeats = {trials[p.trial_number].config: p.val_loss for p in stored if p.seed == 6}
    assert repeats.keys() <= by_shape.keys()
    for shape, loss in repeats.items():
        assert loss == pytest.approx(by_shape[shape], rel=1e-6, abs=0)


def test_a_seed_repeat_resumes_from_its_own_seeds_state(db, monkeypatch):
    """With kept states, a seed repeat at 2x goes on from its own run at the proxy's budget (seed
    4), the first seed from its trial's (seed 3), never from another seed's."""
    spec = tiny_spec(
        proxy=FREE + "\nseed = 3", search=SEARCH.format(cap=2, margin=1.0).replace("}", ", seeds = 2 }")
    )
    promote = promote_run._Promoter._train
    kept_before: dict[tuple[int, int, int], bool] = {}

    def seeing_kept_states(self, todo, budget, *check):
        for n, seed in todo:
            kept_before[(n, budget, seed)] = self.kept_state(self.records[n], seed).exists()
        return promote(self, todo, budget, *check)

    monkeypatch.setattr(promote_run._Promoter, "_train", seeing_kept_states)
    promotion = run_search(spec, db, SearchOptions(study="s", trials=3, workers=2)).promotion
    assert promotion is not None and promotion.budgets == (2048, 4096)
    stored = db.promotions("s", "complete")
    assert len(stored) == 3 * len(promotion.contenders)
    # Before 1x the second seed has no state; before 2x each seed has its own.
    assert kept_before == {
        **{(n, 2048, 4): False for n in promotion.contenders},
        **{(n, 4096, seed): True for n in promotion.contenders for seed in (3, 4)},
    }
    took_over = {(2048, 4): 0, (4096, 3): 2048, (4096, 4): 2048}
    assert sorted((p.trial_number, p.budget_tokens, p.seed, p.resumed_tokens) for p in stored) == sorted(
        (n, budget, seed, tokens)
        for n in promotion.contenders
        for (budget, seed), tokens in took_over.items()
    )
    # 1x at seed 4 from step 0, then 2,048 more at each seed.
    assert promotion.promotion_tokens == 3 * 2048 * len(promotion.contenders)
    assert promotion.ranked_at == 4096 and db.promotion_ranking("s").seeds == 2


REPEAT_CFG = config_from_knobs(d_model=64, n_layers=1, head_dim=32, vocab_size=256, seq_len=32)


def _repeat_request(monkeypatch, unigram_loss: float) -> tuple[dict, object]:
    """A seed repeat at the proxy's budget (seed 4, a 5% warm-up, so the stall rule applies) as
    promotion asks for it, with token frequencies scoring `unigram_loss` nats and every run long
    enough to be judged; and its settings."""
    monkeypatch.setattr(worker, "_unigram_loss", lambda *args: unigram_loss)
    monkeypatch.setattr(worker, "STALL_MIN_STEPS", 1)
    monkeypatch.setattr(worker, "STALL_MIN_TOKENS", 1)
    settings = tiny_spec(proxy=PROXY + "seed = 4\nthreads = 1").proxy
    request = dict(
        config=REPEAT_CFG.to_dict(), settings=dataclasses.asdict(settings), data=None, cpus=1.0,
        checkpoint=False, stall=True,
    )  # fmt: skip
    return request, settings


def test_a_seed_repeat_that_stalls_is_trained_again_with_the_stall_retrys_warm_up(
    monkeypatch, training_warmups
):
    # Token frequencies "score" 0 nats: every loss sits on the plateau.
    request, settings = _repeat_request(monkeypatch, unigram_loss=0.0)
    out = long_run(request)
    assert training_warmups == [0.05, worker.STALL_WARMUP]  # stalled, then trained again
    assert out["status"] == "complete" and out["tokens"] == 2048
    assert out["reason"].startswith(worker.STALLED + " (") and "with a 5% warm-up" in out["reason"]
    assert out["reason"].endswith("trained again with a 50% warm-up")
    # Its result is the retry's: one run at the stall retry's settings, at the repeat's seed.
    data = worker_dataset(None, REPEAT_CFG.vocab_size, REPEAT_CFG.seq_len)
    retried = train(REPEAT_CFG, data, stall_retry(settings))
    stalled = train(REPEAT_CFG, data, settings)
    assert out["val_loss"] == pytest.approx(retried.val_loss, rel=1e-6, abs=0)
    assert out["val_loss"] != pytest.approx(stalled.val_loss, rel=1e-6, abs=0)
    assert out["val_curve"] == [list(p) for p in retried.val_curve]


def test_a_seed_repeat_that_learns_or_is_not_a_repeat_is_trained_once(monkeypatch, training_warmups):
    # Token frequencies "score" 100 nats: every run has left the plateau.
    request, settings = _repeat_request(monkeypatch, unigram_loss=100.0)
    out = long_run(request)
    assert training_warmups == [0.05] and out["status"] == "complete" and out["reason"] is None
    # On the plateau, but not asked to follow the stall rule (a longer rung, or `validate`).
    monkeypatch.setattr(worker, "_unigram_loss", lambda *args: 0.0)
    training_warmups.clear()
    out = long_run({**request, "stall": False})
    assert training_warmups == [0.05] and out["reason"] is None
    # Already at the retry's warm-up: nothing longer to try, as for a trial.
    training_warmups.clear()
    out = long_run({**request, "settings": dataclasses.asdict(stall_retry(settings))})
    assert training_warmups == [worker.STALL_WARMUP] and out["reason"] is None


# A rate so small that every run sits on the unigram plateau, in runs long enough to be judged
# (51,200 tokens and 50 steps by half the budget): every trial and seed repeat stalls, and is
# trained again; the constant schedule with a warm-up in tokens, so a run that did not stall would
# resume its kept state at 2x. Batches of 32 sequences: the same tokens in half the steps of 16,
# and the steps' fixed cost is most of a one-layer model's.
STALLING = (
    "tokens = 102400\nbatch_size = 32\nevals = 2\neval_batches = 1\ndevice = 'cpu'\nprecision = 'fp32'\n"
    "lr = 1e-6\nschedule = 'constant'\nwarmup_tokens = 512\nthreads = 1\nseed = 3"
)
ONE_LAYER = (
    "vocab_size = 256\nseq_len = 32\nd_model = [64]\naspect_ratio = [64]\n"
    "activation = ['gelu', 'swiglu']\nhead_dim = [32]"
)


@pytest.mark.long
def test_a_seed_repeat_that_stalls_is_retried_and_its_longer_rungs_train_as_the_retry(db):
    """A seed repeat at the proxy's budget stalls as its trial did: it is trained again with the
    stall retry's settings, its row says so and holds the retry's loss, and at 2x it trains with
    those settings afresh, not on from its stalled run's kept state."""
    search = "trials = 2\nprune = false\nseed = 3\npromote = { cap = 2, margin = 1.0, seeds = 2 }"
    spec = tiny_spec(model=ONE_LAYER, proxy=STALLING, search=search)
    promotion = run_search(spec, db, SearchOptions(study="s", trials=2, workers=2)).promotion
    assert promotion is not None and promotion.budgets == (102_400, 204_800)
    assert all(r.reason.startswith(worker.STALLED) for r in db.trials("s", "complete"))
    stored = {(p.trial_number, p.budget_tokens, p.seed): p for p in db.promotions("s")}
    assert sorted(stored) == sorted(
        (n, b, seed) for n in promotion.contenders for b, seed in ((102_400, 4), (204_800, 3), (204_800, 4))
    )
    assert {p.status for p in stored.values()} == {"complete"}
    for n in promotion.contenders:
        repeat, longer = stored[(n, 102_400, 4)], stored[(n, 204_800, 4)]
        assert repeat.reason.startswith(worker.STALLED + " (") and "512-token warm-up" in repeat.reason
        # At 2x, seed 4 trains as its retry did, from step 0 (a warm-up fraction keeps no state).
        assert longer.reason is None and longer.resumed_tokens == 0
    n = promotion.contenders[0]
    cfg = db.trials_by_number("s", [n])[0].config
    data = worker_dataset(None, cfg.vocab_size, cfg.seq_len)
    retry = dataclasses.replace(stall_retry(spec.proxy), seed=4)
    assert stored[(n, 102_400, 4)].val_loss == pytest.approx(
        train(cfg, data, retry).val_loss, rel=1e-6, abs=0
    )
    at_2x = train(cfg, data, dataclasses.replace(retry, tokens=204_800))
    assert stored[(n, 204_800, 4)].val_loss == pytest.approx(at_2x.val_loss, rel=1e-6, abs=0)
    # Promotion ended: the stalled run's kept state is gone too.
    created = db.require_study("s").created_at
    stalled = dataclasses.replace(spec.proxy, seed=4)
    assert not kept_state_path("s", created, n, cfg, stalled, None).exists()


@pytest.mark.long
def test_a_contender_whose_first_pass_stalled_is_checked_at_another_seed_and_ranked_by_its_mean(db):
    """stall_seeds = 1: a contender whose first pass stalled is trained at the next seed at the
    proxy's budget before any rung (a stall check, under the stall rule as a trial: it stalls and
    is retried too), its first pass then the mean over both seeds, and it climbs at its own seed
    from step 0 at the retry's settings, shifted by what its check moved it."""
    search = "trials = 2\nprune = false\nseed = 3\npromote = { cap = 2, margin = 1.0, stall_seeds = 1 }"
    spec = tiny_spec(model=ONE_LAYER, proxy=STALLING, search=search)
    promotion = run_search(spec, db, SearchOptions(study="s", trials=2, workers=2)).promotion
    assert promotion is not None and promotion.budgets == (204_800,)
    assert promotion.checked == promotion.contenders  # every trial stalled, and every one contends
    stored = {(p.trial_number, p.budget_tokens, p.seed): p for p in db.promotions("s")}
    assert sorted(stored) == sorted(
        (n, b, seed) for n in promotion.contenders for b, seed in ((102_400, 4), (204_800, 3))
    )
    for n in promotion.contenders:
        check, longer = stored[(n, 102_400, 4)], stored[(n, 204_800, 3)]
        assert check.stall_check and check.reason.startswith(worker.STALLED) and check.resumed_tokens == 0
        assert not longer.stall_check and longer.resumed_tokens == 0
    ranking = db.promotion_ranking("s")
    assert ranking.checked.keys() == set(promotion.contenders) and ranking.budget == 204_800
    first = {r.number: r["loss"] for r in db.trials("s", "complete")}
    for n in promotion.contenders:
        mean = (first[n] + stored[(n, 102_400, 4)].val_loss) / 2
        assert ranking.checked[n].val_loss == pytest.approx(mean)
        assert ranking.ranked[n].val_loss == pytest.approx(stored[(n, 204_800, 3)].val_loss + mean - first[n])
    said = study_front(db, "s").to_dict()["ranking"]  # `pareto --json`'s entry
    assert said["stall_checked"] == {str(n): [3, 4] for n in promotion.contenders}
    # A resume trains nothing again.
    again = run_search(spec, db, SearchOptions(study="s", trials=2, resume=True))
    assert again.promotion is not None and again.promotion.checked == promotion.checked
    assert {(p.trial_number, p.budget_tokens, p.seed): p for p in db.promotions("s")} == stored
