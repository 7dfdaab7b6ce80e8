"""The storage contract: the same tests on SQLite and PostgreSQL (see conftest.backend_url)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import multiprocessing
import re
import threading
import time
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Table, create_engine, make_url, text
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.space import preset
from archsearch.space.costs import param_counts
from archsearch.storage import (
    SCHEMA_VERSION,
    DeviceRecord,
    KernelCache,
    ReadOnlyStorageError,
    SchemaVersionError,
    Storage,
    StorageError,
    StorageUnavailableError,
    StudyExistsError,
    shape_key,
    storage_url,
)
from archsearch.storage.schema import LadderRung
from archsearch.trial import TrialOutcome
from tests.helpers import one_line, space_file, table_without
from tests.postgres import postgres_database
from tests.readonly import read_only

CFG = preset("byte-1m")
SPEC = dict(spec_fingerprint="f" * 64, spec_source="[model]\n", spec={"a": 1}, objectives=("loss", "flops"))
OUTCOME = TrialOutcome(
    status="complete",
    train={
        "val_loss": 1.5,
        "bits_per_byte": 2.1,
        "tokens": 4096,
        "steps": 2,
        "loss_curve": [[2048, 2.0], [4096, 1.8]],
        "val_curve": [[2048, 1.9], [4096, 1.5]],
    },
    profiles=(
        dict(device="h100-sxm", modelled=True, dtype="bf16", batch=8, step_time_s=1e-3,
             tokens_per_second=1e6, report={"x": 1}),
    ),
    measurements=(dict(key="fp/bf16/gemm/1x2x3", fingerprint="fp", dtype="bf16", kind="gemm", shape="1x2x3",
                       seconds=0.5),),
    device={"fingerprint": "fp", "name": "cpu", "type": "cpu"},
    step_time_s=1e-3,
    step_time_device="h100-sxm",
)  # fmt: skip


@pytest.fixture
def storage(backend_url):
    with Storage.open(backend_url) as st:
        st.create_study("s", **SPEC)
        yield st


def _assigned(storage, number=0, limit=10):
    slot = storage.claim_trial("s", limit, lease_s=60)
    storage.assign_trial(slot, number=number, optuna_trial_id=number + 1, params={"d_model": 128}, config=CFG)
    return slot


def test_a_finished_trial_keeps_shape_costs_results_curves_and_profiles(storage):
    slot = _assigned(storage)
    storage.finish_trial(slot, OUTCOME)
    [record] = storage.trials("s")
    assert (record.number, record.status, record.config, record.params) == (
        0,
        "complete",
        CFG,
        {"d_model": 128},
    )
    assert record["d_model"] == CFG.d_model and record["activation"] == CFG.activation
    assert record["params_total"] > 0 and record["flops_forward_per_token"] > 0
    assert (record["loss"], record["tokens_trained"], record["step_time_device"]) == (1.5, 4096, "h100-sxm")
    assert record["loss_change"] == pytest.approx(-0.4)  # 1.5 - 1.9: the held-out curve's last interval
    assert record["lease_expires_at"] is None and record["finished_at"] is not None
    assert storage.curves(slot) == {"train": [(2048, 2.0), (4096, 1.8)], "val": [(2048, 1.9), (4096, 1.5)]}
    assert storage.profiles(slot)[0].report == {"x": 1}
    assert storage.measurements() == {"fp/bf16/gemm/1x2x3": 0.5}
    assert storage.devices() == [
        DeviceRecord("fp", "cpu", "cpu", {"fingerprint": "fp", "name": "cpu", "type": "cpu"})
    ]


def test_a_failing_write_leaves_the_trial_as_it_was(storage):
    slot = _assigned(storage)
    broken = TrialOutcome(**{**OUTCOME.__dict__, "profiles": ({"device": "x"},)})  # no "modelled" key
    with pytest.raises(KeyError):
        storage.finish_trial(slot, broken)
    [record] = storage.trials("s")
    assert record.status == "running" and record["loss"] is None
    assert storage.curves(slot) == {"train": [], "val": []} and storage.measurements() == {}


def test_claims_stop_at_the_limit_and_rejected_trials_free_their_slot(storage):
    slots = [storage.claim_trial("s", 3, lease_s=60) for _ in range(4)]
    assert slots[3] is None and None not in slots[:3]
    storage.end_trial(slots[0], "rejected", "params above the budget")
    assert storage.claim_trial("s", 3, lease_s=60) is not None
    assert storage.counts("s") == {"running": 3, "rejected": 1}


def test_expired_leases_are_found_and_renewed_ones_are_not(storage):
    old, live = _assigned(storage, 0), _assigned(storage, 1)
    storage.renew_leases([old], lease_s=-1)
    assert [r.id for r in storage.stale_trials("s")] == [old]
    storage.renew_leases([old, live], lease_s=60)
    assert storage.stale_trials("s") == []
    assert [r.id for r in storage.stale_trials("s", now=time.time() + 120)] == [old, live]


def test_a_shape_running_or_trained_is_reported_when_a_trial_takes_it_again(storage):
    # Checked under the study's lock with the write, so two drivers cannot both miss each other.
    first = _assigned(storage, number=0)
    slot = storage.claim_trial("s", 10, lease_s=60)
    args = dict(optuna_trial_id=9, params={"d_model": 128}, config=CFG)
    assert storage.assign_trial(slot, number=1, **args) == 0  # trial 0 is running it
    storage.end_trial(slot, "duplicate", "same shape as trial 0")
    storage.finish_trial(first, OUTCOME)
    slot = storage.claim_trial("s", 10, lease_s=60)
    assert storage.assign_trial(slot, number=2, **args) == 0  # trial 0 trained it
    storage.end_trial(slot, "duplicate", "same shape as trial 0")
    other = dataclasses.replace(CFG, n_layers=CFG.n_layers + 1)
    slot = storage.claim_trial("s", 10, lease_s=60)
    assert storage.assign_trial(slot, number=3, optuna_trial_id=10, params={}, config=other) is None
    storage.end_trial(slot, "failed", "crashed")  # a failed shape may be tried again
    slot = storage.claim_trial("s", 10, lease_s=60)
    assert storage.assign_trial(slot, number=4, optuna_trial_id=11, params={}, config=other) is None
    assert storage.assign_trial(slot, number=4, optuna_trial_id=11, params={}, config=None) is None


def test_retry_notes_and_attempts_accumulate(storage):
    slot = _assigned(storage)
    assert storage.start_attempt(slot, 60) == 1
    assert storage.start_attempt(slot, 60, note="attempt 1: worker died") == 2
    storage.finish_trial(slot, OUTCOME)
    record = storage.trial(slot)
    assert (record.attempts, record.reason) == (2, "attempt 1: worker died")


def test_studies_list_their_trial_counts(storage):
    storage.create_study("t", **SPEC)
    storage.finish_trial(_assigned(storage), OUTCOME)
    counts = {s.name: (s.counts, s.finished, s.objectives) for s in storage.studies()}
    assert counts == {"s": ({"complete": 1}, 1, ("loss", "flops")), "t": ({}, 0, ("loss", "flops"))}
    assert storage.create_study("s", **{**SPEC, "spec_fingerprint": "other"}).spec_fingerprint == "f" * 64
    # One study by name counts its trials when asked; `require_study` (every query's check) does not.
    assert (storage.study("s").counts, storage.study("s", counts=False).counts) == ({"complete": 1}, None)
    lean = storage.require_study("s")
    assert lean.counts is None and storage.require_study("s", counts=True).finished == 1
    with pytest.raises(ValueError, match="without its trial counts"):
        lean.finished  # noqa: B018


def test_wall_times_are_those_of_the_finished_trials(storage):
    ended = [("complete", 100.0, 130.0), ("pruned", 200.0, 205.0), ("failed", 300.0, 301.5)]
    others = [("rejected", 400.0, 400.1), ("duplicate", 500.0, 500.2), ("interrupted", 600.0, 650.0)]
    rows = [
        dict(number=n, status=status, started_at=start, finished_at=end)
        for n, (status, start, end) in enumerate([*ended, *others])
    ]
    storage.add_trials("s", [*rows, dict(number=9, status="running", started_at=700.0)])
    assert storage.wall_times("s") == [30.0, 5.0, 1.5]
    assert storage.wall_times("nothing-here") == []


def test_kernel_cache_reads_known_times_and_writes_new_ones_through(storage):
    class Key:
        fingerprint, dtype, kind, shape = "fp", "bf16", "gemm", (4, 5, 6)

        def to_str(self):
            return "fp/bf16/gemm/4x5x6"

    class Device:
        def to_dict(self):
            return {"fingerprint": "fp", "name": "cpu", "type": "cpu"}

    cache = KernelCache(storage.measurements(), storage)
    assert cache.get(Key()) is None
    cache.put(Key(), 0.25, Device())
    assert cache.get(Key()) == 0.25 and cache.new[0]["shape"] == "4x5x6"
    assert KernelCache(storage.measurements()).get(Key()) == 0.25
    storage.add_measurements([dict(cache.new[0], seconds=9.0)], None)
    assert storage.measurements("fp") == {"fp/bf16/gemm/4x5x6": 0.25}  # the first measurement wins


def test_optuna_shares_the_database(storage, backend_url):
    import optuna

    study = optuna.create_study(study_name="s", storage=storage.optuna_storage(), directions=["minimize"] * 2)
    trial = study.ask({"d_model": optuna.distributions.IntDistribution(64, 256)})
    study.tell(trial, [1.0, 2.0])
    assert len(optuna.load_study(study_name="s", storage=backend_url).trials) == 1


def test_a_schema_version_other_than_the_codes_is_refused(backend_url):
    Storage.open(backend_url).close()
    engine = create_engine(backend_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE archsearch_meta SET value = :v"), {"v": str(SCHEMA_VERSION + 1)})
    engine.dispose()
    with pytest.raises(SchemaVersionError, match=f"version {SCHEMA_VERSION + 1}, written by a newer"):
        Storage.open(backend_url)


def test_reading_a_database_that_is_not_archsearchs_is_an_error(backend_url):
    engine = create_engine(backend_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE other (x INTEGER)"))
    engine.dispose()
    with pytest.raises(StorageError, match="holds no archsearch database"):
        Storage.open(backend_url, create=False)


def _claim_many(url: str, n: int, queue) -> None:
    with Storage.open(url) as st:
        queue.put([st.claim_trial("s", 10, lease_s=60) for _ in range(n)])


def test_concurrent_drivers_never_claim_more_than_the_limit(storage, backend_url):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_claim_many, args=(backend_url, 6, queue)) for _ in range(4)]
    for p in procs:
        p.start()
    claims = [c for _ in procs for c in queue.get(timeout=120)]
    for p in procs:
        p.join(timeout=60)
    assert sum(c is not None for c in claims) == 10 and storage.counts("s") == {"running": 10}


# --- errors that need no server --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("not a url", "not a database URL"),
        ("sqlite://", "in-memory SQLite"),
        ("sqlite:////no/such/folder/x.db", "no folder '/no/such/folder'"),
        ("nosuchdb://x/y", "no driver for nosuchdb"),
        ("postgresql+psycopg://postgres@127.0.0.1:1/x", "cannot reach the database"),
    ],
    ids=["garbage", "memory", "missing-folder", "unknown-dialect", "unreachable"],
)
def test_bad_urls_are_one_line_errors(url, match):
    with pytest.raises(StorageError, match=match) as info:
        Storage.open(url)
    assert "\n" not in str(info.value)


def test_opening_a_missing_sqlite_file_without_create_writes_nothing(tmp_path):
    with pytest.raises(StorageError, match="no database at"):
        Storage.open(f"sqlite:///{tmp_path / 'none.db'}", create=False)
    assert list(tmp_path.iterdir()) == []


def test_the_url_comes_from_the_flag_then_the_environment_then_the_default(monkeypatch):
    monkeypatch.delenv("ARCHSEARCH_STORAGE", raising=False)
    assert storage_url() == "sqlite:///archsearch.db"
    monkeypatch.setenv("ARCHSEARCH_STORAGE", "sqlite:///env.db")
    assert (storage_url(), storage_url("sqlite:///flag.db")) == ("sqlite:///env.db", "sqlite:///flag.db")


def _long_run(storage, trial_number=0, seed=0, loss=1.25, multiplier=10):
    return storage.add_long_run(
        "s",
        trial_number=trial_number,
        multiplier=multiplier,
        seed=seed,
        tokens=40960,
        val_loss=loss,
        val_curve=[[20480, 1.5], [40960, loss]],
        settings={"tokens": 40960, "schedule": "cosine"},
        device_fingerprint="fp",
        corpus_fingerprint="corpus",
        wall_time_s=2.5,
    )


def test_long_runs_are_stored_once_per_trial_multiplier_and_seed(storage):
    assert _long_run(storage, trial_number=3, seed=1)
    assert _long_run(storage, trial_number=3, seed=0)
    assert _long_run(storage, trial_number=3, seed=0, multiplier=5)
    assert not _long_run(storage, trial_number=3, seed=0, loss=9.0)  # the first run wins
    runs = storage.long_runs("s", multiplier=10)
    assert [r.key for r in runs] == [(3, 10.0, 0), (3, 10.0, 1)]
    assert runs[0].val_loss == 1.25 and runs[0].val_curve == ((20480, 1.5), (40960, 1.25))
    assert runs[0].settings == {"tokens": 40960, "schedule": "cosine"}
    assert (runs[0].tokens, runs[0].device_fingerprint, runs[0].corpus_fingerprint) == (40960, "fp", "corpus")
    assert len(storage.long_runs("s")) == 3
    assert storage.long_runs("other") == []


def test_a_long_run_of_an_unknown_study_is_refused(storage):
    with pytest.raises(StorageError, match="database error"):
        storage.add_long_run("nope", trial_number=0, multiplier=10, seed=0, tokens=1, val_loss=1.0)
    assert storage.long_runs("nope") == []


def test_validation_reports_are_kept_in_order(storage):
    first = storage.add_validation("s", multiplier=10, seeds=1, report={"spearman": 0.5})
    storage.add_validation("s", multiplier=5, seeds=2, report={"spearman": 0.25})
    reports = storage.validations("s")
    assert [(r.multiplier, r.seeds, r.report) for r in reports] == [
        (10, 1, {"spearman": 0.5}),
        (5, 2, {"spearman": 0.25}),
    ]
    assert reports[0].id == first


def test_an_older_database_gains_the_new_tables(backend_url):
    with Storage.open(backend_url) as st:
        st.create_study("s", **SPEC)
    engine = create_engine(backend_url)
    with engine.begin() as conn:  # what a version-1 database looked like
        conn.execute(text("DROP TABLE archsearch_long_runs"))
        conn.execute(text("DROP TABLE archsearch_validations"))
        conn.execute(text("DROP TABLE archsearch_search_runs"))
        conn.execute(text("DROP TABLE archsearch_ladder_rungs"))
        conn.execute(text("DROP TABLE archsearch_ladder_fits"))
        conn.execute(text("ALTER TABLE archsearch_trials DROP COLUMN prefill_time_s"))  # version 4's
        conn.execute(text("ALTER TABLE archsearch_trials DROP COLUMN decode_time_s"))
        conn.execute(text("UPDATE archsearch_meta SET value = '1'"))
    engine.dispose()
    with Storage.open(backend_url) as st:
        assert st.study("s") is not None
        assert st.trial_rows("s", ["prefill_time_s", "decode_time_s"]) == []  # the columns are back
        assert _long_run(st)
        assert len(st.long_runs("s")) == 1
        st.add_search_run("s", {"sampler": "tpe"})
        assert [r.settings for r in st.search_runs("s")] == [{"sampler": "tpe"}]
        assert _rung(st) and len(st.ladder_rungs("s")) == 1
    engine = create_engine(backend_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT value FROM archsearch_meta")).scalar_one() == str(SCHEMA_VERSION)
    engine.dispose()


def test_a_version_5_database_gains_loss_change_filled_from_the_stored_curves(backend_url):
    with Storage.open(backend_url) as st:
        st.create_study("s", **SPEC)
        st.finish_trial(_assigned(st, 0), OUTCOME)  # val curve 1.9 -> 1.5
        long_curve = [[1024, 2.6], [2048, 2.2], [3072, 2.0], [4096, 1.95]]
        st.finish_trial(
            _assigned(st, 1),
            TrialOutcome(status="complete", train={"val_loss": 1.95, "val_curve": long_curve}),
        )
        st.finish_trial(
            _assigned(st, 2),
            TrialOutcome(status="complete", train={"val_loss": 2.5, "val_curve": [[64, 2.5]]}),
        )
        no_curve = TrialOutcome(status="complete", train={"val_loss": 2.4})
        st.finish_trial(_assigned(st, 3), no_curve)
    engine = create_engine(backend_url)
    with engine.begin() as conn:  # what version 5 wrote: no loss_change column
        conn.execute(text("ALTER TABLE archsearch_trials DROP COLUMN loss_change"))
        conn.execute(text("UPDATE archsearch_meta SET value = '5'"))
    engine.dispose()
    with pytest.raises(SchemaVersionError, match="version 5, written by an older archsearch"):
        Storage.open(backend_url, read_only=True)  # a reader upgrades nothing
    with Storage.open(backend_url) as st:
        changes = dict(st.trial_rows("s", ["number", "loss_change"]))
        assert changes[0] == pytest.approx(-0.4) and changes[1] == pytest.approx(-0.05)
        assert changes[2] == 0.0  # one point: no interval
        assert changes[3] is None  # no stored curve: read as 0 (objectives.LossRule.value)
    with Storage.open(backend_url, read_only=True) as st:  # now at the code's version
        assert st.trial_rows("s", ["number", "loss_change"])[0] == (0, pytest.approx(-0.4))
    engine = create_engine(backend_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT value FROM archsearch_meta")).scalar_one() == str(SCHEMA_VERSION)
    engine.dispose()


def test_a_non_finite_curve_leaves_a_finite_change_or_none(storage):
    train = {"val_loss": math.nan, "val_curve": [[1, 2.0], [2, 1.8], [3, math.nan], [4, math.inf]]}
    storage.finish_trial(_assigned(storage), TrialOutcome(status="failed", reason="diverged", train=train))
    (record,) = storage.trials("s")
    assert record["loss"] is None and record["loss_change"] == pytest.approx(-0.2)  # the finite points'
    assert storage.curves(record.id)["val"] == [(1, 2.0), (2, 1.8)]


def _rung(storage, trial_number=0, seed=0, loss=2.0, tokens_per_param=20.0, cfg=CFG, batch_size=16):
    return storage.add_ladder_rung(
        "s", trial_number=trial_number, tokens_per_param=tokens_per_param, batch_size=batch_size,
        target_params=1_000_000,
        config=cfg, seed=seed, tokens=20_000_000, val_loss=loss, val_curve=[[10, 2.5], [20, loss]],
        settings={"tokens": 20_000_000}, device_fingerprint="fp", corpus_fingerprint="c", wall_time_s=3.0,
    )  # fmt: skip


def test_ladder_rungs_are_stored_once_per_trial_recipe_shape_and_seed(storage):
    wider = dataclasses.replace(CFG, d_model=CFG.d_model * 2)
    assert _rung(storage, trial_number=2, cfg=wider)
    assert _rung(storage, trial_number=2)
    assert _rung(storage, trial_number=2, seed=1)
    assert _rung(storage, trial_number=2, tokens_per_param=10.0)
    assert _rung(storage, trial_number=2, batch_size=4)  # another recipe: another rung
    assert not _rung(storage, trial_number=2, loss=9.0)  # the first run of that rung wins
    rungs = storage.ladder_rungs("s", tokens_per_param=20, batch_size=16)
    assert [(r.config, r.seed) for r in rungs] == [(CFG, 0), (CFG, 1), (wider, 0)]  # by size, then seed
    assert [r.recipe for r in storage.ladder_rungs("s", batch_size=4)] == [(20.0, 4)]
    first = rungs[0]
    assert first.val_loss == 2.0 and first.val_curve == ((10, 2.5), (20, 2.0))
    assert first.params_total == param_counts(CFG).total
    assert first.params_non_embedding == param_counts(CFG).non_embedding
    assert first.key == (2, 20.0, 16, shape_key(CFG), 0) and first.target_params == 1_000_000
    assert (first.settings, first.wall_time_s) == ({"tokens": 20_000_000}, 3.0)
    assert len(storage.ladder_rungs("s")) == 5 and storage.ladder_rungs("other") == []
    storage.add_ladder_fit("s", tokens_per_param=20, batch_size=4, fit={"alpha": 0.3})
    assert [(f.tokens_per_param, f.batch_size, f.fit) for f in storage.ladder_fits("s")] == [
        (20.0, 4, {"alpha": 0.3})
    ]


def test_a_rung_is_claimed_by_one_ladder_until_stored_released_or_lapsed(storage, backend_url, monkeypatch):
    def claim(owner, trial_number=2, lease_s=600.0, seed=0):
        return storage.claim_ladder_rung(
            "s", trial_number=trial_number, tokens_per_param=20.0, batch_size=16, config=CFG, seed=seed,
            owner=owner, lease_s=lease_s,
        )  # fmt: skip

    assert claim("a") is None and claim("a") is None  # a ladder may claim its own rung again
    assert claim("b") == "claimed" and claim("b", seed=1) is None  # another seed: another rung
    storage.release_ladder_claims("a")
    assert claim("b") is None and claim("a") == "claimed"
    # A claim lapses when its holder stops renewing it (a killed ladder): time moves past the lease.
    clock = [time.time()]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    assert claim("c", trial_number=3, lease_s=60) is None
    clock[0] += 59
    assert claim("d", trial_number=3) == "claimed"
    storage.renew_ladder_claims("c", 60)
    clock[0] += 59  # renewed: still held
    assert claim("d", trial_number=3) == "claimed"
    clock[0] += 2
    assert claim("d", trial_number=3) is None  # lapsed: taken over
    # A stored rung is not claimed: the ladder that stored it was first.
    assert _rung(storage, trial_number=4)
    assert claim("a", trial_number=4) == "stored"
    # Storing a rung drops its claim in the same transaction; the holder's other claims stay.
    assert claim("e", trial_number=5) is None and claim("e", trial_number=6) is None
    assert _rung(storage, trial_number=5)
    assert _claims(backend_url) == [("b", 2), ("b", 2), ("d", 3), ("e", 6)]  # b: seeds 0 and 1


def _claims(url: str) -> list[tuple[str, int]]:
    """(owner, trial) of every rung claim stored, by trial."""
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            rows = c.execute(
                text("SELECT owner, trial_number FROM archsearch_ladder_claims ORDER BY trial_number")
            )
            return [tuple(r) for r in rows]
    finally:
        engine.dispose()


def test_a_version_6_database_gains_batch_sizes_read_from_its_rungs_settings(backend_url):
    wider = dataclasses.replace(CFG, d_model=CFG.d_model * 2)
    with Storage.open(backend_url) as st:
        st.create_study("s", **SPEC)
        st.add_ladder_fit("s", tokens_per_param=20, batch_size=16, fit={"alpha": 0.3})
    engine = create_engine(backend_url)
    with engine.begin() as conn:  # what version 6 wrote: no batch column, a key without it
        conn.execute(text("DROP TABLE archsearch_ladder_rungs"))
        conn.execute(text("ALTER TABLE archsearch_ladder_fits DROP COLUMN batch_size"))
        v6 = _v6_rungs_table()
        v6.create(conn)
        for i, (cfg, settings) in enumerate(
            [
                (CFG, '{"batch_size": 4, "tokens": 10}'),
                (wider, '{"tokens": 10}'),
                (CFG, '{"batch_size": "4"}'),
            ]
        ):
            conn.execute(v6.insert().values(
                study="s", trial_number=i // 2, tokens_per_param=20.0, target_params=1000,
                shape_key=shape_key(cfg), config_json=cfg.to_json(indent=None), params_total=1,
                params_non_embedding=1, seed=0, tokens=10, val_loss=2.0, val_curve_json="[]",
                settings_json=settings, created_at=0.0,
            ))  # fmt: skip
        conn.execute(text("UPDATE archsearch_meta SET value = '6'"))
    engine.dispose()
    with pytest.raises(SchemaVersionError, match="version 6, written by an older archsearch"):
        Storage.open(backend_url, read_only=True)  # a reader upgrades nothing
    with Storage.open(backend_url) as st:
        rungs = st.ladder_rungs("s")
        # Each batch from its settings; 16 (those versions' default) where they name none or not a number.
        found = [(r.trial_number, r.batch_size, r.config) for r in rungs]
        assert found == [(0, 4, CFG), (0, 16, wider), (1, 16, CFG)]
        assert [f.batch_size for f in st.ladder_fits("s")] == [None]  # an older fit's is unknown
        assert _rung(st, trial_number=0, batch_size=16)  # the same shape at another batch: a new rung
        assert not _rung(st, trial_number=0, batch_size=4)  # ... at the stored one: already there
    engine = create_engine(backend_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT value FROM archsearch_meta")).scalar_one() == str(SCHEMA_VERSION)
    engine.dispose()


def _v6_rungs_table() -> Table:
    """archsearch_ladder_rungs as schema version 6 made it: no batch size, a key without it."""
    return table_without(
        LadderRung.__table__, "batch_size", "study", "trial_number", "tokens_per_param", "shape_key", "seed"
    )


@contextlib.contextmanager
def _read_only_database(url: str):
    """The database at `url` read-only for new connections: a read-only SQLite file (see
    tests.readonly for root), or a PostgreSQL database whose transactions are read-only."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        with read_only(Path(parsed.database)):
            yield
        return
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    alter = f'ALTER DATABASE "{parsed.database}" SET default_transaction_read_only = '
    try:
        with engine.connect() as conn:
            conn.execute(text(alter + "on"))
        yield
    finally:
        with engine.connect() as conn:
            conn.execute(text(alter + "off"))
        engine.dispose()


