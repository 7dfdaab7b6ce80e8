"""Promotions: a study's contenders claimed, trained on at longer budgets or at more proxy seeds,
and read back, averaged over their seeds; `Storage`'s promotion methods."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from sqlalchemy import select, update

from archsearch.space.objectives import curve_change
from archsearch.storage import schema
from archsearch.storage.core import StorageCore
from archsearch.storage.errors import StorageError
from archsearch.storage.records import PromotionRanking, PromotionRecord, SeedMean, study_proxy_seed
from archsearch.storage.rows import DamagedValue, checked, json_of
from archsearch.trial import COMPLETE, FAILED, RUNNING, check_state

CLAIMED = "claimed"  # `claim_promotion`'s answer when another driver holds a live lease on it


class FirstPass(NamedTuple):
    """A complete trial's own run, at the proxy's budget and the study's proxy seed: its held-out
    loss, curve change (0 where none is stored) and loss objective (None where it cannot be
    computed: a non-finite loss, or no size for a rule that credits size)."""

    loss: float
    change: float
    objective: float | None


class PromotionStore(StorageCore):
    """Contenders promoted to longer budgets or more seeds: one row per (trial, budget, seed), which
    is also the claim that keeps two drivers from training it twice."""

    def claim_promotion(
        self, study: str, trial_id: int, budget_tokens: int, lease_s: float, seed: int | None = None,
        stall_check: bool = False,
    ) -> str | None:  # fmt: skip
        """Claim trial `trial_id`'s run at `budget_tokens` and proxy `seed` (None: the study's
        `[proxy].seed`, the trial's own) for this storage's driver (`host`), for `lease_s` seconds,
        in one transaction holding the study's row locked: of two drivers racing for it, the first
        wins. A new row is a stall check (`PromotionRecord.stall_check`) where `stall_check` says so.

        Returns:
            None when claimed (a new row, one this driver held, or one whose lease lapsed, taken
            over); else why not: "complete" or "failed" (trained already) or `CLAIMED` (another
            driver holds it).

        Raises:
            StorageError: no trial `trial_id` in `study`.
        """
        now = time.time()
        with self._session() as s:
            spec_json = s.scalar(
                select(schema.Study.spec_json).where(schema.Study.name == study).with_for_update()
            )
            trial = s.get(schema.Trial, trial_id)
            if trial is None or trial.study != study or trial.number is None:
                raise StorageError(f"no trial row {trial_id} with a number in study {study!r}")
            if seed is None:
                seed = _proxy_seed(spec_json)
            row = s.scalar(
                select(schema.Promotion).where(
                    schema.Promotion.trial_id == trial_id,
                    schema.Promotion.budget_tokens == budget_tokens,
                    schema.Promotion.seed == seed,
                )
            )
            if row is None:
                s.add(schema.Promotion(
                    study=study, trial_id=trial_id, trial_number=trial.number,
                    budget_tokens=int(budget_tokens), seed=int(seed), status=RUNNING, host=self.host,
                    claimed_at=now, lease_expires_at=now + lease_s, stall_check=bool(stall_check),
                ))  # fmt: skip
                return None
            if row.status != RUNNING:
                return row.status
            if row.host != self.host and row.lease_expires_at is not None and row.lease_expires_at > now:
                return CLAIMED
            row.host, row.claimed_at, row.lease_expires_at = self.host, now, now + lease_s
            return None

    def renew_promotions(self, lease_s: float) -> None:
        """Extend the leases of the running promotions this driver holds to `lease_s` from now."""
        with self._session() as s:
            s.execute(
                update(schema.Promotion)
                .where(schema.Promotion.host == self.host, schema.Promotion.status == RUNNING)
                .values(lease_expires_at=time.time() + lease_s)
            )

    def release_promotions(self, host: str | None = None) -> int:
        """End now the leases of the running promotions of driver `host` (default: this one), stopped
        without finishing them (Ctrl-C, SIGTERM, a crash found at the next start), so the next driver
        takes them at once instead of after the lease. Returns how many there were."""
        with self._session() as s:
            done = s.execute(
                update(schema.Promotion)
                .where(schema.Promotion.host == (host or self.host), schema.Promotion.status == RUNNING)
                .values(lease_expires_at=time.time())
            )
            return int(done.rowcount or 0)

    def finish_promotion(
        self,
        promotion_id: int,
        *,
        status: str,
        val_loss: float | None = None,
        objective: float | None = None,
        val_curve: Sequence[Sequence[float]] = (),
        wall_time_s: float | None = None,
        reason: str | None = None,
        resumed_tokens: int | None = None,
    ) -> None:
        """Write a promotion's result, in one transaction: complete with its loss, objective and
        curve, or failed with its reason; `resumed_tokens`, the tokens the run took over from a kept
        state (0: trained from step 0; None: not known).

        Raises:
            ValueError: a status other than complete or failed, or a complete one without a loss.
            StorageError: no promotion `promotion_id`.
        """
        check_state(status, (COMPLETE, FAILED))
        if status == COMPLETE and (val_loss is None or objective is None):
            raise ValueError("a complete promotion needs its val_loss and objective")
        curve = [[int(t), float(v)] for t, v in val_curve if math.isfinite(float(v))]
        with self._session() as s:
            row = s.get(schema.Promotion, promotion_id)
            if row is None:
                raise StorageError(f"no promotion row {promotion_id}")
            row.status, row.reason = status, reason
            row.val_loss, row.objective = val_loss, objective
            row.val_curve_json = json.dumps(curve)
            row.wall_time_s = wall_time_s
            row.resumed_tokens = None if resumed_tokens is None else int(resumed_tokens)
            row.lease_expires_at, row.finished_at = None, time.time()

    def promotions(self, study: str, status: str | None = None) -> list[PromotionRecord]:
        """`study`'s promotions (of one state, or all), by trial number, budget and seed."""
        with self._session(read_only=True) as s:
            q = select(schema.Promotion).where(schema.Promotion.study == study)
            if status is not None:
                q = q.where(schema.Promotion.status == status)
            p = schema.Promotion
            q = q.order_by(p.trial_number, p.budget_tokens, p.seed)
            return [_record(r) for r in s.scalars(q).all()]

    def promotion_id(self, trial_id: int, budget_tokens: int, seed: int | None = None) -> int | None:
        """The row id of trial `trial_id`'s promotion at `budget_tokens` and proxy `seed` (None: its
        study's `[proxy].seed`), or None."""
        with self._session(read_only=True) as s:
            if seed is None:
                seed = _proxy_seed(
                    s.scalar(
                        select(schema.Study.spec_json)
                        .join(schema.Trial, schema.Trial.study == schema.Study.name)
                        .where(schema.Trial.id == trial_id)
                    )
                )
            return s.scalar(
                select(schema.Promotion.id).where(
                    schema.Promotion.trial_id == trial_id,
                    schema.Promotion.budget_tokens == budget_tokens,
                    schema.Promotion.seed == seed,
                )
            )

    def first_passes(self, study: str) -> dict[int, FirstPass | None]:
        """Each complete trial's own run (`FirstPass`), by trial number; None where its loss is
        missing. A stall-checked trial's is the mean over its seeds at the proxy's budget
        (`stall_checks`).

        Raises:
            UnknownNameError: no study of that name.
        """
        record = self.require_study(study)  # type: ignore[attr-defined]
        return with_checks(self._own_runs(study), self.promotions(study), record.proxy_seed)[0]

    def stall_checks(self, study: str) -> dict[int, SeedMean]:
        """The stall-checked trials of `study` (`PromoteSettings.stall_seeds`): each its mean over
        its own run and its complete stall checks, at the proxy's budget (`checked_means`). By
        trial number; the trials' own runs are read only where the study has checks.

        Raises:
            UnknownNameError: no study of that name.
        """
        record = self.require_study(study)  # type: ignore[attr-defined]
        every = self.promotions(study)
        if not any(p.stall_check for p in every):
            return {}
        return checked_means(every, self._own_runs(study), record.proxy_seed)

    def _own_runs(self, study: str) -> dict[int, FirstPass | None]:
        """Each complete trial's own run at the proxy's seed, as stored (`first_passes` before stall
        checks)."""
        rule = self.require_study(study).loss_rule  # type: ignore[attr-defined]
        trial = schema.Trial
        with self._session(read_only=True) as s:
            rows = s.execute(
                select(trial.number, trial.loss, trial.loss_change, trial.params_total).where(
                    trial.study == study, trial.status == COMPLETE, trial.number.is_not(None)
                )
            ).all()
        out: dict[int, FirstPass | None] = {}
        for number, loss, change, params in rows:
            if loss is None:
                out[number] = None
                continue
            usable = math.isfinite(loss) and (rule.size_beta is None or (params or 0) > 0)
            out[number] = FirstPass(loss, change or 0.0, rule.value(loss, change, params) if usable else None)
        return out

    def seed_means(
        self, study: str, budget_tokens: int, seeds: Sequence[int] | None = None
    ) -> dict[int, SeedMean]:
        """`study`'s trials at `budget_tokens` (`SeedMean`), each the mean over `seeds` (default:
        the study's proxy seed and every seed its promotions trained at, stall checks aside), of
        those with a complete run at every one of them: a complete promotion, or at the proxy's
        budget and the study's proxy seed, the trial's first pass (`first_passes`); a stall-checked
        trial's promotion shifted by its check (`check_shifts`). By trial number.

        Raises:
            UnknownNameError: no study of that name.
        """
        record = self.require_study(study)  # type: ignore[attr-defined]
        every = self.promotions(study)
        rungs = [p for p in every if not p.stall_check]
        complete = [p for p in rungs if p.status == COMPLETE]
        primary = record.proxy_seed
        if seeds is None:
            seeds = study_seeds(primary, rungs)
        own = self._own_runs(study)
        first, checks = with_checks(own, every, primary)
        shifts = check_shifts(checks, own)
        return seed_means(complete, budget_tokens, seeds, first, primary, record.proxy_tokens, shifts)

    def ranked_objectives(self, study: str) -> dict[int, tuple[float | None, int | None, bool]]:
        """Each complete trial's loss objective as a front ranks it (`PromotionRanking.place`), the
        tokens it is ranked at and whether it is estimated there: a contender's measured at the
        largest budget every contender completed at every seed (its mean over them), any other
        trial's estimated at that budget from its proxy run (the study's loss rule over its stored
        loss, curve change and size); each at its proxy run when no such budget exists; (None,
        tokens, False) where the loss is missing. By trial number.

        Raises:
            UnknownNameError: no study of that name.
        """
        own = self._own_runs(study)  # first: a trial finishing meanwhile has its tokens below
        trial = schema.Trial
        with self._session(read_only=True) as s:
            rows = s.execute(
                select(trial.number, trial.tokens_trained).where(
                    trial.study == study, trial.status == COMPLETE, trial.number.is_not(None)
                )
            ).all()
        tokens: dict[int, int | None] = dict(rows)  # type: ignore[arg-type]
        every = self.promotions(study)
        primary = self.require_study(study).proxy_seed  # type: ignore[attr-defined]
        passes, _ = with_checks(own, every, primary)
        first = {n: None if f is None else f.objective for n, f in passes.items()}
        ranking = self._ranking(study, own, every)  # the same reads: one snapshot
        if ranking is None or ranking.budget is None:
            return {n: (v, tokens[n], False) for n, v in first.items()}
        promoted = {n: p.objective for n, p in ranking.ranked.items() if n in first}
        placed, _ = ranking.place(first, promoted)
        return {
            n: (v, ranking.budget if v is not None else tokens[n], v is not None and n not in promoted)
            for n, v in placed.items()
        }

    def promotion_ranking(self, study: str) -> PromotionRanking | None:
        """Where `study`'s front ranks its promoted contenders (`PromotionRanking`): the one answer
        that the front, `export`, `report`, `validate` and `trials` share. None when the study has
        no promotion (every trial is ranked at its first pass).

        The budget is the largest that every contender completed at every seed of the study (its
        proxy seed and every seed a promotion of it trained at), and each contender's value there
        is its mean over them (`seed_means`).

        Raises:
            UnknownNameError: no study of that name.
        """
        return self._ranking(study)

    def _ranking(
        self,
        study: str,
        own: Mapping[int, FirstPass | None] | None = None,
        every: Sequence[PromotionRecord] | None = None,
    ) -> PromotionRanking | None:
        """`promotion_ranking`, over the trials' own runs `own` and the promotions `every` where the
        caller has read them (None: read here; the runs only once the study is known to have
        promotions)."""
        record = self.require_study(study)  # type: ignore[attr-defined]
        every = self.promotions(study) if every is None else every
        if not every:
            return None
        own = self._own_runs(study) if own is None else own
        first, checks = with_checks(own, every, record.proxy_seed)
        rungs = [p for p in every if not p.stall_check]
        complete = [p for p in rungs if p.status == COMPLETE]
        primary, proxy = record.proxy_seed, record.proxy_tokens
        seeds = study_seeds(primary, rungs)
        shifts = check_shifts(checks, own)
        budget = ranked_at(rungs, complete, seeds, first, primary, proxy, shifts)
        means = {} if budget is None else seed_means(complete, budget, seeds, first, primary, proxy, shifts)
        contenders = tuple(sorted({p.trial_number for p in rungs}))
        return PromotionRanking(
            contenders=contenders,
            budget=budget,
            proxy_tokens=proxy,
            ranked={n: means[n] for n in contenders if n in means},
            seeds=len(seeds),
            checked=checks,
        )


