"""Running promotion: once a search's trials are finished, its contenders (`promotion.contenders`)
are trained on at 2x, 4x, ... the proxy's tokens on the search's Ray pool, a rung at a time, until
their ranking holds (`promotion.RULES`) or the cap is reached; with seed repeats, at every seed of
`PromoteSettings.seed_list` at each rung, the first of them at the proxy's own budget (the first
pass being its first seed), each contender valued at its mean over them.

Stall checks come first (`promotion.stall_checked`): a contender whose first pass stalled is
trained at the settings' `check_seeds` at the proxy's budget, from step 0 under the stall rule as a
seed repeat there, keeping no state; each is a promotion row with `stall_check` set, and the
contenders are chosen again from the first-pass front, where a checked trial's value is its mean
over its seeds (`Storage.stall_checks`). A check that failed counts for nothing.

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
longer budget. The state is its seed's: the settings' seed is part of the key, so a seed repeat
at 2x goes on from its own run at the proxy's budget, which trained from step 0. Kept states on
this machine are deleted once promotion ends.

A seed repeat at the proxy's budget is the trial a study at its seed trains, stall rule included
(`worker.stall_reason`): one that stalls is trained again with the stall retry's settings, its row
holds the retry's result and a reason starting with `trial.STALLED`, as such a trial's does, and
its longer rungs train with those settings (`_Promoter.settings_at`).

Optuna's view stays the first pass: the values its trials were told are never changed, and as
Optuna refuses attributes on a finished trial, each rung is recorded on the Optuna study instead,
as the user attribute `promoted_loss_<tokens>` (`OPTUNA_ATTR`): {trial number: loss objective},
the mean over the seeds with seed repeats.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from archsearch.search.pareto import study_front
from archsearch.search.pool import RayPool, Stop
from archsearch.search.promotion import TENFOLD, climb, contenders, spent_tokens, stall_checked
from archsearch.search.validate import long_run
from archsearch.search.worker import kept_state_path, stall_retry
from archsearch.space.costs import param_counts
from archsearch.space.objectives import curve_change
from archsearch.trial import COMPLETE, FAILED, INTERRUPTED, PRUNED, RUNNING, retried_for_stalling
from archsearch.units import whole

if TYPE_CHECKING:
    from pathlib import Path

    from archsearch.evaluators.settings import TrainSettings
    from archsearch.search.options import SearchOptions
    from archsearch.search.spec import SearchSpec
    from archsearch.storage import PromotionRecord, Storage, TrialRecord

log = logging.getLogger(__name__)

WAIT_S = 0.5  # how often a driver looks again at promotions another driver is training
OPTUNA_ATTR = "promoted_loss_{tokens}"  # the Optuna study's user attribute of one rung


@dataclass(frozen=True)
class PromotionSummary:
    """What promotion did: its contenders, the budgets trained (tokens, a rung each; with seed
    repeats the proxy's own first), the largest budget every contender completed at every seed
    (the proxy's when none), and why it stopped."""

    contenders: tuple[int, ...]
    budgets: tuple[int, ...]
    ranked_at: int
    stopped: str  # promotion.HELD, promotion.CAPPED or INTERRUPTED
    # What it cost, in tokens trained: the first pass (the search without promotion), promotion
    # (`promotion.spent_tokens`), and every trial of the first pass trained at `TENFOLD` x; and how
    # many promotions resumed from a kept state, trained from step 0, or are of unknown start.
    first_pass_tokens: int = 0
    promotion_tokens: int = 0
    tenfold_tokens: int = 0
    resumed: int = 0
    afresh: int = 0
    unknown: int = 0
    seeds: int = 1  # proxy seeds each contender was trained at (`PromoteSettings.seeds`)
    checked: tuple[int, ...] = ()  # the trials stall-checked (`promotion.stall_checked`)


@dataclass(frozen=True)
class PromotionProgress:
    """A snapshot for progress displays while promotion runs: the search's last (`search`) with the
    promotions done, running and planned (every contender at every seed of every rung begun so
    far: PASHA's rule decides at the end of each whether another runs), the rung's budget, the
    seconds left to the end of that rung (`eta_s`; None until a time per token is known), and the
    rung's place among the `rungs` the cap allows. `finished` and `target` count trials and
    promotions together, so a display counting work moves as promotions end."""

    search: Any  # the driver's `SearchProgress` (the driver imports this module)
    done: int
    running: int
    planned: int
    budget: int
    eta_s: float | None
    rung: int = 1
    rungs: int = 1
    seeds: int = 1  # proxy seeds per contender at a longer rung (one fewer at the proxy's budget)
    checking: bool = False  # stall checks running, at the proxy's budget, before any rung

    @property
    def finished(self) -> int:
        return self.search.finished + self.done

    @property
    def target(self) -> int:
        return self.search.target + self.planned

    @property
    def elapsed_s(self) -> float:
        return self.search.elapsed_s

    @property
    def promotion_line(self) -> str:
        seeds = f", {self.seeds} seeds" if self.seeds > 1 else ""
        where = "stall checks" if self.checking else f"rung {self.rung} of at most {self.rungs}{seeds}"
        return (
            f"promotions {self.done}/{self.planned} done, {self.running} running at {self.budget:,} tokens "
            f"({where})"
        )


def trial_settings(spec: SearchSpec, record: TrialRecord | PromotionRecord) -> TrainSettings:
    """The settings a trial's final run trained with: the proxy's, or the stall retry's where the
    trial was trained again for stalling (its reason says so); so too for a seed repeat's
    promotion at the proxy's budget, at the proxy's seed (the caller sets its own)."""
    return stall_retry(spec.proxy) if retried_for_stalling(record.reason) else spec.proxy


class _Promoter:
    def __init__(
        self, spec: SearchSpec, storage: Storage, options: SearchOptions, pool: RayPool, stop: Stop,
        progress: Callable[[], Any] | None = None,
        on_update: Callable[[PromotionProgress], None] | None = None,
    ) -> None:  # fmt: skip
        self.spec, self.storage, self.options, self.pool, self.stop = spec, storage, options, pool, stop
        self.study = options.study
        self.created_at = storage.require_study(self.study).created_at  # kept states' key
        self.renewed = time.monotonic()
        self.progress, self.on_update = progress, on_update
        self.running, self.budget = 0, 0
        settings = spec.defaults.promote
        assert settings is not None  # checked by the caller
        self.seeds = settings.seed_list(spec.proxy.seed)  # the first pass's first
        self.check_seeds = settings.check_seeds(spec.proxy.seed)
        self.checking: list[int] = []  # the trials stall-checked so far
        self.records: dict[int, TrialRecord] = {}  # every trial promoted or checked, by number
        self.chosen: tuple[int, ...] = ()  # the contenders as they stand

    def seeds_at(self, budget: int) -> tuple[int, ...]:
        """The seeds promotions train at `budget`: every seed, but the first pass's at the proxy's
        own budget (that run is the trial)."""
        return self.seeds[1:] if budget == self.spec.proxy.tokens else self.seeds

    def _update(self, chosen: Sequence[int]) -> None:
        """Tell the display where promotion stands (`PromotionProgress`)."""
        if self.on_update is None or self.progress is None:
            return
        settings, proxy = self.spec.defaults.promote, self.spec.proxy.tokens
        assert settings is not None and proxy is not None  # checked by the spec
        rungs = [whole(proxy * m) for m in settings.rungs]
        # Only the rungs begun: PASHA's rule may stop at the end of any, so a later one is not
        # counted until it starts (before the first starts, the first).
        begun = [b for b in rungs if b <= self.budget] or rungs[:1]
        stored = self.storage.promotions(self.study)
        ended = {(p.trial_number, p.budget_tokens, p.seed) for p in stored if p.status != RUNNING}
        chosen_set = set(chosen)
        checks = [(n, proxy, seed) for n in self.checking for seed in self.check_seeds]
        planned = checks + [(n, b, seed) for n in chosen for b in begun for seed in self.seeds_at(b)]
        done = sum(1 for key in planned if key in ended)
        # Seconds per token: the promotions' own (each ran from step 0 to its budget), else the
        # first pass's mean wall time over the proxy's tokens.
        own = [p.wall_time_s / p.budget_tokens for p in stored if p.status == COMPLETE and p.wall_time_s]
        search = self.progress()
        first = search.wall_times_s
        per_token = (sum(own) / len(own)) if own else (sum(first) / len(first) / proxy) if first else None
        left = proxy * sum(1 for key in checks if key not in ended)  # a check trains from step 0
        for n in chosen_set:
            resumed = n in self.records and trial_settings(self.spec, self.records[n]).budget_free
            for seed in self.seeds:
                # A seed repeat starts from step 0 at the proxy's budget; the first pass's seed
                # goes on from its trial.
                previous = proxy if seed == self.seeds[0] else 0
                for budget in begun:
                    if seed in self.seeds_at(budget) and (n, budget, seed) not in ended:
                        left += budget - previous if resumed else budget
                    previous = budget
        eta = None if per_token is None else per_token * left / max(1, self.options.workers)
        checking = self.budget == proxy and bool(self.check_seeds) and bool(self.checking)
        said = PromotionProgress(
            search, done, self.running, len(planned), self.budget, eta, len(begun), len(rungs),
            settings.seeds, checking,
        )  # fmt: skip
        self.on_update(said)

    def run(self) -> PromotionSummary | None:
        settings = self.spec.defaults.promote
        assert settings is not None and self.spec.proxy.tokens is not None  # checked by the spec
        # The first pass's front (a stall-checked trial's value the mean over its seeds): a resumed
        # promotion chooses the contenders it chose before.
        if study_front(self.storage, self.study, first_pass=True) is None:
            return None
        first: dict[int, float] = {}
        proxy = self.spec.proxy.tokens

        def choose() -> tuple[int, ...]:
            front = study_front(self.storage, self.study, first_pass=True)
            assert front is not None  # it had a complete trial, and trials are never deleted
            numbers = list(front.trial_numbers)
            values, objectives = front.trial_values, front.front.objectives
            chosen = contenders(numbers, values, objectives, settings.margin_nats, settings.max_contenders)
            first.clear()
            first.update({n: float(values[numbers.index(n), 0]) for n in chosen})
            self.records.update((r.number, r) for r in self.storage.trials_by_number(self.study, chosen))
            self.chosen = chosen
            return chosen

        def stalled(number: int) -> bool:
            return bool(self.check_seeds) and retried_for_stalling(self.records[number].reason)

        def check(numbers: Sequence[int]) -> bool:
            self.checking.extend(numbers)
            log.info("stall checks of trials %s at seeds %s", ", ".join(map(str, numbers)), self.check_seeds)
            self.budget = proxy
            self._update(self.chosen)
            self._rung(numbers, proxy, self.check_seeds, stall_check=True)
            return self.stop.signum is None

        found = stall_checked(choose, stalled, check)
        if found is None:
            return self._summary((), (), proxy, INTERRUPTED)
        chosen = found
        self._forget(r for r in self.storage.trials(self.study, COMPLETE) if r.number not in chosen)
        log.info("promoting %d contenders: trials %s", len(chosen), ", ".join(map(str, chosen)))

        def train(budget: int) -> dict[int, float] | None:
            self.budget = budget
            self._update(chosen)
            current = self._rung(chosen, budget)
            tell_optuna(self.storage, self.study, budget, current)
            return None if self.stop.signum is not None else current

        done = climb(settings, first, lambda multiple: whole(proxy * multiple), train)
        if done.stopped != INTERRUPTED:
            self._forget(self.records.values())
        return self._summary(chosen, done.budgets, done.ranked_at or proxy, done.stopped)

    def _summary(
        self, chosen: Sequence[int], budgets: tuple[int, ...], ranked_at: int, stopped: str
    ) -> PromotionSummary:
        first_pass, spent, tenfold = self._cost()
        settings = self.spec.defaults.promote
        assert settings is not None
        return PromotionSummary(
            tuple(chosen), budgets, ranked_at, stopped, first_pass, spent.tokens, tenfold,
            spent.resumed, spent.afresh, spent.unknown, settings.seeds, tuple(self.checking),
        )  # fmt: skip

    def _cost(self) -> tuple[int, Any, int]:
        """(first-pass tokens, what the promotions complete so far trained (`promotion.Spent`),
        every first-pass trial at `TENFOLD` x) of the study."""
        proxy = self.spec.proxy.tokens or 0
        trained = [r for r in self.storage.trials(self.study) if r["tokens_trained"]]
        first = sum(int(r["tokens_trained"]) for r in trained)
        shapes = sum(1 for r in trained if r.status in (COMPLETE, PRUNED))
        complete = self.storage.promotions(self.study, COMPLETE)
        by_number = {r.number: r for r in trained}
        resumable = {
            p.trial_number: p.trial_number in by_number
            and trial_settings(self.spec, by_number[p.trial_number]).budget_free
            for p in complete
        }
        return first, spent_tokens(proxy, complete, resumable), TENFOLD * proxy * shapes

    def _rung(
        self,
        chosen: Sequence[int],
        budget: int,
        seeds: Sequence[int] | None = None,
        stall_check: bool = False,
    ) -> dict[int, float]:
        """Train every trial of `chosen` at `budget` and each seed there (`seeds`; default
        `seeds_at`) that no driver has (here, or waiting for another driver's), as stall checks
        where `stall_check` says so; the loss objectives there of those complete at every seed of
        the study's, each its mean over them (`Storage.seed_means`: the first pass stands for the
        first seed at the proxy's budget; a stall-checked trial's shifted by its check)."""
        seeds = self.seeds_at(budget) if seeds is None else seeds
        while self.stop.signum is None:
            stored = {(p.trial_number, p.seed): p for p in self._at(budget)}
            now = time.time()
            wanted = [(n, seed) for n in chosen for seed in seeds]
            todo = [key for key in wanted if key not in stored or self._free(stored[key], now)]
            if todo:
                self._train(todo, budget, stall_check)
            elif any(stored[key].status == RUNNING for key in wanted):
                time.sleep(WAIT_S)  # another driver trains them: its results are read back
            else:
                break
        means = self.storage.seed_means(self.study, budget, self.seeds)
        return {n: m.objective for n, m in means.items() if n in chosen and m.objective is not None}

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

    def _train(self, todo: list[tuple[int, int]], budget: int, stall_check: bool = False) -> None:
        """Train each (trial number, seed) of `todo` at `budget`, those no other driver claims (as
        stall checks where `stall_check` says so)."""
        rows: dict[int, int] = {}

        def admit(index: int) -> bool:
            number, seed = todo[index]
            record = self.records[number]
            lease = self.options.lease_s
            claim = self.storage.claim_promotion(self.study, record.id, budget, lease, seed, stall_check)
            if claim is not None:
                return False  # finished or taken by another driver since it was listed
            rows[index] = self.storage.promotion_id(record.id, budget, seed)  # type: ignore[assignment]
            self.running += 1
            self._update(self.chosen)
            return True

        def done(index: int, result: dict[str, Any] | None, reason: str | None) -> None:
            number, seed = todo[index]
            self._store(rows[index], self.records[number], seed, result, reason)
            self.running -= 1
            self._update(self.chosen)

        def tick() -> None:
            if time.monotonic() - self.renewed >= self.options.lease_s / 4:
                self.storage.renew_promotions(self.options.lease_s)
                self.renewed = time.monotonic()

        requests = [
            (self._what(n, seed, budget), self._request(self.records[n], budget, seed, keep=not stall_check))
            for n, seed in todo
        ]
        try:
            self.pool.run_each(
                requests, retries=self.options.retries, stop=self.stop, done=done, admit=admit, tick=tick,
                task=long_run,
            )  # fmt: skip
        finally:
            if self.stop.signum is not None:  # what ran here is taken at once by `--resume`
                self.storage.release_promotions()

    def _what(self, number: int, seed: int, budget: int) -> str:
        """A promotion as logs name it: "trial 3 at 4,096 tokens" (", seed 8" for a seed repeat)."""
        return f"trial {number} at {budget:,} tokens" + (f", seed {seed}" if seed != self.seeds[0] else "")

    def settings_at(self, record: TrialRecord, seed: int) -> TrainSettings:
        """The settings `record`'s shape trains with at `seed`, its seed among them: those its run
        at the proxy's budget finished with, the trial's (`trial_settings`) at the first seed, a
        seed repeat's at another (the proxy's, or the stall retry's where that repeat stalled). A
        repeat not yet trained at the proxy's budget starts with the proxy's, as a trial does."""
        if seed == self.seeds[0]:
            return dataclasses.replace(trial_settings(self.spec, record), seed=seed)
        proxy = self.spec.proxy.tokens
        repeat = next(
            (p for p in self._at(proxy or 0) if (p.trial_number, p.seed) == (record.number, seed)), None
        )
        settings = self.spec.proxy if repeat is None else trial_settings(self.spec, repeat)
        return dataclasses.replace(settings, seed=seed)

    def _request(self, record: TrialRecord, budget: int, seed: int, keep: bool = True) -> dict[str, Any]:
        """A promotion's `long_run` request; with `keep`, resumed from and kept for the next rung
        where the settings allow (a stall check never climbs: it keeps nothing)."""
        assert record.config is not None
        settings = self.settings_at(record, seed)
        path = self.kept_state(record, seed) if settings.budget_free and keep else None
        longer = dataclasses.replace(settings, tokens=budget)
        return dict(
            config=record.config.to_dict(), settings=dataclasses.asdict(longer),
            data=self.spec.data, cpus=self.options.cpus_per_trial,
            checkpoint=str(path) if path is not None else None, keep=path is not None,
            # A seed repeat at the proxy's budget is trained as a trial: stalled, it is retried.
            stall=budget == self.spec.proxy.tokens and seed != self.seeds[0],
        )  # fmt: skip

    def _store(
        self, row: int, record: TrialRecord, seed: int, result: dict[str, Any] | None, reason: str | None
    ) -> None:
        if result is None or result["status"] != COMPLETE:
            why = reason if result is None else result.get("reason")
            self.storage.finish_promotion(row, status=FAILED, reason=why or "no result")
            assert record.number is not None
            log.warning("promotion of %s failed: %s", self._what(record.number, seed, self.budget), why)
            return
        assert record.config is not None
        curve = result["val_curve"]
        params = param_counts(record.config).total
        objective = self.spec.loss_rule.value(result["val_loss"], curve_change(curve), params)
        # A seed repeat trained again for stalling keeps the stall's note (`settings_at` reads it).
        if result.get("reason"):
            assert record.number is not None
            log.info("%s: %s", self._what(record.number, seed, self.budget), result["reason"])
        self.storage.finish_promotion(
            row, status=COMPLETE, val_loss=result["val_loss"], objective=objective, val_curve=curve,
            wall_time_s=result.get("wall_time_s"), resumed_tokens=result.get("resumed_tokens"),
            reason=result.get("reason"),
        )  # fmt: skip

    def kept_state(
        self, record: TrialRecord, seed: int | None = None, settings: TrainSettings | None = None
    ) -> Path:
        """Where `record`'s run at `seed` (None: the first pass's) kept its final state
        (`worker.kept_state_path`): the first pass's own, or a seed repeat's, each at the settings
        that seed trains with (`settings_at`; or `settings`, at `seed`)."""
        assert record.config is not None and record.number is not None
        seed = self.seeds[0] if seed is None else seed
        settings = (
            self.settings_at(record, seed) if settings is None else dataclasses.replace(settings, seed=seed)
        )
        return kept_state_path(
            self.study, self.created_at, record.number, record.config, settings, self.spec.data
        )

    def _forget(self, records: Any) -> None:
        """Delete the kept states of `records` on this machine, at every seed and at the proxy's
        settings and the stall retry's: no longer promoted (a seed repeat that stalled kept its
        stalled run's state)."""
        variants = (self.spec.proxy, stall_retry(self.spec.proxy))
        for record in records:
            if record.config is not None:
                for seed in self.seeds:
                    for settings in variants:
                        self.kept_state(record, seed, settings).unlink(missing_ok=True)


def tell_optuna(storage: Storage, study: str, budget: int, objectives: dict[int, float]) -> None:
    """Record the loss objectives of the contenders complete at `budget` (trial number -> value) on
    `study`'s Optuna study as its user attribute `promoted_loss_<budget>`; nothing when none is."""
    if not objectives:
        return
    import optuna

    optuna_study = optuna.load_study(study_name=study, storage=storage.optuna_storage())
    said = {str(number): float(value) for number, value in sorted(objectives.items())}  # JSON keys
    optuna_study.set_user_attr(OPTUNA_ATTR.format(tokens=budget), said)


def run_promotions(
    spec: SearchSpec, storage: Storage, options: SearchOptions, pool: RayPool, stop: Stop,
    progress: Callable[[], Any] | None = None,  # the driver's `SearchProgress` now
    on_update: Callable[[Any], None] | None = None,  # the search's display: PromotionProgress too
) -> PromotionSummary | None:  # fmt: skip
    """Promote the contenders of `options.study`'s finished trials (module docstring), on `pool`;
    `on_update` gets a `PromotionProgress` (over `progress()`, the search's) as promotions start
    and end.

    Returns:
        What promotion did; None when the study has no complete trial. `stopped` is
        "interrupted" when `stop` caught a signal (the promotions running were released).

    Raises:
        RayNodeDiedError: the local Ray node died (the promotions stored so far are kept).
        StorageUnavailableError: the database failed.
    """
    return _Promoter(spec, storage, options, pool, stop, progress, on_update).run()