def test_a_read_only_database_reads_and_refuses_writes_in_one_line(backend_url):
    with Storage.open(backend_url) as storage:
        storage.create_study("s", **SPEC)
        storage.finish_trial(_assigned(storage), OUTCOME)
    path = Path(make_url(backend_url).database) if backend_url.startswith("sqlite") else None
    before = hashlib.sha256(path.read_bytes()).hexdigest() if path else None
    # Opening a database whose schema is current writes nothing, so it opens read-only too.
    with _read_only_database(backend_url), Storage.open(backend_url) as storage:
        assert [s.name for s in storage.studies()] == ["s"]
        assert [t.status for t in storage.trials("s")] == ["complete"]
        message = re.escape(f"cannot write the database {storage.display_url}: ")
        with pytest.raises(ReadOnlyStorageError, match=f"^{message}"):
            storage.require_writable()
        with pytest.raises(ReadOnlyStorageError, match=f"^{message}"):
            storage.create_study("t", **SPEC)
    if path is not None:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    with Storage.open(backend_url, create=False) as storage:
        assert [s.name for s in storage.studies()] == ["s"]


def test_require_writable_leaves_a_writable_database_as_it_was(storage):
    storage.create_study("s", **SPEC)
    storage.require_writable()
    assert storage.counts("s") == {} and [s.name for s in storage.studies()] == ["s"]