def study_seeds(primary: int, every: Sequence[PromotionRecord]) -> tuple[int, ...]:
    """The proxy seeds a study with promotions `every` ranks its contenders over: its own
    (`primary`, the first pass's), then every other seed a promotion of it trained at, ascending."""
    return (primary, *sorted({p.seed for p in every} - {primary}))


class Shift(NamedTuple):
    """What a trial's stall check moved its first pass by (`check_shifts`): the mean over its seeds
    less its own run, in held-out loss, loss objective (None where either is missing) and change."""

    loss: float
    objective: float | None
    change: float


def checked_means(
    every: Sequence[PromotionRecord],
    own: Mapping[int, FirstPass | None],
    primary: int,
) -> dict[int, SeedMean]:
    """The stall-checked trials' first passes: each trial with a complete stall check among `every`
    (at the proxy's budget), its `SeedMean` over its own run (`own`, at seed `primary`) and every
    complete check; a check's run that stalled again counts as it ended (the shape does not train
    at that seed). Trials whose own loss is missing are left out. By trial number."""
    checks: dict[int, list[PromotionRecord]] = {}
    for p in every:
        if p.stall_check and p.status == COMPLETE:
            checks.setdefault(p.trial_number, []).append(p)
    out: dict[int, SeedMean] = {}
    for n, runs in sorted(checks.items()):
        f = own.get(n)
        if f is None:
            continue
        runs.sort(key=lambda p: p.seed)
        out[n] = SeedMean(
            trial_number=n, budget_tokens=runs[0].budget_tokens, seeds=(primary, *(p.seed for p in runs)),
            val_loss=_mean([f.loss, *(p.val_loss for p in runs)]),
            objective=_mean([f.objective, *(p.objective for p in runs)]),
            loss_change=statistics.fmean([f.change, *(curve_change(p.val_curve) for p in runs)]),
            runs=tuple(runs),
        )  # fmt: skip
    return out


