"""archsearch's own tables, private to the storage package (ORM objects never leave it).

They sit in the same database as Optuna's tables and hold what Optuna's do not model well: the
full shape and its cost columns, training results and curves, kernel measurements shared by every
study on a device, device fingerprints, failure reasons and leases. Every table name starts with
`archsearch_`, so the two schemas never collide.

Every float column is a `Real`: NaN is stored as NULL on every backend (SQLite has no NaN, and
its driver binds one as NULL, while PostgreSQL stores NaN), and +-inf as +-inf on both.

Bump `SCHEMA_VERSION` with every change to these tables. A database from version
`ADDITIVE_SINCE` on, older than the code, gains the tables and the nullable columns
(`ADDED_COLUMNS`) added since when it is opened (those versions only ever added tables and
nullable columns); `Storage` refuses any other version that differs from the code's.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

# 2: archsearch_long_runs, archsearch_validations; 3: archsearch_search_runs; 4: archsearch_ladder_rungs,
# archsearch_ladder_fits; 5: archsearch_trials.prefill_time_s and decode_time_s; 6:
# archsearch_trials.loss_change (older rows filled from their stored held-out curves on opening); 7:
# archsearch_ladder_rungs.batch_size, part of a rung's key (the table is rebuilt on opening, each row's
# batch read from its stored settings), archsearch_ladder_fits.batch_size; 8: archsearch_ladder_claims;
# 9: archsearch_promotions; 10: archsearch_promotions.resumed_tokens; 11: archsearch_promotions.seed,
# part of a promotion's key (the table is rebuilt on opening, each row given its study's proxy seed);
# 12: archsearch_promotions.stall_check
SCHEMA_VERSION = 12
ADDITIVE_SINCE = 1  # versions 1 .. SCHEMA_VERSION - 1 differ from this one only by missing tables
# ... and by these nullable columns, added to existing tables on opening: (table, column).
ADDED_COLUMNS = (
    ("archsearch_trials", "prefill_time_s"),
    ("archsearch_trials", "decode_time_s"),
    ("archsearch_trials", "loss_change"),
    ("archsearch_ladder_fits", "batch_size"),
    ("archsearch_promotions", "resumed_tokens"),
    ("archsearch_promotions", "stall_check"),
)
LOSS_CHANGE_SINCE = 6  # a database older than this gets loss_change from its curves when opened
LADDER_BATCH_SINCE = 7  # ... and its ladder rungs' table rebuilt with their batch sizes
PROMOTION_SEED_SINCE = 11  # ... and its promotions' table rebuilt with their seeds


class Real(TypeDecorator[float]):
    """A float column whose NaN is NULL on every backend; the DDL is a plain `Float`.

    A NaN given to a NOT NULL column is then refused alike everywhere (an integrity error), where
    it used to be stored on PostgreSQL and refused on SQLite.
    """

    impl = Float
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return None if value is not None and value != value else value  # NaN is the one x != x


class Base(DeclarativeBase):
    pass


class Meta(Base):
    """Key-value facts about the database itself (the schema version)."""

    __tablename__ = "archsearch_meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class Study(Base):
    """One search: its spec, so a resume can check it runs the same space."""

    __tablename__ = "archsearch_studies"
    name: Mapped[str] = mapped_column(String(512), primary_key=True)  # = Optuna's study_name
    spec_fingerprint: Mapped[str] = mapped_column(String(64))
    spec_source: Mapped[str] = mapped_column(Text)  # the space file as written
    spec_json: Mapped[str] = mapped_column(Text)  # the parsed spec, canonical
    objectives: Mapped[str] = mapped_column(String(256))  # comma-separated, Optuna's value order
    created_at: Mapped[float] = mapped_column(Real)


class Trial(Base):
    """One sampled shape and everything measured about it."""

    __tablename__ = "archsearch_trials"
    __table_args__ = (UniqueConstraint("study", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study: Mapped[str] = mapped_column(ForeignKey("archsearch_studies.name", ondelete="CASCADE"), index=True)
    number: Mapped[int | None] = mapped_column(Integer)  # Optuna's trial number; None until asked
    optuna_trial_id: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(Text)  # why failed / pruned / rejected / interrupted
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # worker runs started (retries + 1)
    params_json: Mapped[str | None] = mapped_column(Text)  # Optuna's sampled parameters
    config_json: Mapped[str | None] = mapped_column(Text)  # the ArchConfig JSON form
    # --- the shape, flat, so queries filter on columns (ArchConfig field names) ---
    vocab_size: Mapped[int | None] = mapped_column(Integer)
    seq_len: Mapped[int | None] = mapped_column(Integer)
    d_model: Mapped[int | None] = mapped_column(Integer)
    n_layers: Mapped[int | None] = mapped_column(Integer)
    n_heads: Mapped[int | None] = mapped_column(Integer)
    n_kv_heads: Mapped[int | None] = mapped_column(Integer)
    head_dim: Mapped[int | None] = mapped_column(Integer)
    d_ff: Mapped[int | None] = mapped_column(Integer)
    activation: Mapped[str | None] = mapped_column(String(32))
    norm: Mapped[str | None] = mapped_column(String(32))
    norm_placement: Mapped[str | None] = mapped_column(String(32))
    pos_embedding: Mapped[str | None] = mapped_column(String(32))
    parallel_block: Mapped[bool | None] = mapped_column(Boolean)
    bias: Mapped[bool | None] = mapped_column(Boolean)
    tie_embeddings: Mapped[bool | None] = mapped_column(Boolean)
    qk_norm: Mapped[bool | None] = mapped_column(Boolean)
    aspect_ratio: Mapped[float | None] = mapped_column(Real)
    d_ff_ratio: Mapped[float | None] = mapped_column(Real)
    attention_layout: Mapped[str | None] = mapped_column(String(8))
    # --- exact costs (space.costs) ---
    params_total: Mapped[int | None] = mapped_column(BigInteger)
    params_non_embedding: Mapped[int | None] = mapped_column(BigInteger)
    flops_forward_per_token: Mapped[float | None] = mapped_column(Real)
    flops_train_per_token: Mapped[float | None] = mapped_column(Real)
    kv_cache_bytes_per_token: Mapped[float | None] = mapped_column(Real)
    # --- proxy training ---
    loss: Mapped[float | None] = mapped_column(Real)  # held-out nats per token
    # The held-out curve's last evaluation interval's change (objectives.curve_change), which the
    # loss objective extrapolates by; added in version 6, NULL in older rows without a curve: 0.
    loss_change: Mapped[float | None] = mapped_column(Real)
    bits_per_byte: Mapped[float | None] = mapped_column(Real)
    tokens_trained: Mapped[int | None] = mapped_column(BigInteger)
    steps: Mapped[int | None] = mapped_column(Integer)
    train_seconds: Mapped[float | None] = mapped_column(Real)
    tokens_per_second: Mapped[float | None] = mapped_column(Real)
    mfu: Mapped[float | None] = mapped_column(Real)
    precision: Mapped[str | None] = mapped_column(String(8))
    corpus_fingerprint: Mapped[str | None] = mapped_column(String(64))
    pruned_rung: Mapped[float | None] = mapped_column(Real)  # fraction of the proxy budget
    # --- hardware cost ---
    device_fingerprint: Mapped[str | None] = mapped_column(String(64))  # where it trained
    step_time_s: Mapped[float | None] = mapped_column(Real)  # the step_time objective
    step_time_device: Mapped[str | None] = mapped_column(String(64))
    # --- serving cost (the [serve] scenario, modelled; added in version 5) ---
    prefill_time_s: Mapped[float | None] = mapped_column(Real)  # the prefill_time objective
    decode_time_s: Mapped[float | None] = mapped_column(Real)  # the decode_time objective
    # --- bookkeeping ---
    host: Mapped[str | None] = mapped_column(String(256))  # driver host:pid that ran it
    lease_expires_at: Mapped[float | None] = mapped_column(Real)  # unix time; renewed while running
    started_at: Mapped[float | None] = mapped_column(Real)
    finished_at: Mapped[float | None] = mapped_column(Real)


class Curve(Base):
    """Loss curves: training loss every few steps and held-out loss at each evaluation."""

    __tablename__ = "archsearch_curves"
    trial_id: Mapped[int] = mapped_column(
        ForeignKey("archsearch_trials.id", ondelete="CASCADE"), primary_key=True
    )
    kind: Mapped[str] = mapped_column(String(8), primary_key=True)  # "train" or "val"
    tokens: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    loss: Mapped[float] = mapped_column(Real)


class Profile(Base):
    """A trial's step time on one device, measured here or modelled for a catalogued GPU."""

    __tablename__ = "archsearch_profiles"
    trial_id: Mapped[int] = mapped_column(
        ForeignKey("archsearch_trials.id", ondelete="CASCADE"), primary_key=True
    )
    device: Mapped[str] = mapped_column(String(128), primary_key=True)  # "local" or a catalogue name
    modelled: Mapped[bool] = mapped_column(Boolean)
    dtype: Mapped[str] = mapped_column(String(8))
    batch: Mapped[int] = mapped_column(Integer)
    step_time_s: Mapped[float] = mapped_column(Real)
    tokens_per_second: Mapped[float] = mapped_column(Real)
    report_json: Mapped[str] = mapped_column(Text)  # ProfileReport.to_dict()