def test_drivers_creating_one_study_together_get_one_row_and_one_winner(backend_url):
    # Four drivers, each with its own connection, create the same study at the same moment:
    # exactly one creates it, the others are told it exists (never a duplicate-key error), and
    # all see the winner's space fingerprint, so a driver with another space file can refuse it.
    import threading

    stores = [Storage.open(backend_url) for _ in range(4)]
    try:
        for round_ in range(5):
            barrier, outcomes = threading.Barrier(len(stores)), {}

            def create(i: int, study: str, barrier: threading.Barrier, outcomes: dict) -> None:
                barrier.wait()
                try:
                    spec = {**SPEC, "spec_fingerprint": f"{i}" * 64}
                    outcomes[i] = stores[i].create_study(study, **spec, exist_ok=False).spec_fingerprint
                except StudyExistsError:
                    outcomes[i] = "exists"

            threads = [
                threading.Thread(target=create, args=(i, f"race{round_}", barrier, outcomes))
                for i in range(len(stores))
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            winners = {i: fp for i, fp in outcomes.items() if fp != "exists"}
            assert len(outcomes) == 4 and len(winners) == 1, outcomes
            [(i, fingerprint)] = winners.items()
            assert fingerprint == f"{i}" * 64
            assert stores[0].study(f"race{round_}").spec_fingerprint == fingerprint
    finally:
        for store in stores:
            store.close()


def test_a_postgresql_server_that_refuses_connections_is_the_environment_s_fault(tmp_path, monkeypatch):
    """A server that is down (connection refused) was exit 2, bad input, where the same
    server stopping mid-search is exit 1. A missing database stays the input's fault."""
    url = "postgresql+psycopg://postgres@127.0.0.1:1/none"
    with pytest.raises(StorageUnavailableError) as info:
        Storage.open(url)
    assert str(info.value).startswith(
        f"cannot reach the database {url} (waited up to 15 s): OperationalError: "
    )
    assert "Connection refused" in str(info.value)
    monkeypatch.chdir(tmp_path)
    for command in (["studies"], ["search", "--space", str(space_file(tmp_path)), "--study", "s"]):
        result = CliRunner().invoke(app, [*command, "--storage", url])
        one_line(result, 1, "cannot reach the database", "Connection refused")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.toml"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_unanswered_statement_under_a_short_bound_is_one_line(monkeypatch):
    """`$ARCHSEARCH_DB_STATEMENT_S` below the server's 30 s lock timeout: the watchdog shut the
    connection, the rollback met it invalidated, and `trials` ended in a 500-line traceback."""
    with postgres_database() as url:
        with Storage.open(url, create=True):
            pass
        locked, release = threading.Event(), threading.Event()

        def hold_lock():
            with psycopg.connect(url.replace("+psycopg", "")) as conn:
                conn.execute("LOCK TABLE archsearch_studies IN ACCESS EXCLUSIVE MODE")
                locked.set()
                release.wait(30)

        holder = threading.Thread(target=hold_lock)
        holder.start()
        try:
            assert locked.wait(10)
            monkeypatch.setenv("ARCHSEARCH_DB_STATEMENT_S", "2")
            result = CliRunner().invoke(app, ["studies", "--storage", url])
        finally:
            release.set()
            holder.join()
        assert one_line(result, 1).endswith(
            "failed: OperationalError: the server did not answer within 2 s (stopped or unreachable; "
            "$ARCHSEARCH_DB_STATEMENT_S sets the bound)"
        )
