"""The records that leave storage: frozen dataclasses, never ORM rows."""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from archsearch.space.config import ArchConfig
from archsearch.space.objectives import LossRule
from archsearch.trial import FINISHED


@dataclass(frozen=True)
class StudyRecord:
    name: str
    spec_fingerprint: str
    spec_source: str
    spec: dict[str, Any]
    objectives: tuple[str, ...]
    created_at: float
    counts: dict[str, int] | None = None  # trials by state; None: not counted (`require_study`)

    @property
    def finished(self) -> int:
        if self.counts is None:
            raise ValueError(f"study {self.name!r} was read without its trial counts")
        return sum(self.counts.get(s, 0) for s in FINISHED)

    @property
    def size_beta(self) -> float | None:
        """The study's loss objective credits size by this beta (`objectives.loss_objective`);
        None: it does not (and studies from before it existed)."""
        beta = self.spec.get("size_beta")
        return None if beta is None else float(beta)

    @property
    def loss_rule(self) -> LossRule:
        """The study's loss objective (`objectives.LossRule`): its `[objectives]` size_beta and
        extrapolate (0 in studies from before it existed)."""
        return LossRule(self.size_beta, float(self.spec.get("extrapolate") or 0.0))

    @property
    def proxy_seed(self) -> int:
        """The proxy seed the study's trials trained at (`study_proxy_seed`)."""
        return study_proxy_seed(self.spec)

    @property
    def proxy_tokens(self) -> int | None:
        """The proxy's budget in tokens as the study's spec states it; None: not in tokens."""
        tokens = (self.spec.get("proxy") or {}).get("tokens")
        return int(tokens) if isinstance(tokens, int | float) and not isinstance(tokens, bool) else None


def study_proxy_seed(spec: Any) -> int:
    """The proxy seed a study's trials trained at, from its stored spec (`SearchSpec.to_dict`):
    `[proxy].seed`, 0 (`TrainSettings`' default) where the spec names none or not a whole number."""
    proxy = spec.get("proxy") if isinstance(spec, dict) else None
    seed = proxy.get("seed") if isinstance(proxy, dict) else None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0 else 0


@dataclass(frozen=True)
class TrialRecord:
    """One trial row. `values` holds every column by name (the flat shape, costs and results)."""

    id: int
    study: str
    number: int | None
    status: str
    reason: str | None
    attempts: int
    params: dict[str, Any]
    config: ArchConfig | None
    values: dict[str, Any]

    def __getitem__(self, column: str) -> Any:
        return self.values[column]


@dataclass(frozen=True)
class LongRunRecord:
    """One stored long run: a trial's shape retrained at `multiplier` x the proxy's tokens."""

    study: str
    trial_number: int
    multiplier: float
    seed: int
    tokens: int
    val_loss: float
    val_curve: tuple[tuple[int, float], ...]
    settings: dict[str, Any]
    device_fingerprint: str | None
    corpus_fingerprint: str | None
    wall_time_s: float | None
    created_at: float

    @property
    def key(self) -> tuple[int, float, int]:
        """(trial number, multiplier, seed): what a rerun matches to skip a stored run."""
        return (self.trial_number, self.multiplier, self.seed)


@dataclass(frozen=True)
class LadderRungRecord:
    """One stored rung of a size ladder: a trial's design at one size (`config`), trained."""

    study: str
    trial_number: int
    tokens_per_param: float
    batch_size: int  # sequences per training step
    target_params: int
    shape_key: str  # sha256 of the config's JSON: one rung per shape
    config: ArchConfig
    params_total: int
    params_non_embedding: int
    seed: int
    tokens: int
    val_loss: float
    val_curve: tuple[tuple[int, float], ...]
    settings: dict[str, Any]
    device_fingerprint: str | None
    corpus_fingerprint: str | None
    wall_time_s: float | None
    created_at: float

    @property
    def key(self) -> tuple[int, float, int, str, int]:
        """(trial number, tokens per parameter, batch size, shape key, seed): what a rerun matches to
        skip it."""
        return (self.trial_number, self.tokens_per_param, self.batch_size, self.shape_key, self.seed)

    @property
    def recipe(self) -> tuple[float, int]:
        """(tokens per parameter, batch size): the rungs of one recipe share one law."""
        return (self.tokens_per_param, self.batch_size)