def with_checks(
    own: Mapping[int, FirstPass | None], every: Sequence[PromotionRecord], primary: int
) -> tuple[dict[int, FirstPass | None], dict[int, SeedMean]]:
    """(the trials' first passes: `own`, each stall-checked trial's run replaced by its mean over
    its seeds; those means, `checked_means`)."""
    means = checked_means(every, own, primary)
    first = dict(own)
    for n, m in means.items():
        assert m.val_loss is not None  # a check counts only where the trial's own loss is known
        first[n] = FirstPass(m.val_loss, m.loss_change, m.objective)
    return first, means


def check_shifts(checks: Mapping[int, SeedMean], own: Mapping[int, FirstPass | None]) -> dict[int, Shift]:
    """What each stall-checked trial's check moved its first pass by (`Shift`): a promotion of it,
    trained at its own seed, is shifted by as much, so the luck of the seed it climbs at is not
    carried to the longer budget. By trial number."""
    out: dict[int, Shift] = {}
    for n, m in checks.items():
        f = own.get(n)
        if f is None or m.val_loss is None:
            continue
        gap = None if m.objective is None or f.objective is None else m.objective - f.objective
        out[n] = Shift(m.val_loss - f.loss, gap, m.loss_change - f.change)
    return out


def seed_means(
    complete: Sequence[PromotionRecord],
    budget: int,
    seeds: Sequence[int],
    first: Mapping[int, FirstPass | None] | None = None,
    primary: int | None = None,
    proxy_tokens: int | None = None,
    shifts: Mapping[int, Shift] | None = None,
) -> dict[int, SeedMean]:
    """Each trial's `SeedMean` at `budget` over `seeds`, of the trials with a run at every one of
    them: a promotion in `complete` at (`budget`, seed), or, where `budget` is `proxy_tokens` and
    the seed `primary`, the trial's first pass (`first`, by trial number). The means are
    `statistics.fmean`'s (a correctly rounded sum: the order of the seeds does not change them);
    one seed's mean is that run's value exactly. A stall-checked trial's mean past the proxy's
    budget is shifted by its check (`shifts`, by trial number; its first pass already holds it).
    By trial number, ascending."""
    at: dict[int, dict[int, PromotionRecord]] = {}
    for p in complete:
        if p.budget_tokens == budget:
            at.setdefault(p.trial_number, {})[p.seed] = p
    numbers = set(at)
    at_proxy = budget == proxy_tokens and first is not None and primary in seeds
    if at_proxy:
        assert first is not None
        numbers |= {n for n, f in first.items() if f is not None}
    out: dict[int, SeedMean] = {}
    for n in sorted(numbers):
        runs = at.get(n, {})
        values: list[tuple[float | None, float | None, float]] = []
        for seed in seeds:
            if seed in runs:
                p = runs[seed]
                values.append((p.val_loss, p.objective, curve_change(p.val_curve)))
            elif at_proxy and seed == primary and (f := first.get(n)) is not None:  # type: ignore[union-attr]
                values.append((f.loss, f.objective, f.change))
            else:
                break
        else:
            mean = SeedMean(
                trial_number=n, budget_tokens=budget, seeds=tuple(seeds),
                val_loss=_mean(v[0] for v in values), objective=_mean(v[1] for v in values),
                loss_change=statistics.fmean(v[2] for v in values),
                runs=tuple(runs[s] for s in seeds if s in runs),
            )  # fmt: skip
            shift = (shifts or {}).get(n)
            if shift is not None and budget != proxy_tokens:
                mean = dataclasses.replace(
                    mean,
                    val_loss=_plus(mean.val_loss, shift.loss),
                    objective=_plus(mean.objective, shift.objective),
                    loss_change=mean.loss_change + shift.change,
                )
            out[n] = mean
    return out


