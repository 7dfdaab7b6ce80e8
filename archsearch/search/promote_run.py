"""Running promotion: once a search's trials are finished, its contenders (`promotion.contenders`)
are trained on at 2x, 4x, ... the proxy's tokens on the search's Ray pool, a rung at a time, until
their ranking holds (`promotion.RULES`) or the cap is reached.

Every promotion is a row of the database (`Storage.claim_promotion`), inserted as its claim before
it trains and finished in place with its loss, loss objective and curve, so:
- nothing is trained twice: a stored promotion is read back, and drivers sharing a study train
  each once (the row is the claim; a driver waits for another's to finish, and takes over one
  whose lease lapsed);
- a stopped promotion loses nothing and repeats nothing: Ctrl-C or SIGTERM ends the leases of the
  promotions running here, and `search --resume` trains only those, each from its kept state.

A contender resumes from the final state its first-pass trial kept (`worker.kept_state_path`; a
promotion keeps its own for the next rung) where the proxy is budget-free (`TrainSettings
.budget_free`: the constant schedule with a warm-up in tokens); else it is trained afresh at the
longer budget. Kept states on this machine are deleted once promotion ends.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from archsearch.search.pareto import study_front
from archsearch.search.pool import RayPool, Stop
from archsearch.search.promotion import RULES, contenders
from archsearch.search.validate import long_run
from archsearch.search.worker import STALLED, kept_state_path, stall_retry
from archsearch.space.costs import param_counts
from archsearch.space.objectives import curve_change
from archsearch.trial import COMPLETE, FAILED, RUNNING
from archsearch.units import whole

if TYPE_CHECKING:
    from archsearch.evaluators.settings import TrainSettings
    from archsearch.search.options import SearchOptions
    from archsearch.search.spec import SearchSpec
    from archsearch.storage import PromotionRecord, Storage, TrialRecord

log = logging.getLogger(__name__)

WAIT_S = 0.5  # how often a driver looks again at promotions another driver is training
HELD, CAPPED, INTERRUPTED = "held", "cap", "interrupted"  # how promotion ended


@dataclass(frozen=True)
class PromotionSummary:
    """What promotion did: its contenders, the budgets trained (tokens, a rung each), the largest
    budget every contender completed (the proxy's when none), and why it stopped."""

    contenders: tuple[int, ...]
    budgets: tuple[int, ...]
    ranked_at: int
    stopped: str  # HELD, CAPPED or INTERRUPTED


def trial_settings(spec: SearchSpec, record: TrialRecord) -> TrainSettings:
    """The settings a trial's final run trained with: the proxy's, or the stall retry's where the
    trial was trained again for stalling (its reason says so)."""
    return stall_retry(spec.proxy) if (record.reason or "").startswith(STALLED) else spec.proxy


class _Promoter:
    def __init__(
        self, spec: SearchSpec, storage: Storage, options: SearchOptions, pool: RayPool, stop: Stop
    ) -> None:
        self.spec, self.storage, self.options, self.pool, self.stop = spec, storage, options, pool, stop
        self.study = options.study
        self.renewed = time.monotonic()

    def run(self) -> PromotionSummary | None:
        settings = self.spec.defaults.promote
        assert settings is not None and self.spec.proxy.tokens is not None  # checked by the spec
        front = study_front(self.storage, self.study)
        if front is None:
            return None
        numbers = list(front.trial_numbers)
        chosen = contenders(numbers, front.trial_values, front.front.objectives, settings.margin_nats)
        self.records = {r.number: r for r in self.storage.trials_by_number(self.study, chosen)}
        self._forget(r for r in self.storage.trials(self.study, COMPLETE) if r.number not in self.records)
        log.info("promoting %d contenders: trials %s", len(chosen), ", ".join(map(str, chosen)))
        previous = {n: float(front.trial_values[numbers.index(n), 0]) for n in chosen}
        ranked_at, budgets, stopped = self.spec.proxy.tokens, [], CAPPED
        for multiple in settings.multiples:
            budget = whole(self.spec.proxy.tokens * multiple)
            current = self._rung(chosen, budget)
            if self.stop.signum is not None:
                return PromotionSummary(tuple(chosen), tuple(budgets), ranked_at, INTERRUPTED)
            budgets.append(budget)
            if set(current) == set(chosen):
                ranked_at = budget
            if RULES[settings.rule](previous, current, settings.margin_nats):
                stopped = HELD
                break
            previous = current
        self._forget(self.records.values())
        return PromotionSummary(tuple(chosen), tuple(budgets), ranked_at, stopped)

    def _rung(self, chosen: list[int] | tuple[int, ...], budget: int) -> dict[int, float]:
        """Train every contender at `budget` that no driver has (here, or waiting for another
        driver's); their loss objectives there, of those complete."""
        while self.stop.signum is None:
            stored = {p.trial_number: p for p in self._at(budget)}
            now = time.time()
            todo = [n for n in chosen if n not in stored or self._free(stored[n], now)]
            if todo:
                self._train(todo, budget)
            elif any(stored[n].status == RUNNING for n in chosen):
                time.sleep(WAIT_S)  # another driver trains them: its results are read back
            else:
                break
        return {p.trial_number: p.objective for p in self._at(budget) if p.status == COMPLETE}

    def _at(self, budget: int) -> list[PromotionRecord]:
        return [
            p
            for p in self.storage.promotions(self.study)
            if p.budget_tokens == budget and p.trial_number in self.records
        ]

    def _free(self, promotion: PromotionRecord, now: float) -> bool:
        """A running promotion this driver may take: its own, or one whose lease lapsed."""
        lease = promotion.lease_expires_at
        mine = promotion.host == self.storage.host
        return promotion.status == RUNNING and (mine or lease is None or lease <= now)

    def _train(self, todo: list[int], budget: int) -> None:
        rows: dict[int, int] = {}

        def admit(index: int) -> bool:
            record = self.records[todo[index]]
            if self.storage.claim_promotion(self.study, record.id, budget, self.options.lease_s) is not None:
                return False  # finished or taken by another driver since it was listed
            rows[index] = self.storage.promotion_id(record.id, budget)  # type: ignore[assignment]
            return True

        def done(index: int, result: dict[str, Any] | None, reason: str | None) -> None:
            self._store(rows[index], self.records[todo[index]], result, reason)

        def tick() -> None:
            if time.monotonic() - self.renewed >= self.options.lease_s / 4:
                self.storage.renew_promotions(self.options.lease_s)
                self.renewed = time.monotonic()

        requests = [(f"trial {n} at {budget:,} tokens", self._request(self.records[n], budget)) for n in todo]
        try:
            self.pool.run_each(
                requests, retries=self.options.retries, stop=self.stop, done=done, admit=admit, tick=tick,
                task=long_run,
            )  # fmt: skip
        finally:
            if self.stop.signum is not None:  # what ran here is taken at once by `--resume`
                self.storage.release_promotions()

    def _request(self, record: TrialRecord, budget: int) -> dict[str, Any]:
        assert record.config is not None
        settings = trial_settings(self.spec, record)
        path = kept_state_path(record.config, settings, self.spec.data) if settings.budget_free else None
        longer = dataclasses.replace(settings, tokens=budget)
        return dict(
            config=record.config.to_dict(), settings=dataclasses.asdict(longer),
            data=self.spec.data, cpus=self.options.cpus_per_trial,
            checkpoint=str(path) if path is not None else None, keep=path is not None,
        )  # fmt: skip

    def _store(
        self, row: int, record: TrialRecord, result: dict[str, Any] | None, reason: str | None
    ) -> None:
        if result is None or result["status"] != COMPLETE:
            why = reason if result is None else result.get("reason")
            self.storage.finish_promotion(row, status=FAILED, reason=why or "no result")
            log.warning("promotion of trial %d failed: %s", record.number, why)
            return
        assert record.config is not None
        curve = result["val_curve"]
        params = param_counts(record.config).total
        objective = self.spec.loss_rule.value(result["val_loss"], curve_change(curve), params)
        self.storage.finish_promotion(
            row, status=COMPLETE, val_loss=result["val_loss"], objective=objective, val_curve=curve,
            wall_time_s=result.get("wall_time_s"),
        )  # fmt: skip

    def _forget(self, records: Any) -> None:
        """Delete the kept states of `records` on this machine: no longer promoted."""
        for record in records:
            if record.config is not None:
                settings = trial_settings(self.spec, record)
                kept_state_path(record.config, settings, self.spec.data).unlink(missing_ok=True)


def run_promotions(
    spec: SearchSpec, storage: Storage, options: SearchOptions, pool: RayPool, stop: Stop
) -> PromotionSummary | None:
    """Promote the contenders of `options.study`'s finished trials (module docstring), on `pool`.

    Returns:
        What promotion did; None when the study has no complete trial. `stopped` is
        "interrupted" when `stop` caught a signal (the promotions running were released).

    Raises:
        RayNodeDiedError: the local Ray node died (the promotions stored so far are kept).
        StorageUnavailableError: the database failed.
    """
    return _Promoter(spec, storage, options, pool, stop).run()