def shape_key(cfg: ArchConfig) -> str:
    """The key a ladder rung's shape is stored under: sha256 of its canonical JSON."""
    return hashlib.sha256(cfg.to_json(indent=None).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ValidationRecord:
    """One stored `validate` report."""

    id: int
    study: str
    multiplier: float
    seeds: int
    report: dict[str, Any]
    created_at: float


@dataclass(frozen=True)
class LadderFitRecord:
    """One stored fit of a study's ladders (`LadderFit.to_dict()`)."""

    tokens_per_param: float
    batch_size: int | None  # None: a fit stored before batch sizes were (schema version 7)
    fit: dict[str, Any]
    created_at: float


@dataclass(frozen=True)
class SearchRunRecord:
    """One driver's start on a study: who ran it and with which settings."""

    host: str  # name:pid
    started_at: float
    settings: dict[str, Any]


@dataclass(frozen=True)
class ProfileRecord:
    """One stored step profile of a trial, measured locally or modelled on a catalogued GPU."""

    device: str  # "local" or a catalogued GPU
    modelled: bool
    dtype: str
    batch: int
    step_time_s: float
    tokens_per_second: float
    report: dict[str, Any]  # `ProfileReport.to_dict()`; {} when none was stored


@dataclass(frozen=True)
class DeviceRecord:
    """A device some trial or run trained on."""

    fingerprint: str
    name: str
    type: str
    info: dict[str, Any]  # everything recorded about it, the fingerprint included


@dataclass(frozen=True)
class PromotionRecord:
    """One contender trained on at a longer budget (`budget_tokens`) than the study's proxy."""

    id: int
    study: str
    trial_id: int
    trial_number: int
    budget_tokens: int
    status: str  # running, complete or failed
    reason: str | None  # why it failed; or `trial.STALLED`, a seed repeat trained again for stalling
    val_loss: float | None  # held-out nats per token; None unless complete
    objective: float | None  # the study's loss objective at this budget; None unless complete
    val_curve: tuple[tuple[int, float], ...]
    wall_time_s: float | None  # of the run to this budget from step 0, a resumed state's time included
    host: str
    claimed_at: float
    lease_expires_at: float | None
    finished_at: float | None
    # Tokens the run took over from a kept state (0: trained from step 0); None: not known.
    resumed_tokens: int | None = None
    # The proxy seed it trained at: the study's `[proxy].seed` (its trials' own, and that of every
    # promotion stored before seeds were recorded) or a seed repeat's (`PromoteSettings.seed_list`).
    seed: int = 0
    # A stall check (`PromoteSettings.stall_seeds`): the trial's run at the proxy's budget and
    # another seed, averaged into its first pass (`SeedMean`), not a rung of its promotion.
    stall_check: bool = False


@dataclass(frozen=True)
class SeedMean:
    """A contender's value at one budget: the mean, over the seeds it was trained at there, of its
    held-out loss, loss objective and curve change. At the proxy's budget the first pass is one of
    them (its trial's own run, at the study's proxy seed); at one seed, that run's values as stored.

    The loss objective is linear in the loss and the change at a fixed size (`LossRule.value`), so
    the mean objective is the objective of the mean loss and change, and a reader that recomputes
    another loss measure from `val_loss` and `loss_change` ranks the same mean.
    """

    trial_number: int
    budget_tokens: int
    seeds: tuple[int, ...]  # in the order averaged
    val_loss: float | None  # mean held-out nats per token; None where a run's is missing
    objective: float | None  # mean loss objective; None where a run's is missing
    loss_change: float  # mean last change of the held-out curves (`curve_change`; 0 for none)
    runs: tuple[PromotionRecord, ...]  # the promotions averaged (a first pass is not one)


@dataclass(frozen=True)
class PromotionRanking:
    """Where a study with promotions ranks its trials (`Storage.promotion_ranking`): its contenders
    at `budget`, the largest budget every one of them completed at every seed, each by its mean
    over those seeds there (`ranked`; one seed: its promotion's values); every other trial placed
    at `budget` too, estimated (`place`); every trial by its first pass at the proxy's tokens when
    `budget` is None.

    A trial that was stall-checked (`checked`: its first pass stalled, and it was trained at more
    seeds at the proxy's budget) has for first pass the mean over them, and, promoted, its value
    at `budget` is its own seed's there plus the same shift (`Storage.stall_checks`)."""

    contenders: tuple[int, ...]  # the promoted trial numbers
    # Tokens; None: no budget was completed by every contender at every seed (with seed repeats
    # the proxy's own budget is one, its first seed the first pass).
    budget: int | None
    proxy_tokens: int | None  # the proxy's budget as the study's spec states it; None: not in tokens
    ranked: dict[int, SeedMean]  # contender number -> its value at `budget`, over `seeds` seeds
    seeds: int = 1  # the proxy seeds each contender's value at `budget` is the mean of
    # The stall-checked trials' first passes: the mean over their seeds at the proxy's budget.
    checked: Mapping[int, SeedMean] = field(default_factory=dict)

    @staticmethod
    def place(
        first: Mapping[int, float | None], promoted: Mapping[int, float | None]
    ) -> tuple[dict[int, float | None], float]:
        """Every trial's value at `budget`, the one placement each reader of a promoted study ranks
        by (the front, its knee, `export`, `report`, `trials`): a contender's measured there
        (`promoted`, by trial number), any other trial's estimated as its first-pass value (`first`)
        plus the median change the contenders measured between their first pass and `budget`.

        Without it a front would compare the contenders' longer-budget values with the others'
        first-pass ones, which are higher only for being shorter, and push the shapes not promoted
        behind. The shift is one number for all: it keeps their order among themselves and needs no
        model of how a loss falls with tokens (on Gemstones' curves the median beat a shift
        predicted from each shape's size; docs/benchmarks.md, "promotion_replay").

        Returns:
            (trial number -> value, None where its first-pass value is missing; the shift added to
            the trials not promoted, 0 when no contender has both values).
        """
        drops = [
            v - f
            for n, v in promoted.items()
            if v is not None and (f := first.get(n)) is not None and math.isfinite(v - f)
        ]
        shift = statistics.median(drops) if drops else 0.0
        placed: dict[int, float | None] = {}
        for n in dict.fromkeys([*first, *promoted]):
            p, f = promoted.get(n), first.get(n)
            placed[n] = p if p is not None else (None if f is None else f + shift)
        return placed, shift
