"""Promotions: a study's contenders claimed, trained on at longer budgets and read back;
`Storage`'s promotion methods."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence

from sqlalchemy import select, update

from archsearch.storage import schema
from archsearch.storage.core import StorageCore
from archsearch.storage.errors import StorageError
from archsearch.storage.records import PromotionRanking, PromotionRecord
from archsearch.storage.rows import DamagedValue, checked, json_of
from archsearch.trial import COMPLETE, FAILED, RUNNING, check_state

CLAIMED = "claimed"  # `claim_promotion`'s answer when another driver holds a live lease on it


class PromotionStore(StorageCore):
    """Contenders promoted to longer budgets: one row per (trial, budget), which is also the claim
    that keeps two drivers from training it twice."""

    def claim_promotion(self, study: str, trial_id: int, budget_tokens: int, lease_s: float) -> str | None:
        """Claim trial `trial_id`'s run at `budget_tokens` for this storage's driver (`host`), for
        `lease_s` seconds, in one transaction holding the study's row locked: of two drivers racing
        for it, the first wins.

        Returns:
            None when claimed (a new row, one this driver held, or one whose lease lapsed, taken
            over); else why not: "complete" or "failed" (trained already) or `CLAIMED` (another
            driver holds it).

        Raises:
            StorageError: no trial `trial_id` in `study`.
        """
        now = time.time()
        with self._session() as s:
            s.execute(select(schema.Study.name).where(schema.Study.name == study).with_for_update())
            trial = s.get(schema.Trial, trial_id)
            if trial is None or trial.study != study or trial.number is None:
                raise StorageError(f"no trial row {trial_id} with a number in study {study!r}")
            row = s.scalar(
                select(schema.Promotion).where(
                    schema.Promotion.trial_id == trial_id, schema.Promotion.budget_tokens == budget_tokens
                )
            )
            if row is None:
                s.add(schema.Promotion(
                    study=study, trial_id=trial_id, trial_number=trial.number,
                    budget_tokens=int(budget_tokens), status=RUNNING, host=self.host, claimed_at=now,
                    lease_expires_at=now + lease_s,
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
        """`study`'s promotions (of one state, or all), by trial number and budget."""
        with self._session(read_only=True) as s:
            q = select(schema.Promotion).where(schema.Promotion.study == study)
            if status is not None:
                q = q.where(schema.Promotion.status == status)
            q = q.order_by(schema.Promotion.trial_number, schema.Promotion.budget_tokens)
            return [_record(r) for r in s.scalars(q).all()]

    def promotion_id(self, trial_id: int, budget_tokens: int) -> int | None:
        """The row id of trial `trial_id`'s promotion at `budget_tokens`, or None."""
        with self._session(read_only=True) as s:
            return s.scalar(
                select(schema.Promotion.id).where(
                    schema.Promotion.trial_id == trial_id, schema.Promotion.budget_tokens == budget_tokens
                )
            )

    def ranked_objectives(self, study: str) -> dict[int, tuple[float | None, int | None, bool]]:
        """Each complete trial's loss objective as a front ranks it (`PromotionRanking.place`), the
        tokens it is ranked at and whether it is estimated there: a contender's measured at the
        largest budget every contender completed, any other trial's estimated at that budget from
        its proxy run (the study's loss rule over its stored loss, curve change and size); each at
        its proxy run when no such budget exists; (None, tokens, False) where the loss is missing. By
        trial number.

        Raises:
            UnknownNameError: no study of that name.
        """
        rule = self.require_study(study).loss_rule  # type: ignore[attr-defined]
        trial = schema.Trial
        with self._session(read_only=True) as s:
            rows = s.execute(
                select(
                    trial.number, trial.loss, trial.loss_change, trial.params_total, trial.tokens_trained
                ).where(trial.study == study, trial.status == COMPLETE, trial.number.is_not(None))
            ).all()
        first: dict[int, float | None] = {}
        tokens: dict[int, int | None] = {}
        for number, loss, change, params, trained in rows:
            usable = (
                loss is not None and math.isfinite(loss) and (rule.size_beta is None or (params or 0) > 0)
            )
            first[number] = rule.value(loss, change, params) if usable else None
            tokens[number] = trained
        ranking = self.promotion_ranking(study)
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

        Raises:
            UnknownNameError: no study of that name.
        """
        record = self.require_study(study)  # type: ignore[attr-defined]
        every = self.promotions(study)
        if not every:
            return None
        complete = [p for p in every if p.status == COMPLETE]
        budget = ranked_at(every, complete)
        tokens = (record.spec.get("proxy") or {}).get("tokens")
        return PromotionRanking(
            contenders=tuple(sorted({p.trial_number for p in every})),
            budget=budget,
            proxy_tokens=int(tokens) if isinstance(tokens, int | float) else None,
            ranked={p.trial_number: p for p in complete if p.budget_tokens == budget},
        )


def ranked_at(every: Sequence[PromotionRecord], complete: Sequence[PromotionRecord]) -> int | None:
    """The largest budget at which every promoted trial (every trial of `every`) has a complete
    promotion in `complete`; None when there is none."""
    contenders = {p.trial_number for p in every}
    done: dict[int, set[int]] = {}
    for p in complete:
        done.setdefault(p.budget_tokens, set()).add(p.trial_number)
    reached = [budget for budget, numbers in done.items() if numbers >= contenders]
    return max(reached) if contenders and reached else None


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
        resumed_tokens=row.resumed_tokens,
    )  # fmt: skip
