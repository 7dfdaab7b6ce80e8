"""The search driver: owns the Optuna study (ask / tell), dispatches trials to Ray, records results.

How a trial flows:
1. `Storage.claim_trial` reserves a slot (a running row with a lease) only while fewer than
   `trials` are finished or running, in one transaction, so drivers sharing a study never
   overshoot the requested number.
2. `study.ask()`; the space samples every knob and derives the shape. A point that is not a valid
   or in-budget config is recorded as rejected before any compute is spent, and a shape already
   trained as a duplicate; Optuna is told both as PRUNED with an infeasible constraint
   (`SKIPPED_CONSTRAINT`).
3. A Ray task runs `worker.evaluate` on a `worker.TrialRequest` and returns a `trial.TrialOutcome`;
   the driver renews the lease while it runs.
4. The result is written in one transaction (`Storage.finish_trial`), then told to Optuna.

Failure handling (a run must end with nothing left RUNNING and every outcome recorded):
- A worker that dies (SIGKILL, segfault, out of memory) is re-run by the driver up to `retries`
  times, each crash noted on the trial; after that the trial fails with the reason. Ray's own
  task retries are off, since they re-run silently and the crash would go unrecorded.
- An exception raised by the evaluation fails the trial with the exception as its reason.
- Ctrl-C or SIGTERM: no new trials are dispatched, running trials are cancelled and recorded as
  interrupted, and their parameters are re-queued in Optuna so `--resume` runs them first; the
  search returns the signal, and the CLI exits 130 / 143. Nothing is left RUNNING.
- `[search] promote`: once the trials are finished, the front's contenders are trained on at
  longer budgets on the same pool (`promote_run`), each promotion stored as it ends; a signal
  stops it as it stops trials, and `--resume` trains only what is missing.
- A driver killed outright leaves running rows whose lease then expires; the next driver on the
  study (`--resume`) marks them interrupted and re-queues them, and settles Optuna trials left
  RUNNING between the two writes. A resume that finds such a row before its lease expires waits
  for it (it says how long), sweeping as it goes, so it ends with the trials asked for finished
  and nothing running; a row whose lease is renewed (every quarter lease) belongs to a live
  driver, which records it: the resume stops waiting for it once it sees the renewal.
- A shape already running or trained in the study, by this driver or another, is not trained
  again: `Storage.assign_trial` checks under the study's lock and the point is a duplicate.
- A database that fails under any write or read of the loop (archsearch's or inside Optuna's
  calls: a server gone, a lock held past the timeout, a full disk) stops the search: running
  trials are cancelled, and they and the trial whose outcome was being written are re-queued
  as on an interrupt where the database still takes it (else `--resume` re-queues them once
  their lease expires); `run_search` raises `StorageUnavailableError`, one line naming the
  database, what was being done and the cause. A value the database refuses in a trial's
  outcome fails that trial with the reason, and the search goes on.
- The local Ray node dying under the driver (its raylet killed, by a memory limit say) stops the
  search with `RayNodeDiedError`: the running trials are re-queued and Ray is not asked to shut
  down (asking a dead raylet ends the process from C++). Where Ray's core worker ends the driver
  first, the watcher of the local Ray says so in one line and ends the trials' leases (`reaper`).
  `validate` and `ladder` run their long runs on the same pool (`pool.RayPool.run_each`), which
  checks the node the same way: its death ends them in one line, the runs stored so far kept.
- Ray must start (or the cluster of `--address` answer) within a bound (`raystart`). A resume
  whose trials are all in starts its local Ray only when a promotion is left to train.
- The first trials of a run all failing with the same error in the evaluation (a corpus the
  workers cannot read, a broken install) is a setup failure, not the shapes': the search stops
  with `SetupFailureError` and those trials are re-queued, so a `--resume` after the fix runs
  them.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from archsearch.errors import EnvironmentFailure
from archsearch.search import study_open
from archsearch.search.objective_values import objective_values, unusable_objectives, with_serve_times
from archsearch.search.options import SearchOptions
from archsearch.search.pareto import StudyFront, pareto_mask, study_front
from archsearch.search.pool import (
    EVALUATION_ERROR,
    RayNodeDiedError,
    RayPool,
    SearchError,
    Stop,
    handle_signals,
)
from archsearch.search.promote_run import PromotionSummary, run_promotions
from archsearch.search.pruning import DEFAULT_REDUCTION_FACTOR, MultiObjectiveHalving
from archsearch.search.spec import SearchSpec
from archsearch.search.worker import TrialRequest, evaluate
from archsearch.space.config import ArchConfig
from archsearch.space.costs import flop_counts, param_counts
from archsearch.space.objectives import OBJECTIVE_COLUMNS, curve_change
from archsearch.space.search_space import Rejected
from archsearch.storage import (
    Storage,
    StorageUnavailableError,
    TrialRecord,
    ValueRefusedError,
    database_failure,
    failure_cause,
)
from archsearch.trial import COMPLETE, DUPLICATE, FAILED, INTERRUPTED, PRUNED, REJECTED, RUNNING, TrialOutcome

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

WAIT_S = 0.5  # how long the loop blocks on Ray: also how fast a Ctrl-C is noticed
MAX_REJECTIONS = 500  # rejected samples in a row before the search gives up on the sampler
# Finished trials of a run that all failed with one error in the evaluation, and none trained,
# before the search stops as a setup failure (fewer when the run asks for fewer, but at least 2).
SETUP_FAILURES = 3
REASON_ATTR = "archsearch_reason"  # Optuna user attribute carrying a failed or pruned trial's reason
# Optuna constraint (`Trial.set_constraint`) of a sample that trained nothing: 1.0, infeasible.
# Samplers that read constraints (TPE, NSGA-II, GP) rank such points below every feasible one, and
# `study.best_trials` leaves them out; they are told as PRUNED, so no tool counts them as failures
# or as extra complete trials (a duplicate told COMPLETE again doubled its point on the front).
SKIPPED_CONSTRAINT = {REJECTED: "valid_shape", DUPLICATE: "new_shape"}


class SetupFailureError(SearchError, EnvironmentFailure):
    """Every trial of a run failed with the same error in the evaluation: the setup is at fault
    (the data, the install), not the shapes; those trials were re-queued."""


def search_eta(wall_times_s: Sequence[float], remaining: int, workers: int) -> float | None:
    """Seconds until `remaining` more trials have finished, `workers` at a time: the mean wall time
    of the finished trials `wall_times_s` per wave of `workers` trials, `remaining / workers`
    waves, and never less than one wave while a trial remains (the last trials run side by side
    but each still takes a trial's time).

    The mean, not the median: pruned and failed trials end early, and the mix of short and full
    trials so far is the best guess of the mix to come. A trial's wall time runs from its claim
    (its sampling, for the driver's own trials) to its result, retries included, so time spent
    queued for a GPU (`--gpus-per-trial`) is in it, and the estimate holds when Ray runs fewer
    than `workers` trials at once. Running trials count as remaining
    whole: the estimate errs long by up to one trial's time.

    Returns:
        0.0 when nothing remains; None while no trial has finished (nothing to estimate from).

    Raises:
        ValueError: `workers` below 1.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if remaining <= 0:
        return 0.0
    if not wall_times_s:
        return None
    mean = math.fsum(wall_times_s) / len(wall_times_s)
    return mean * max(1.0, remaining / workers)


@dataclass(frozen=True)
class SearchProgress:
    """A snapshot for progress displays."""

    target: int
    counts: dict[str, int]
    best_loss: float | None
    front_size: int
    elapsed_s: float
    workers: int = 1  # trials run at once (--workers)
    wall_times_s: tuple[float, ...] = ()  # of the study's finished trials (`Storage.wall_times`)

    @property
    def finished(self) -> int:
        return sum(self.counts.get(s, 0) for s in (COMPLETE, PRUNED, FAILED))

    @property
    def eta_s(self) -> float | None:
        """Seconds until `target` trials have finished (`search_eta`); None before the first."""
        return search_eta(self.wall_times_s, self.target - self.finished, self.workers)


@dataclass(frozen=True)
class SearchSummary:
    study: str
    objectives: tuple[str, ...]
    progress: SearchProgress
    front: StudyFront | None  # the Pareto front of the complete trials (None: no complete trial)
    signal: int | None = None  # the signal that stopped the search early
    promotion: PromotionSummary | None = None  # what `[search] promote` trained; None: off or not reached


@dataclass
class _Running:
    slot: int  # archsearch trial row id
    trial: Any  # optuna.Trial
    config: ArchConfig
    attempt: int = 1
    ref: Any = None
    started: float = field(default_factory=time.monotonic)


class _Driver:
    def __init__(
        self,
        spec: SearchSpec,
        storage: Storage,
        options: SearchOptions,
        on_update: Callable[[SearchProgress], None] | None,
    ) -> None:
        self.spec, self.storage, self.options, self.on_update = spec, storage, options, on_update
        self.running: dict[Any, _Running] = {}
        self.stop = Stop()
        self.start = time.monotonic()
        self.last_renewal = time.monotonic()
        self.study: optuna.Study
        # Complete trials' proxy loss then their objective values (the loss objective may credit size).
        self._values: list[list[float]] | None = None
        self._wall_times: list[float] | None = None  # finished trials' wall times, as `_values`
        self._leases_seen: dict[int, float | None] = {}  # other drivers' trials: lease at first sight
        self._waited = False  # the wait for a dead driver's leases was announced
        # What a database failure would leave half-done, for `_interrupt_all` to settle:
        self.doing = "opening the study"  # the step under way, for the failure's message
        self._claimed: int | None = None  # a slot claimed, its trial not yet asked or closed
        self._asked: Any = None  # an Optuna trial asked for `_claimed`, not yet recorded
        self._in_hand: _Running | None = None  # a trial off `running` whose outcome is not yet written
        self._failed_here: list[tuple[_Running, str]] = []  # this run's failed trials, while none trained
        self._trained_here = 0  # this run's complete or pruned trials
        self.left: list[str] = []  # what a failure left for `--resume` (its lease) to settle
        self._new_study = False  # no study of this name when the driver started (`check_study`)

    # --- setup -----------------------------------------------------------------------------------
    def check_study(self) -> None:
        """Refuse a study clash before Ray starts (`study_open.check_study`)."""
        self._new_study = study_open.check_study(self.storage, self.spec, self.options)

    @property
    def new_study(self) -> bool:
        """No study of this name when the driver started (`check_study`)."""
        return self._new_study

    def open_study(self) -> None:
        """Create or load the study; a new one whose creation fails part-way is removed again."""
        self.study = study_open.open_study(self.storage, self.spec, self.options, self._new_study)
        self._created_at = self.storage.require_study(self.options.study).created_at  # kept states' key

    def discard_new_study(self) -> None:
        """Remove the study this driver created, if it still holds no trial."""
        if self._new_study:
            study_open.discard_new_study(self.storage, self.options.study)

    def sweep(self) -> None:
        """Settle what a dead driver left: expired leases and Optuna trials left RUNNING."""
        import optuna

        self._sweep_leases()
        by_number = {r.number: r for r in self.storage.trials(self.options.study) if r.number is not None}
        horizon = time.time() - self.options.lease_s
        for frozen in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            record = by_number.get(frozen.number)
            if record is not None and record.status == RUNNING:
                continue  # a live driver's trial
            if record is None and frozen.datetime_start and frozen.datetime_start.timestamp() > horizon:
                continue  # may be another driver's, asked a moment ago
            self._tell_recorded(frozen.number, record)

    def _sweep_leases(self) -> None:
        """Re-queue the trials whose lease expired: their driver stopped without closing them."""
        import optuna

        for record in self.storage.stale_trials(self.options.study):
            self.storage.end_trial(
                record.id,
                INTERRUPTED,
                f"lease expired: the driver running it ({record['host']}) stopped; re-queued",
            )
            if record.number is not None:
                self._settle_optuna(record.number, optuna.trial.TrialState.FAIL, reason="driver died")
                if record.params:
                    self.study.enqueue_trial(record.params, user_attrs={"requeued_from": record.number})

    def _tell_recorded(self, number: int, record: TrialRecord | None) -> None:
        """Tell Optuna what archsearch's table already holds for a trial Optuna still has RUNNING."""
        import optuna

        state = optuna.trial.TrialState
        if record is not None and record.status == COMPLETE and record.config is not None:
            values = objective_values(self.spec, record, record.config)
            if values is not None:
                self.study.tell(number, values)
                return
        if record is not None and record.status == PRUNED:
            self._settle_optuna(number, state.PRUNED, record.reason)
        elif record is not None and record.status in SKIPPED_CONSTRAINT:
            self._tell_skipped(self._trial_id(number), record.status, record.reason or record.status)
        else:
            self._settle_optuna(number, state.FAIL, record.reason if record else "never recorded")

    def _settle_optuna(self, number: int, state: Any, reason: str | None) -> None:
        import optuna

        try:
            if reason:
                self.study._storage.set_trial_user_attr(self._trial_id(number), REASON_ATTR, reason)
            self.study.tell(number, state=state)
        except (ValueError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
            pass  # already finished by another driver

    def _trial_id(self, number: int) -> int:
        return self.study._storage.get_trial_id_from_study_id_trial_number(self.study._study_id, number)

    # --- the loop ---------------------------------------------------------------------------------
    def run(self, pool: RayPool) -> int | None:
        opts, spec = self.options, self.spec
        pruner = None
        if opts.prune and spec.defaults.rungs:
            records = self.storage.trials(opts.study)  # the rungs earlier runs reached
            pruner = MultiObjectiveHalving(
                spec.defaults.rungs, spec.defaults.prune_min_trials, DEFAULT_REDUCTION_FACTOR
            )
            self._restore_rungs(pruner, records)
        known = self.storage.measurements()
        # What every trial reads from Ray's object store, put there as the first trial starts:
        # a resume with nothing left to train never starts a lazy pool's Ray.
        known_ref: Any = None
        board: Any = None  # the pruning actor, made with `known_ref`
        rejections = 0
        finished = False  # a trial ended since the last display: show it once the slot is refilled
        failure: BaseException | None = None
        with handle_signals(self.stop):
            try:
                while self.stop.signum is None:
                    started = len(self.running)
                    while len(self.running) < opts.workers and self.stop.signum is None:
                        self.doing = "claiming a trial slot"
                        slot = self.storage.claim_trial(opts.study, opts.trials, opts.lease_s)
                        if slot is None:
                            break
                        item = self._ask(slot)
                        if item is None:
                            rejections += 1
                            if rejections >= MAX_REJECTIONS:
                                if self.running:
                                    break  # wait: a running trial that fails frees its shape
                                raise SearchError(
                                    f"the {opts.sampler} sampler proposed {rejections} rejected or already "
                                    "evaluated configs in a row: the space may be exhausted; widen it or "
                                    "loosen the budget (see `archsearch space check`)"
                                )
                            continue
                        rejections = 0
                        if known_ref is None:
                            board = None if pruner is None else pool.board(pruner)
                            known_ref = pool.put(known)
                        self._submit(pool, item, known_ref, board)
                    if finished or len(self.running) > started:
                        self._notify()  # displays count running trials from the first one on
                        finished = False
                    if not self.running:
                        if self.stop.signum is None and self._wait_for_dead_leases():
                            continue
                        break
                    ready = pool.wait(list(self.running), WAIT_S)
                    pool.check_node()
                    for ref in ready:
                        new = self._collect(pool, ref, known_ref, board)
                        if new:
                            known.update({m["key"]: m["seconds"] for m in new})
                            known_ref = pool.put(known)
                    self._renew()
                    finished = bool(ready)
            except BaseException as exc:
                failure = exc
                raise
            finally:
                self._interrupt_all(pool, failure)
        self._notify()
        return self.stop.signum

    def _wait_for_dead_leases(self) -> bool:
        """Nothing to claim and nothing running here: wait while trials another driver left
        running may be a dead driver's, sweeping them once their leases expire; False once there
        is nothing left to wait for.

        A trial whose lease was renewed since this driver first saw it has a live driver, which
        records it; one whose lease only runs out was left by a driver that stopped, and is
        re-queued here when it expires (at most `lease_s` from its last renewal), so a resume
        ends with the trials asked for finished and nothing running.
        """
        pending = []
        for record in self.storage.trials(self.options.study, RUNNING):
            lease = record["lease_expires_at"]
            first = self._leases_seen.setdefault(record.id, lease)
            if lease is not None and first is not None and lease <= first:
                pending.append((lease, record))
        if not pending:
            return False
        if not self._waited:
            lease, record = min(pending, key=lambda item: item[0])
            log.warning(
                "%d trial(s) left running by a driver that may have stopped (trial %s, host %s): "
                "waiting up to %.0f s for the lease to expire, then running it here",
                len(pending), record.number, record["host"], max(0.0, lease - time.time()),
            )  # fmt: skip
            self._waited = True
        time.sleep(WAIT_S)
        # Leases only: settling Optuna trials left RUNNING here could tell a live driver's trial
        # between its database write and its own tell, over and over (`sweep` does it at start).
        self._sweep_leases()
        return True

    def _restore_rungs(self, pruner: MultiObjectiveHalving, records: list[TrialRecord]) -> None:
        """Seed the pruner with the rung losses of trials a previous run finished."""
        evals = self.spec.proxy.evals
        for record in records:
            if record.status not in (COMPLETE, PRUNED) or record.config is None:
                continue
            flops = float(flop_counts(record.config).forward)
            params = param_counts(record.config).total
            val = self.storage.curves(record.id)["val"]
            judged = -1
            for k, (_tokens, loss) in enumerate(val, start=1):
                rung = pruner.rung_at(k / evals)
                if rung is not None and rung > judged:
                    told = self.spec.loss_rule.value(loss, curve_change(val[:k]), params)  # as the worker
                    pruner.record(record.number, rung, told, flops)
                    judged = rung

    def _ask(self, slot: int) -> _Running | None:
        self._claimed = slot
        self.doing = "asking Optuna for a trial"
        trial = self._asked = self.study.ask()
        self.doing = f"sampling trial {trial.number}"
        try:
            cfg = self.spec.space.sample(trial)
        except Rejected as exc:
            self.doing = f"recording trial {trial.number} (rejected)"
            self.storage.assign_trial(
                slot, number=trial.number, optuna_trial_id=trial._trial_id, params=trial.params, config=None
            )
            self.storage.end_trial(slot, REJECTED, str(exc))
            self._claimed = None
            self._tell_skipped(trial._trial_id, REJECTED, f"rejected: {exc}")
            self._asked = None
            return None
        self.doing = f"recording trial {trial.number}"
        same = self.storage.assign_trial(
            slot, number=trial.number, optuna_trial_id=trial._trial_id, params=trial.params, config=cfg
        )
        if same is not None:
            # Samplers re-propose points of small categorical spaces, and drivers sharing a study
            # sample the same points; a seeded proxy run would repeat the same result, so nothing
            # is trained twice (running or finished, here or in another driver: the storage
            # checks under the study's lock) and the sampler is steered away.
            self.storage.end_trial(slot, DUPLICATE, f"same shape as trial {same}: its result is reused")
            self._claimed = None
            self._tell_skipped(trial._trial_id, DUPLICATE, f"duplicate of trial {same}")
            self._asked = None
            return None
        # From here `_submit` puts it in `running` (or `_in_hand` holds it): settled from there.
        self._in_hand, self._claimed, self._asked = _Running(slot=slot, trial=trial, config=cfg), None, None
        return self._in_hand

    def _request(self, item: _Running) -> TrialRequest:
        spec = self.spec
        return TrialRequest(
            number=item.trial.number,
            config=item.config,
            proxy=spec.proxy,
            profile=spec.profile,
            data=spec.data,
            step_time_device=spec.step_time_device if "step_time" in spec.objectives else None,
            rungs=spec.defaults.rungs,
            loss_rule=spec.loss_rule,
            cpus=self.options.cpus_per_trial,  # caps a CPU trial's threads (worker.trial_cores)
            keep_state=spec.defaults.promote is not None,  # promotion goes on from the final state
            study=self.options.study,
            created_at=self._created_at,
        )

    def _submit(
        self, pool: RayPool, item: _Running, known_ref: Any, board: Any, note: str | None = None
    ) -> None:
        self.doing = f"starting trial {item.trial.number}"
        item.attempt = self.storage.start_attempt(item.slot, self.options.lease_s, note)
        item.ref = pool.submit(self._request(item), known_ref, board)
        self.running[item.ref] = item
        self._in_hand = None

    def _collect(self, pool: RayPool, ref: Any, known_ref: Any, board: Any) -> list[dict[str, Any]]:
        import optuna

        item = self._in_hand = self.running.pop(ref)  # until its outcome is written
        outcome, reason, died = pool.result(ref)
        if died:
            pool.check_node()  # the node itself died: no retry, the trial is re-queued
        if outcome is None:
            if died and item.attempt <= self.options.retries:
                log.warning("trial %d: %s; retrying", item.trial.number, reason)
                self._submit(pool, item, known_ref, board, note=f"attempt {item.attempt}: {reason}")
                return []
            outcome = TrialOutcome(status=FAILED, reason=reason)
        outcome = with_serve_times(self.spec, item.config, outcome)
        values = objective_values(self.spec, outcome, item.config) if outcome.status == COMPLETE else None
        if outcome.status == COMPLETE and values is None:
            outcome = replace(outcome, status=FAILED, reason=unusable_objectives(outcome))
        self.doing = f"recording trial {item.trial.number}"
        # Optuna's attributes first: once the row is finished, another driver's start-up sweep may
        # tell Optuna this trial from the database, after which its attributes are read-only.
        self._describe(item.trial, item.config, outcome)
        try:
            self.storage.finish_trial(item.slot, outcome)
        except ValueRefusedError as exc:  # the outcome's fault, not the database's: the search goes on
            reason = f"its results could not be stored: {exc}"
            outcome, values = TrialOutcome(status=FAILED, reason=reason), None
            self.storage.end_trial(item.slot, FAILED, reason)
            item.trial.set_user_attr(REASON_ATTR, reason)
        self._in_hand = None  # written: a failure from here leaves Optuna to `sweep` (`_tell_recorded`)
        state = optuna.trial.TrialState
        # skip_if_finished: another driver starting up may have told Optuna this trial from the
        # database already, between the write above and this tell (`sweep`).
        if self._wall_times is not None:
            self._wall_times.append(time.monotonic() - item.started)
        if values is not None:
            self.study.tell(item.trial, values, skip_if_finished=True)
            if self._values is not None:
                self._values.append([float(outcome.train["val_loss"]), *values])
        else:
            final = state.PRUNED if outcome.status == PRUNED else state.FAIL
            self.study.tell(item.trial, state=final, skip_if_finished=True)
        self._check_setup(item, outcome)
        return list(outcome.measurements)

    def _check_setup(self, item: _Running, outcome: TrialOutcome) -> None:
        """Stop (`SetupFailureError`) once this run's first trials all failed with one error in
        the evaluation and none trained: the setup is at fault, and they are re-queued.

        A failure the trainer reports (a NaN loss, out of memory) is the shape's and never
        counts: only an exception the evaluation raised does.
        """
        if outcome.status in (COMPLETE, PRUNED):
            self._trained_here += 1
        if self._trained_here or outcome.status != FAILED:
            return
        self._failed_here.append((item, outcome.reason or ""))
        reasons = {reason for _, reason in self._failed_here}
        needed = max(2, min(SETUP_FAILURES, self.options.trials))
        if len(reasons) != 1 or len(self._failed_here) < needed:
            return
        (reason,) = reasons
        if not reason.startswith(EVALUATION_ERROR):
            return
        self.doing = "re-queueing the trials the setup failed"
        for failed, _ in self._failed_here:
            why = f"{reason}; the setup failed, not the shape: re-queued"
            self.storage.end_trial(failed.slot, INTERRUPTED, why)
            self.study.enqueue_trial(failed.trial.params, user_attrs={"requeued_from": failed.trial.number})
        numbers = ", ".join(str(f.trial.number) for f, _ in self._failed_here)
        raise SetupFailureError(
            f"the first {len(self._failed_here)} trials of this run all failed with the same {reason} "
            f"(trials {numbers}, re-queued): fix the setup, then resume"
        )

    def _tell_skipped(self, trial_id: int, status: str, reason: str) -> None:
        """Tell Optuna of a sample that trained nothing (`SKIPPED_CONSTRAINT`).

        Its row is finished first (`end_trial`), so another driver's start-up sweep may tell Optuna
        the same from the database in between (`_tell_recorded`): a trial already finished is left
        as that driver told it, as `_settle_optuna` leaves one.
        """
        import optuna

        ostorage = self.study._storage
        try:
            ostorage.set_trial_user_attr(trial_id, REASON_ATTR, reason)
            ostorage.set_trial_system_attr(trial_id, f"constraints:{SKIPPED_CONSTRAINT[status]}", 1.0)
            self.study.tell(ostorage.get_trial_number_from_id(trial_id), state=optuna.trial.TrialState.PRUNED)
        except (ValueError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
            pass  # already finished by another driver

    @staticmethod
    def _describe(trial: optuna.trial.Trial, cfg: ArchConfig, outcome: TrialOutcome) -> None:
        """What Optuna's tools (optuna-dashboard) show of a trained trial: a complete trial's eval
        curve as intermediate values (step = tokens trained), and the shape, its size and cost, its
        step time and the reason it stopped as user attributes.

        A pruned trial gets no intermediate values: TPE ranks pruned trials by their last one
        through `study.direction`, which a multi-objective study does not have (Optuna 5.0 raises
        at the next sample; the quick start's search crashed so once it had pruned a trial).
        """
        train = outcome.train or {}
        curve = train.get("val_curve") or () if outcome.status == COMPLETE else ()
        for tokens, loss in curve:
            if math.isfinite(loss):
                trial.storage.set_trial_intermediate_value(trial._trial_id, int(tokens), float(loss))
        attrs = {
            "shape": cfg.describe(),
            "params": param_counts(cfg).total,
            "flops_per_token": float(flop_counts(cfg).forward),
            "step_time_s": outcome.step_time_s,
            "step_time_device": outcome.step_time_device,
            "prefill_time_s": outcome.prefill_time_s,
            "decode_time_s": outcome.decode_time_s,
            "proxy_loss": train.get("val_loss") if outcome.status == COMPLETE else None,  # the row's loss
            REASON_ATTR: outcome.reason,
        }
        for key, value in attrs.items():
            if value is not None:
                trial.set_user_attr(key, value)

    def _renew(self) -> None:
        if time.monotonic() - self.last_renewal >= self.options.lease_s / 4:
            self.doing = "renewing the running trials' leases"
            self.storage.renew_leases([r.slot for r in self.running.values()], self.options.lease_s)
            self.last_renewal = time.monotonic()

    def _interrupt_all(self, pool: RayPool, failure: BaseException | None = None) -> None:
        """Cancel what still runs; record it, and a trial whose outcome was not written, as
        interrupted and re-queue its parameters; close a slot claimed but not yet running.

        After a database failure (`failure`) this is best effort: the first write that fails
        ends it, and what is left stays running with its lease, which `--resume` sweeps
        (`self.left` says which).
        """
        import optuna

        for ref in self.running:
            pool.cancel(ref)
        if failure is not None and database_failure(failure):
            why = "the database failed"
        elif isinstance(failure, RayNodeDiedError):
            why = "the local Ray node died"
        elif self.stop.signum:
            why = f"interrupted by {signal.Signals(self.stop.signum).name}"
        else:
            why = "the driver stopped"
        items = [*self.running.values(), *([self._in_hand] if self._in_hand is not None else [])]
        fail = optuna.trial.TrialState.FAIL
        try:
            if self._claimed is not None:
                self.storage.end_trial(self._claimed, INTERRUPTED, f"{why} while sampling")
                self._claimed = None
            if self._asked is not None:
                self.study.tell(self._asked, state=fail, skip_if_finished=True)
                self._asked = None
            while items:
                item = items[0]
                self.storage.end_trial(item.slot, INTERRUPTED, f"{why}; re-queued")
                item.trial.set_user_attr(REASON_ATTR, why)
                self.study.tell(item.trial, state=fail, skip_if_finished=True)
                self.study.enqueue_trial(item.trial.params, user_attrs={"requeued_from": item.trial.number})
                items.pop(0)
        except Exception as exc:
            if failure is None or not database_failure(exc):
                raise
            self.left = [f"trial {item.trial.number}" for item in items]
            if self._claimed is not None:
                self.left.append("a claimed slot")
            log.debug("re-queueing after the database failed: %s", exc)
        self.running.clear()
        self._in_hand = None

    def progress(self) -> SearchProgress:
        """Counts from the database (every driver's trials); the best proxy loss and the front's
        size (over the objectives Optuna is told) from the complete trials' values, and the ETA
        from the finished trials' wall times, both read once and then kept in memory (no records
        are read per event; another driver's trials count in the counts only)."""
        if self._values is None:
            self._values = []
            columns = ["params_total", "loss_change", *(OBJECTIVE_COLUMNS[o] for o in self.spec.objectives)]
            for params, change, *row in self.storage.complete_values(self.options.study, columns)[1]:
                told = [math.nan if x is None else float(x) for x in row]  # loss first
                if params and math.isfinite(told[0]):
                    told[0] = self.spec.loss_rule.value(told[0], change, params)
                self._values.append([math.nan if row[0] is None else float(row[0]), *told])
        if self._wall_times is None:  # earlier runs' trials too, so a resume has an ETA at once
            self._wall_times = self.storage.wall_times(self.options.study)
        values = np.array(self._values, dtype=float).reshape(-1, 1 + len(self.spec.objectives))
        return SearchProgress(
            target=self.options.trials,
            counts={**self.storage.counts(self.options.study), RUNNING: len(self.running)},
            best_loss=float(np.nanmin(values[:, 0])) if len(values) else None,
            front_size=int(pareto_mask(values[:, 1:]).sum()),
            elapsed_s=time.monotonic() - self.start,
            workers=self.options.workers,
            wall_times_s=tuple(self._wall_times),
        )

    def pass_finished(self) -> bool:
        """Whether the study's trials are all in: `trials` finished and none running anywhere."""
        counts = self.storage.counts(self.options.study)
        return sum(
            counts.get(s, 0) for s in (COMPLETE, PRUNED, FAILED)
        ) >= self.options.trials and not counts.get(RUNNING)

    def _notify(self) -> None:
        if self.on_update is not None:
            self.doing = "counting the trials"
            self.on_update(self.progress())

    def failure(self, exc: BaseException) -> StorageUnavailableError:
        """The one-line error for a database that failed under this driver (`database_failure`)."""
        left = (
            f"; {', '.join(self.left)} left running until the lease expires ({self.options.lease_s:.0f} s), "
            "then a resume re-queues them"
            if self.left
            else ""
        )
        return StorageUnavailableError(
            f"the database {self.storage.display_url} failed while {self.doing}: {failure_cause(exc)}; "
            f"the search stopped{left}"
        )


def run_search(
    spec: SearchSpec,
    storage: Storage,
    options: SearchOptions,
    *,
    on_update: Callable[[SearchProgress], None] | None = None,
    evaluate_fn: Callable[..., TrialOutcome] | None = None,
    continue_with: str | None = None,
) -> SearchSummary:
    """Run (or resume) a search until the study has `options.trials` finished trials.

    Args:
        spec: the parsed space file; call `spec.space.check_feasible()` before opening storage.
        storage: the trial database.
        options: study name, trial count, workers, sampler, Ray settings.
        on_update: called with a `SearchProgress` after every event, for progress displays.
        evaluate_fn: the Ray task body; `worker.evaluate` by default (benchmarks pass a no-op).
        continue_with: the command that continues this search, for the line the watcher of a
            local Ray prints if the node's death ends this process (`reaper`).

    Returns:
        A `SearchSummary`; `signal` is set when SIGINT / SIGTERM stopped it early.

    Raises:
        SearchError: the study exists without `resume`, was made from another space, or the
            sampler cannot find valid configs.
        SpecError: the `[proxy] data` corpus cannot be used (`SearchSpec.check_data`).
        SetupFailureError: the run's first trials all failed with one error in the evaluation.
        RayNodeDiedError: the local Ray node died under the search.
        ReadOnlyStorageError: the database cannot be written here.
        DamagedStorageError: the SQLite file is damaged (checked before anything is written).
        StorageError: Optuna's tables are a newer Optuna's (refused before anything is written).
        StorageUnavailableError: the database failed during the search (module docstring).
    """
    storage.require_writable()  # a read-only database fails here, before anything is written
    storage.check_intact()  # so does a damaged file (Optuna's pages too)
    threads = spec.proxy.threads
    if threads is not None and threads > options.cpus_per_trial:
        log.warning(
            "[proxy] threads = %d is more than the %g CPUs each trial is given (--cpus-per-trial): "
            "CPU trials side by side will wait on each other's cores",
            threads, options.cpus_per_trial,
        )  # fmt: skip
    spec.preflight()  # a corpus or proxy batch no trial could use fails here, before any trial
    driver = _Driver(spec, storage, options, on_update)
    try:
        driver.check_study()
        # A resume whose trials are all in needs Ray only for promotions still to train, so its
        # local Ray starts when one does (never, when every promotion is stored). A new study's or
        # an unfinished one's starts first, before anything is written; a cluster (`--address`) is
        # joined at once, so one that does not answer is said as before.
        lazy = not driver.new_study and options.address is None and driver.pass_finished()
        with RayPool(options, evaluate_fn or evaluate, lazy=lazy) as pool:
            driver.open_study()
            try:
                pool.arm(storage, continue_with)
                driver.doing = "sweeping the trials a stopped driver left"
                driver.sweep()
            except BaseException:  # Ctrl-C or SIGTERM before the run's own handlers are in place too
                driver.discard_new_study()
                raise
            signum = driver.run(pool)
            promotion = None
            if signum is None and spec.defaults.promote is not None and driver.pass_finished():
                driver.doing = "promoting the front's contenders"
                with handle_signals(driver.stop):
                    promotion = run_promotions(
                        spec, storage, options, pool, driver.stop, driver.progress, on_update
                    )
                signum = driver.stop.signum
    except Exception as exc:
        if database_failure(exc):
            raise driver.failure(exc) from None
        raise
    return SearchSummary(
        study=options.study,
        objectives=spec.objectives,
        progress=driver.progress(),
        front=study_front(storage, options.study, spec.objectives),
        signal=signum,
        promotion=promotion,
    )
