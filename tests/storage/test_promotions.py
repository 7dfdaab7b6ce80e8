"""Promotions on both backends: the unique (trial, budget) row is the claim, finished in place."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, text

from archsearch.space import preset
from archsearch.storage import SCHEMA_VERSION, Storage, StorageError
from archsearch.storage.promotions import CLAIMED
from archsearch.trial import TrialOutcome

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
