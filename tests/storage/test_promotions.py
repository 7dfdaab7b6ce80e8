"""Promotions on both backends: the unique (trial, budget) row is the claim, finished in place."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, text

from archsearch.space import preset
from archsearch.storage import SCHEMA_VERSION, Storage, StorageError
from archsearch.storage.promotions import CLAIMED
from archsearch.trial import TrialOutcome
from tests.helpers import table_without

CFG = preset("byte-1m")
SPEC = dict(spec_fingerprint="f" * 64, spec_source="[model]\n", spec={"a": 1}, objectives=("loss", "flops"))


def _trial(db: Storage, number: int) -> int:
    slot = db.claim_trial("s", 100, lease_s=60)
    db.assign_trial(slot, number=number, optuna_trial_id=number + 1, params={}, config=CFG)
    db.finish_trial(slot, TrialOutcome(status="complete", train={"val_loss": 2.0, "tokens": 1000}))
    return slot


@pytest.fixture
def storage(backend_url):
    with Storage.open(backend_url) as st:
        st.create_study("s", **SPEC)
        yield st


def test_a_promotion_is_claimed_once_finished_in_place_and_listed(storage):
    first, second = _trial(storage, 0), _trial(storage, 1)
    assert storage.claim_promotion("s", first, 2000, lease_s=60) is None
    assert storage.claim_promotion("s", first, 2000, lease_s=60) is None  # its own claim, again
    assert storage.claim_promotion("s", first, 4000, lease_s=60) is None  # another budget: another row
    row = storage.promotion_id(first, 2000)
    storage.finish_promotion(
        row,
        status="complete",
        val_loss=1.5,
        objective=1.25,
        val_curve=[(1000, 2.0), (2000, 1.5)],
        wall_time_s=3.0,
        resumed_tokens=1000,
    )
    storage.finish_promotion(storage.promotion_id(first, 4000), status="failed", reason="non-finite loss")
    assert storage.claim_promotion("s", first, 2000, lease_s=60) == "complete"  # never trained twice
    assert storage.claim_promotion("s", first, 4000, lease_s=60) == "failed"
    assert storage.claim_promotion("s", second, 2000, lease_s=60) is None
    listed = storage.promotions("s")
    assert [(p.trial_number, p.budget_tokens, p.status) for p in listed] == [
        (0, 2000, "complete"), (0, 4000, "failed"), (1, 2000, "running"),
    ]  # fmt: skip
    done = listed[0]
    assert (done.trial_id, done.val_loss, done.objective, done.wall_time_s) == (first, 1.5, 1.25, 3.0)
    assert done.val_curve == ((1000, 2.0), (2000, 1.5)) and done.host == storage.host
    assert done.lease_expires_at is None and done.finished_at >= done.claimed_at
    assert listed[1].reason == "non-finite loss" and listed[1].val_loss is None
    assert (done.resumed_tokens, listed[1].resumed_tokens) == (1000, None)  # None: not known
    assert [p.trial_number for p in storage.promotions("s", status="running")] == [1]
    assert storage.promotions("other") == []


def test_another_drivers_claim_holds_until_its_lease_lapses_or_is_released(storage, backend_url, monkeypatch):
    trial = _trial(storage, 0)
    clock = [time.time()]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    with Storage.open(backend_url) as other:
        other.host = "elsewhere:1"
        assert other.claim_promotion("s", trial, 2000, lease_s=60) is None
        assert storage.claim_promotion("s", trial, 2000, lease_s=60) == CLAIMED
        clock[0] += 59
        other.renew_promotions(60)
        clock[0] += 59  # renewed: still held
        assert storage.claim_promotion("s", trial, 2000, lease_s=60) == CLAIMED
        clock[0] += 2  # lapsed (a killed driver): taken over
        assert storage.claim_promotion("s", trial, 2000, lease_s=60) is None
        assert other.claim_promotion("s", trial, 2000, lease_s=60) == CLAIMED
        # A driver stopped mid-promotion releases its claims: taken at once, not after the lease.
        assert storage.release_promotions() == 1
        assert other.claim_promotion("s", trial, 2000, lease_s=60) is None
        assert storage.promotions("s")[0].host == "elsewhere:1"


def test_bad_claims_and_results_are_refused(storage):
    trial = _trial(storage, 0)
    with pytest.raises(StorageError, match="no trial row 999"):
        storage.claim_promotion("s", 999, 2000, lease_s=60)
    storage.claim_promotion("s", trial, 2000, lease_s=60)
    row = storage.promotion_id(trial, 2000)
    with pytest.raises(ValueError, match="unknown trial state 'pruned'"):
        storage.finish_promotion(row, status="pruned")
    with pytest.raises(ValueError, match="needs its val_loss and objective"):
        storage.finish_promotion(row, status="complete", val_loss=1.0)
    with pytest.raises(StorageError, match="no promotion row 999"):
        storage.finish_promotion(999, status="failed")


def _as_version(url: str, version: int, statement: str) -> None:
    """Make the database at `url` look as schema `version` left it: `statement`, then the version."""
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(statement))
        conn.execute(text(f"UPDATE archsearch_meta SET value = '{version}'"))
    engine.dispose()


def test_a_version_8_database_gains_the_promotions_table(backend_url):
    with Storage.open(backend_url) as st:
        st.create_study("s", **SPEC)
        trial = _trial(st, 0)
    _as_version(backend_url, 8, "DROP TABLE archsearch_promotions")
    with Storage.open(backend_url) as st:
        assert st.claim_promotion("s", trial, 2000, lease_s=60) is None
        assert len(st.promotions("s")) == 1
    engine = create_engine(backend_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT value FROM archsearch_meta")).scalar_one() == str(SCHEMA_VERSION)
    engine.dispose()


def test_a_version_9_database_gains_the_resumed_tokens_column_and_reads_it_as_unknown(backend_url):
    with Storage.open(backend_url) as st:
        st.create_study("s", **SPEC)
        trial = _trial(st, 0)
        st.claim_promotion("s", trial, 2000, lease_s=60)
    _as_version(backend_url, 9, "ALTER TABLE archsearch_promotions DROP COLUMN resumed_tokens")
    with Storage.open(backend_url) as st:
        [before] = st.promotions("s")
        assert before.resumed_tokens is None
        st.finish_promotion(before.id, status="complete", val_loss=1.0, objective=1.0, resumed_tokens=0)
        assert st.promotions("s")[0].resumed_tokens == 0
    engine = create_engine(backend_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT value FROM archsearch_meta")).scalar_one() == str(SCHEMA_VERSION)
    engine.dispose()


def test_trials_are_ranked_at_the_largest_budget_every_contender_completed(storage):
    first, second, third = _trial(storage, 0), _trial(storage, 1), _trial(storage, 2)
    for trial, budget, status, objective in [
        (first, 2000, "complete", 1.7), (second, 2000, "complete", 1.6),
        (first, 4000, "complete", 1.5), (second, 4000, "failed", None),
    ]:  # fmt: skip
        storage.claim_promotion("s", trial, budget, lease_s=60)
        row = storage.promotion_id(trial, budget)
        if status == "complete":
            storage.finish_promotion(row, status=status, val_loss=objective, objective=objective)
        else:
            storage.finish_promotion(row, status=status, reason="out of memory")
    # Trial 1 never completed 4000 tokens: both contenders are ranked at 2000; trial 2, not
    # promoted, is estimated there: its proxy's 2.0 plus the contenders' median change, -0.35.
    ranked = storage.ranked_objectives("s")
    assert ranked == {0: (1.7, 2000, False), 1: (1.6, 2000, False), 2: (pytest.approx(1.65), 2000, True)}
    assert third  # not promoted
    ranking = storage.promotion_ranking("s")  # what the front, export and report rank by
    assert (ranking.contenders, ranking.budget, ranking.proxy_tokens) == ((0, 1), 2000, None)
    assert {n: p.objective for n, p in ranking.ranked.items()} == {0: 1.7, 1: 1.6}


def test_a_study_without_promotions_is_ranked_at_its_proxy(storage):
    _trial(storage, 0)
    assert storage.ranked_objectives("s") == {0: (2.0, 1000, False)}
    assert storage.promotion_ranking("s") is None


SEEDED = dict(SPEC, spec={"proxy": {"tokens": 1000, "seed": 3}})  # trials trained 1,000 tokens at seed 3


def _seeded_trial(db: Storage, number: int, loss: float) -> int:
    slot = db.claim_trial("t", 100, lease_s=60)
    db.assign_trial(slot, number=number, optuna_trial_id=100 + number, params={}, config=CFG)
    db.finish_trial(slot, TrialOutcome(status="complete", train={"val_loss": loss, "tokens": 1000}))
    return slot


def _finish(db: Storage, trial: int, budget: int, seed: int, loss: float, stall_check: bool = False) -> None:
    assert db.claim_promotion("t", trial, budget, lease_s=60, seed=seed, stall_check=stall_check) is None
    curve = [(budget // 2, loss + 0.2), (budget, loss)]
    row = db.promotion_id(trial, budget, seed)
    db.finish_promotion(row, status="complete", val_loss=loss, objective=loss, val_curve=curve)


def test_a_promotion_is_one_row_per_seed_and_defaults_to_the_studys_proxy_seed(storage):
    storage.create_study("t", **SEEDED)
    trial = _seeded_trial(storage, 0, 2.0)
    assert storage.claim_promotion("t", trial, 2000, lease_s=60) is None  # the study's seed, 3
    assert storage.claim_promotion("t", trial, 2000, lease_s=60, seed=4) is None  # another seed: another row
    assert storage.promotion_id(trial, 2000) == storage.promotion_id(trial, 2000, 3) is not None
    assert storage.promotion_id(trial, 2000, 4) not in (None, storage.promotion_id(trial, 2000))
    assert storage.promotion_id(trial, 2000, 5) is None
    storage.finish_promotion(storage.promotion_id(trial, 2000, 4), status="failed", reason="oom")
    assert storage.claim_promotion("t", trial, 2000, lease_s=60, seed=4) == "failed"  # never trained twice
    assert [(p.budget_tokens, p.seed, p.status) for p in storage.promotions("t")] == [
        (2000, 3, "running"), (2000, 4, "failed"),
    ]  # fmt: skip
    # A study of no stated seed trained at TrainSettings' default, 0.
    first = _trial(storage, 0)
    storage.claim_promotion("s", first, 2000, lease_s=60)
    assert [p.seed for p in storage.promotions("s")] == [0]


def test_seed_repeats_rank_each_contender_by_its_mean_with_the_first_pass_as_its_first_seed(storage):
    storage.create_study("t", **SEEDED)
    a, b, _ = _seeded_trial(storage, 0, 2.0), _seeded_trial(storage, 1, 2.2), _seeded_trial(storage, 2, 2.4)
    # Seed repeats at the proxy's 1,000 tokens (seeds 4 and 5), then 2,000 tokens at all three,
    # where trial 1 lacks seed 5: the contenders are ranked at 1,000 tokens, each by its mean.
    for trial, losses in ((a, (2.3, 2.3)), (b, (2.0, 2.0))):
        for seed, loss in zip((4, 5), losses, strict=True):
            _finish(storage, trial, 1000, seed, loss)
    for trial, seeds in ((a, (3, 4, 5)), (b, (3, 4))):
        for seed in seeds:
            _finish(storage, trial, 2000, seed, 1.5)
    ranking = storage.promotion_ranking("t")
    assert (ranking.contenders, ranking.budget, ranking.proxy_tokens, ranking.seeds) == (
        (0, 1),
        1000,
        1000,
        3,
    )
    mean_a, mean_b = (2.0 + 2.3 + 2.3) / 3, (2.2 + 2.0 + 2.0) / 3
    assert {n: m.objective for n, m in ranking.ranked.items()} == {
        0: pytest.approx(mean_a),
        1: pytest.approx(mean_b),
    }
    seeded = ranking.ranked[0]
    assert (seeded.seeds, seeded.val_loss, [p.seed for p in seeded.runs]) == (
        (3, 4, 5),
        seeded.objective,
        [4, 5],
    )
    # The first pass's curve change is 0 (none stored), each repeat's -0.2: the mean of the three.
    assert seeded.loss_change == pytest.approx(-0.4 / 3)
    # Trial 2, not promoted, is placed by the contenders' median change, (0.2 + -0.133) / 2.
    ranked = storage.ranked_objectives("t")
    shift = ((mean_a - 2.0) + (mean_b - 2.2)) / 2
    assert ranked == {
        0: (pytest.approx(mean_a), 1000, False), 1: (pytest.approx(mean_b), 1000, False),
        2: (pytest.approx(2.4 + shift), 1000, True),
    }  # fmt: skip
    # Once trial 1 completes seed 5 at 2,000 tokens, both are ranked there, by their means.
    _finish(storage, b, 2000, 5, 1.2)
    ranking = storage.promotion_ranking("t")
    assert ranking.budget == 2000 and ranking.ranked[1].objective == pytest.approx((1.5 + 1.5 + 1.2) / 3)
    assert storage.seed_means("t", 2000, (3,)).keys() == {0, 1}  # one seed: each its own promotion
    assert storage.seed_means("t", 2000, (3,))[1].objective == 1.5
    assert storage.seed_means("t", 1000, (3,)).keys() == {0, 1, 2}  # the first passes, at their budget


def test_a_stall_checked_trial_ranks_by_its_mean_over_seeds_and_climbs_shifted_by_it(storage):
    storage.create_study("t", **SEEDED)
    a, b, c = _seeded_trial(storage, 0, 2.0), _seeded_trial(storage, 1, 2.2), _seeded_trial(storage, 2, 2.4)
    # Trial 0 trained at its seed only on its stall retry (2.0); checked at seeds 4 and 5 it
    # stalls at both (3.1), and no longer contends. Trial 2's checks train (2.1, 2.1): it climbs.
    for trial, loss in ((a, 3.1), (c, 2.1)):
        for seed in (4, 5):
            _finish(storage, trial, 1000, seed, loss, stall_check=True)
    _finish(storage, b, 2000, 3, 1.8)
    _finish(storage, c, 2000, 3, 1.9)
    mean_a, mean_c = (2.0 + 3.1 + 3.1) / 3, (2.4 + 2.1 + 2.1) / 3
    first = storage.first_passes("t")
    assert {n: f.objective for n, f in first.items()} == {
        0: pytest.approx(mean_a), 1: 2.2, 2: pytest.approx(mean_c)
    }  # fmt: skip
    assert first[0].change == pytest.approx(-0.4 / 3)  # the checks' curves fall 0.2 at the end
    ranking = storage.promotion_ranking("t")
    assert (ranking.contenders, ranking.budget, ranking.seeds) == ((1, 2), 2000, 1)  # checks: no seeds
    assert {n: m.seeds for n, m in ranking.checked.items()} == {0: (3, 4, 5), 2: (3, 4, 5)}
    # Trial 2 climbed at its own seed, 0.1 above its mean at the proxy's budget: its 1.9 counts as 1.8.
    assert ranking.ranked[2].objective == pytest.approx(1.9 + mean_c - 2.4)
    assert ranking.ranked[2].loss_change == pytest.approx(-0.2 + (-0.4 / 3))
    assert storage.seed_means("t", 2000)[2].objective == pytest.approx(1.9 + mean_c - 2.4)
    # Trial 0 is placed from its mean by the contenders' median change (-0.4 and -0.3).
    shift = ((1.8 - 2.2) + (1.9 - 2.4)) / 2
    assert storage.ranked_objectives("t") == {
        0: (pytest.approx(mean_a + shift), 2000, True), 1: (1.8, 2000, False),
        2: (pytest.approx(1.9 + mean_c - 2.4), 2000, False),
    }  # fmt: skip
    assert [p.stall_check for p in storage.promotions("t")] == [True, True, False, True, True, False]


def test_a_version_11_database_gains_the_stall_check_column_and_reads_it_as_no_check(backend_url):
    with Storage.open(backend_url) as st:
        st.create_study("t", **SEEDED)
        trial = _seeded_trial(st, 0, 2.0)
        _finish(st, trial, 2000, 3, 1.5)
    _as_version(backend_url, 11, "ALTER TABLE archsearch_promotions DROP COLUMN stall_check")
    with Storage.open(backend_url) as st:
        assert [p.stall_check for p in st.promotions("t")] == [False]
        assert st.promotion_ranking("t").budget == 2000
    engine = create_engine(backend_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT value FROM archsearch_meta")).scalar_one() == str(SCHEMA_VERSION)
    engine.dispose()


def test_a_version_10_database_gives_its_promotions_their_studys_proxy_seed(backend_url):
    with Storage.open(backend_url) as st:
        st.create_study("t", **SEEDED)
        st.create_study("s", **SPEC)
        trial, other = _seeded_trial(st, 0, 2.0), _trial(st, 0)
    engine = create_engine(backend_url)
    with engine.begin() as conn:  # what version 10 wrote: no seed, a key of (trial, budget)
        conn.execute(text("DROP TABLE archsearch_promotions"))
        v10 = _v10_promotions_table()
        v10.create(conn)
        for study, trial_id, budget, status in (("t", trial, 2000, "complete"), ("t", trial, 4000, "running"),
                                                ("s", other, 2000, "complete")):  # fmt: skip
            conn.execute(v10.insert().values(
                study=study, trial_id=trial_id, trial_number=0, budget_tokens=budget, status=status,
                val_loss=1.5 if status == "complete" else None,
                objective=1.5 if status == "complete" else None,
                val_curve_json="[]", host="h:1", claimed_at=0.0, resumed_tokens=1000,
            ))  # fmt: skip
        conn.execute(text("UPDATE archsearch_meta SET value = '10'"))
    engine.dispose()
    with Storage.open(backend_url) as st:
        kept = st.promotions("t")
        assert [(p.budget_tokens, p.seed, p.status, p.val_loss, p.resumed_tokens) for p in kept] == [
            (2000, 3, "complete", 1.5, 1000), (4000, 3, "running", None, 1000),
        ]  # fmt: skip
        assert [p.seed for p in st.promotions("s")] == [0]  # a study whose spec names no seed: 0
        assert st.promotion_ranking("t").budget == 2000
        assert st.claim_promotion("t", trial, 2000, lease_s=60) == "complete"  # the same run: not again
        assert st.claim_promotion("t", trial, 2000, lease_s=60, seed=4) is None  # a seed repeat: new
        # Claimed at a second seed, the contender is ranked once it completes both.
        assert st.promotion_ranking("t").budget is None
    engine = create_engine(backend_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT value FROM archsearch_meta")).scalar_one() == str(SCHEMA_VERSION)
    engine.dispose()


def _v10_promotions_table():
    """archsearch_promotions as schema version 10 made it: no seed, a key of (trial, budget)."""
    from archsearch.storage.schema import Promotion

    return table_without(Promotion.__table__, "seed", "trial_id", "budget_tokens")