def ranked_at(
    every: Sequence[PromotionRecord],
    complete: Sequence[PromotionRecord],
    seeds: Sequence[int] | None = None,
    first: Mapping[int, FirstPass | None] | None = None,
    primary: int | None = None,
    proxy_tokens: int | None = None,
    shifts: Mapping[int, Shift] | None = None,
) -> int | None:
    """The largest budget of the promotions `every` at which every promoted trial (every trial of
    `every`) has a run at each of `seeds` (default: the seeds of `every`), as `seed_means` counts
    them (`shifts` as it takes them); None when there is none."""
    contenders = {p.trial_number for p in every}
    if seeds is None:
        seeds = sorted({p.seed for p in every})
    for budget in sorted({p.budget_tokens for p in every}, reverse=True):
        means = seed_means(complete, budget, seeds, first, primary, proxy_tokens, shifts)
        if contenders and contenders <= set(means):
            return budget
    return None


def _plus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _mean(values: Iterable[float | None]) -> float | None:
    """The mean of `values`; None where one of them is None."""
    listed = list(values)
    return None if any(v is None for v in listed) else statistics.fmean(listed)  # type: ignore[arg-type]


def _proxy_seed(spec_json: str | None) -> int:
    """The study's proxy seed (`study_proxy_seed`) from its stored spec's JSON."""
    try:
        return study_proxy_seed(json.loads(spec_json or "{}"))
    except ValueError:
        return 0


def _record(row: schema.Promotion) -> PromotionRecord:
    what = f"promotion {row.id} of {row.study!r}"
    checked(row, what)
    try:
        curve = tuple((int(t), float(v)) for t, v in json_of(row.val_curve_json or "[]", list, what))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, DamagedValue):
            raise
        raise DamagedValue(f"the curve of {what} is not a list of (tokens, loss) points") from None
    return PromotionRecord(
        id=row.id, study=row.study, trial_id=row.trial_id, trial_number=row.trial_number,
        budget_tokens=row.budget_tokens, status=row.status, reason=row.reason, val_loss=row.val_loss,
        objective=row.objective, val_curve=curve, wall_time_s=row.wall_time_s, host=row.host,
        claimed_at=row.claimed_at, lease_expires_at=row.lease_expires_at, finished_at=row.finished_at,
        resumed_tokens=row.resumed_tokens, seed=row.seed, stall_check=bool(row.stall_check),
    )  # fmt: skip