class Kernel(Base):
    """One measured kernel time: the profiler's cache, shared by all studies on a device."""

    __tablename__ = "archsearch_kernels"
    key: Mapped[str] = mapped_column(String(256), primary_key=True)  # MeasurementKey.to_str()
    device_fingerprint: Mapped[str] = mapped_column(String(64), index=True)
    dtype: Mapped[str] = mapped_column(String(8))
    kind: Mapped[str] = mapped_column(String(16))
    shape: Mapped[str] = mapped_column(String(128))
    seconds: Mapped[float] = mapped_column(Real)
    measured_at: Mapped[float] = mapped_column(Real)


class Device(Base):
    """A device that ran trials or kernels, by fingerprint."""

    __tablename__ = "archsearch_devices"
    fingerprint: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(256))
    type: Mapped[str] = mapped_column(String(16))
    info_json: Mapped[str] = mapped_column(Text)
    first_seen: Mapped[float] = mapped_column(Real)


class LongRun(Base):
    """One trial's shape retrained for longer than the proxy: the reference `validate` ranks by.

    One row per (study, trial, multiplier, seed); a rerun of `validate` skips the rows it finds.
    """

    __tablename__ = "archsearch_long_runs"
    __table_args__ = (UniqueConstraint("study", "trial_number", "multiplier", "seed"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study: Mapped[str] = mapped_column(ForeignKey("archsearch_studies.name", ondelete="CASCADE"), index=True)
    trial_number: Mapped[int] = mapped_column(Integer)
    multiplier: Mapped[float] = mapped_column(Real)  # x the study's proxy token budget
    seed: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[int] = mapped_column(BigInteger)  # tokens actually trained
    val_loss: Mapped[float] = mapped_column(Real)  # held-out nats per token at the end
    val_curve_json: Mapped[str] = mapped_column(Text)  # [[tokens, loss], ...]
    settings_json: Mapped[str] = mapped_column(Text)  # the TrainSettings it ran with
    device_fingerprint: Mapped[str | None] = mapped_column(String(64))
    corpus_fingerprint: Mapped[str | None] = mapped_column(String(64))
    wall_time_s: Mapped[float | None] = mapped_column(Real)
    created_at: Mapped[float] = mapped_column(Real)


class Validation(Base):
    """One `validate` report on a study: its rank-fidelity metrics, as JSON."""

    __tablename__ = "archsearch_validations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study: Mapped[str] = mapped_column(ForeignKey("archsearch_studies.name", ondelete="CASCADE"), index=True)
    multiplier: Mapped[float] = mapped_column(Real)
    seeds: Mapped[int] = mapped_column(Integer)
    report_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Real)


class SearchRun(Base):
    """One driver's run of a study: the settings that ran, command-line overrides included (the
    study's spec holds only the space file's `[search]` defaults)."""

    __tablename__ = "archsearch_search_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study: Mapped[str] = mapped_column(ForeignKey("archsearch_studies.name", ondelete="CASCADE"), index=True)
    host: Mapped[str] = mapped_column(String(256))
    settings_json: Mapped[str] = mapped_column(Text)  # sampler, seed, prune, trials, workers, ...
    started_at: Mapped[float] = mapped_column(Real)


class LadderRung(Base):
    """One rung of a size ladder (`archsearch ladder`): a trial's design at one size, its widths and
    depth re-chosen, trained with tokens in proportion to its parameters.

    One row per (study, trial, tokens per parameter, batch size, shape, seed); a rerun skips the rows
    it finds.
    """

    __tablename__ = "archsearch_ladder_rungs"
    __table_args__ = (
        UniqueConstraint("study", "trial_number", "tokens_per_param", "batch_size", "shape_key", "seed"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study: Mapped[str] = mapped_column(ForeignKey("archsearch_studies.name", ondelete="CASCADE"), index=True)
    trial_number: Mapped[int] = mapped_column(Integer)  # the trial whose design the ladder keeps
    tokens_per_param: Mapped[float] = mapped_column(Real)  # training tokens / total parameters
    batch_size: Mapped[int] = mapped_column(Integer)  # sequences per step: with the ratio, the recipe
    target_params: Mapped[int] = mapped_column(BigInteger)  # the size asked for; the shape's is exact
    shape_key: Mapped[str] = mapped_column(String(64))  # sha256 of the rung's ArchConfig JSON
    config_json: Mapped[str] = mapped_column(Text)  # the rung's ArchConfig
    params_total: Mapped[int] = mapped_column(BigInteger)
    params_non_embedding: Mapped[int] = mapped_column(BigInteger)
    seed: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[int] = mapped_column(BigInteger)  # tokens actually trained
    val_loss: Mapped[float] = mapped_column(Real)  # held-out nats per token at the end
    val_curve_json: Mapped[str] = mapped_column(Text)  # [[tokens, loss], ...]
    settings_json: Mapped[str] = mapped_column(Text)  # the TrainSettings it ran with
    device_fingerprint: Mapped[str | None] = mapped_column(String(64))
    corpus_fingerprint: Mapped[str | None] = mapped_column(String(64))
    wall_time_s: Mapped[float | None] = mapped_column(Real)
    created_at: Mapped[float] = mapped_column(Real)


class LadderClaim(Base):
    """A rung one `archsearch ladder` is training: two ladders of one study started together train
    each missing rung once, where each would otherwise train every rung. Keyed as a rung; the
    holder renews `expires_at` while it trains and deletes the row when the rung is stored or
    given up, so a killed ladder's claims lapse after their lease."""

    __tablename__ = "archsearch_ladder_claims"
    __table_args__ = (
        UniqueConstraint("study", "trial_number", "tokens_per_param", "batch_size", "shape_key", "seed"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study: Mapped[str] = mapped_column(ForeignKey("archsearch_studies.name", ondelete="CASCADE"), index=True)
    trial_number: Mapped[int] = mapped_column(Integer)
    tokens_per_param: Mapped[float] = mapped_column(Real)
    batch_size: Mapped[int] = mapped_column(Integer)
    shape_key: Mapped[str] = mapped_column(String(64))
    seed: Mapped[int] = mapped_column(Integer)
    owner: Mapped[str] = mapped_column(String(128))  # host:pid:token of the ladder holding it
    expires_at: Mapped[float] = mapped_column(Real)  # unix time; past it, another ladder may take it


class LadderFitRow(Base):
    """One fit of the law across a study's ladders at one tokens-per-parameter and batch size, with
    its residuals, as JSON (`results.ladder_fit.LadderFit.to_dict`)."""

    __tablename__ = "archsearch_ladder_fits"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study: Mapped[str] = mapped_column(ForeignKey("archsearch_studies.name", ondelete="CASCADE"), index=True)
    tokens_per_param: Mapped[float] = mapped_column(Real)
    batch_size: Mapped[int | None] = mapped_column(Integer)  # None: a fit stored before version 7
    fit_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Real)


class Promotion(Base):
    """One contender of a study's front trained on at a longer budget than the proxy's.

    The row is the claim: it is inserted `running` by the driver that trains it, under a lease it
    renews, and finished in place; the unique (trial, budget, seed) means two drivers never train
    the same promotion, and a lapsed lease (a killed driver) lets another take it over.
    """

    __tablename__ = "archsearch_promotions"
    __table_args__ = (UniqueConstraint("trial_id", "budget_tokens", "seed"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study: Mapped[str] = mapped_column(ForeignKey("archsearch_studies.name", ondelete="CASCADE"), index=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("archsearch_trials.id", ondelete="CASCADE"), index=True)
    trial_number: Mapped[int] = mapped_column(Integer)
    budget_tokens: Mapped[int] = mapped_column(BigInteger)  # the budget asked for
    # The proxy seed it trains at: the study's `[proxy].seed` (the trial's own), or a seed repeat's.
    seed: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))  # running, then complete or failed
    # Why it failed; on a complete seed repeat, that it stalled and was trained again (as a trial's).
    reason: Mapped[str | None] = mapped_column(Text)
    val_loss: Mapped[float | None] = mapped_column(Real)  # held-out nats per token at the end
    objective: Mapped[float | None] = mapped_column(Real)  # the study's loss objective of that run
    val_curve_json: Mapped[str | None] = mapped_column(Text)  # [[tokens, loss], ...]
    wall_time_s: Mapped[float | None] = mapped_column(Real)
    # Tokens the run took over from a kept state (0: trained from step 0); NULL: not known (a
    # promotion stored before schema version 10).
    resumed_tokens: Mapped[int | None] = mapped_column(BigInteger)
    # True: a stall check (at the proxy's budget, another seed, of a contender whose first pass
    # stalled: `promotion.PromoteSettings.stall_seeds`); NULL or False: a rung or a seed repeat.
    stall_check: Mapped[bool | None] = mapped_column(Boolean)
    host: Mapped[str] = mapped_column(String(256))  # host:pid of the driver that holds or held it
    claimed_at: Mapped[float] = mapped_column(Real)
    lease_expires_at: Mapped[float | None] = mapped_column(Real)  # while running; renewed
    finished_at: Mapped[float | None] = mapped_column(Real)
