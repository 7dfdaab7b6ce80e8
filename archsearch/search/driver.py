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

Failure handling (BRIEF.md section 8):
- A worker that dies (SIGKILL, segfault, out of memory) is re-run by the driver up to `retries`
  times, each crash noted on the trial; after that the trial fails with the reason. Ray's own
  task retries are off, since they re-run silently and the crash would go unrecorded.
- An exception raised by the evaluation fails the trial with the exception as its reason.
- Ctrl-C or SIGTERM: no new trials are dispatched, running trials are cancelled and recorded as
  interrupted, and their parameters are re-queued in Optuna so `--resume` runs them first; the
  search returns the signal, and the CLI exits 130 / 143. Nothing is left RUNNING.
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
  `validate` and `ladder` run their long runs on the same pool (`_RayPool.run_each`), which
  checks the node the same way: its death ends them in one line, the runs stored so far kept.
- Ray must start (or the cluster of `--address` answer) within a bound (`raystart`).
- The first trials of a run all failing with the same error in the evaluation (a corpus the
  workers cannot read, a broken install) is a setup failure, not the shapes': the search stops
  with `SetupFailureError` and those trials are re-queued, so a `--resume` after the fix runs
  them.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from archsearch.errors import ArchsearchError, EnvironmentFailure, Terminated, quoted
from archsearch.search.pareto import StudyFront, pareto_mask, study_front
from archsearch.search.pruning import DEFAULT_REDUCTION_FACTOR, MultiObjectiveHalving
from archsearch.search.raystart import (
    RAY_START_ENV,
    RayStartTimeout,
    bounded,
    native_stderr_to,
    refused,
    shorten_ray_waits,
    start_bound,
    start_failure_cause,
)
from archsearch.search.reaper import Watcher, how_it_ended, local_raylet, node_died, ray_reaped
from archsearch.search.samplers import SAMPLERS
from archsearch.search.spec import SearchSpec
from archsearch.search.worker import TrialRequest, evaluate
from archsearch.space.config import ArchConfig
from archsearch.space.costs import flop_counts, kv_cache_bytes_per_token, param_counts
from archsearch.space.objectives import OBJECTIVE_COLUMNS, curve_change
from archsearch.space.search_space import Rejected
from archsearch.storage import (
    Storage,
    StorageUnavailableError,
    StudyExistsError,
    TrialRecord,
    ValueRefusedError,
    database_failure,
    failure_cause,
)
from archsearch.trial import COMPLETE, DUPLICATE, FAILED, INTERRUPTED, PRUNED, REJECTED, RUNNING, TrialOutcome
from archsearch.units import SEED_MAX, ray_resources_problem, short_number

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 120.0  # a running trial whose driver went silent this long is presumed dead
WAIT_S = 0.5  # how long the loop blocks on Ray: also how fast a Ctrl-C is noticed
MAX_REJECTIONS = 500  # rejected samples in a row before the search gives up on the sampler
# Finished trials of a run that all failed with one error in the evaluation, and none trained,
# before the search stops as a setup failure (fewer when the run asks for fewer, but at least 2).
SETUP_FAILURES = 3
EVALUATION_ERROR = "error in the evaluation: "  # `_RayPool.result`'s prefix of an exception's reason
# Where Ray's own log records go (appended), so a local search prints only archsearch's lines.
RAY_LOG = Path(tempfile.gettempdir()) / "archsearch" / "ray.log"
REASON_ATTR = "archsearch_reason"  # Optuna user attribute carrying a failed or pruned trial's reason
# Optuna constraint (`Trial.set_constraint`) of a sample that trained nothing: 1.0, infeasible.
# Samplers that read constraints (TPE, NSGA-II, GP) rank such points below every feasible one, and
# `study.best_trials` leaves them out; they are told as PRUNED, so no tool counts them as failures
# or as extra complete trials (a duplicate told COMPLETE again doubled its point on the front).
SKIPPED_CONSTRAINT = {REJECTED: "valid_shape", DUPLICATE: "new_shape"}


class SearchError(ArchsearchError):
    """A search that cannot start or continue (a study clash, a space the sampler cannot meet)."""


class RayNodeDiedError(SearchError, EnvironmentFailure):
    """The local Ray node (its raylet) died under the search; the running trials were re-queued."""


class RayStartError(SearchError, EnvironmentFailure):
    """Ray did not start here, or the cluster of `--address` could not be joined, within the bound."""


class SetupFailureError(SearchError, EnvironmentFailure):
    """Every trial of a run failed with the same error in the evaluation: the setup is at fault
    (the data, the install), not the shapes; those trials were re-queued."""


@dataclass(frozen=True)
class SearchOptions:
    """How to run a search; the spec's `[search]` table gives the defaults the CLI passes here."""

    study: str
    trials: int  # finished trials (complete, pruned or failed) the study should reach
    workers: int = 1  # trials in flight at once
    sampler: str = "tpe"
    seed: int = 0
    resume: bool = False  # continue a study of this name (created if missing)
    prune: bool = True
    address: str | None = None  # a Ray cluster to join; None starts a local one
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    retries: int = 1  # re-runs of a trial whose worker died
    lease_s: float = DEFAULT_LEASE_S
    replay: str | None = None  # a study of the same space whose complete shapes run first

    def __post_init__(self) -> None:
        # Printable: a line break in the name split the one error line and the command that
        # continues the search (quoted across two lines) in two.
        if not self.study or len(self.study) > 512 or not self.study.isprintable():
            raise SearchError(
                f"--study must be a name of 1 to 512 printable characters, got {quoted(self.study)}"
            )
        if self.trials < 1:
            raise SearchError(f"--trials must be at least 1, got {short_number(self.trials)}")
        if self.retries < 0:
            raise SearchError(f"--retries must be >= 0, got {short_number(self.retries)}")
        if problem := ray_resources_problem(
            self.cpus_per_trial, self.gpus_per_trial, "trial", self.workers, self.address
        ):
            raise SearchError(problem)
        if not 0 <= self.seed <= SEED_MAX:
            seed = short_number(self.seed)
            raise SearchError(f"--seed must be in 0..{SEED_MAX} (Optuna's seed range), got {seed}")
        if self.sampler not in SAMPLERS:
            raise SearchError(f"sampler {self.sampler!r} is unknown; valid: {', '.join(SAMPLERS.names())}")


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


@dataclass
class _Running:
    slot: int  # archsearch trial row id
    trial: Any  # optuna.Trial
    config: ArchConfig
    attempt: int = 1
    ref: Any = None
    started: float = field(default_factory=time.monotonic)


class _Stop:
    """Records the first SIGINT / SIGTERM; the loop polls it. `work` names what stops."""

    def __init__(self, work: str = "the search") -> None:
        self.signum: int | None = None
        self.work = work

    def __call__(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:  # a second signal: stop waiting for the clean-up
            raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt
        log.warning("received %s: stopping %s (again to force)", signal.Signals(signum).name, self.work)
        self.signum = signum


@contextmanager
def _signals(stop: _Stop) -> Iterator[None]:
    """Install SIGINT / SIGTERM handlers (after `ray.init`, which replaces SIGTERM's)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def start_local_ray(num_cpus: int, **kwargs: Any) -> None:
    """Start a new local Ray whose workers run at the driver's priority.

    Ray starts its workers at nice 15 (`RAY_worker_niceness`), which suits background jobs, not
    trials: on a machine with two CPU-bound processes beside it a trial got about 3% of a core, so
    its proxy crawled and its kernel timings measured a starved process. A value the user set in
    the environment is kept. `address="local"` always starts a new cluster (no address would join
    one that `ray start` left running).
    """
    import ray

    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **kwargs)


@contextmanager
def _ray_keeps_our_sigterm(ray: Any) -> Iterator[None]:
    """While `ray.init` runs, its SIGTERM handler is not installed (`ray._private.utils.
    set_sigterm_handler`, where this Ray has it): the caller's handler stays in charge."""
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    original = getattr(utils, "set_sigterm_handler", None)
    if original is None:
        yield
        return
    utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        utils.set_sigterm_handler = original


class _RayPool:
    """Ray tasks for trials: started (or joined) on enter, shut down on exit if started here.

    Ray's own messages (its token-authentication notice, worker warnings) go to `RAY_LOG`, not to
    the user's terminal; a Ray that fails to start says where to look. A local Ray started here
    is stopped when the driver ends, even by SIGKILL, and its node's death ends the search in
    one line, said by the driver (`check_node`) or, when Ray ended the driver first, by the
    watcher (`reaper`).
    """

    def __init__(
        self,
        options: SearchOptions,
        evaluate_fn: Callable[..., TrialOutcome],
        work: str = "the search",
        kept: str = "its running trials were re-queued",
    ) -> None:
        self.options = options
        self.evaluate_fn = evaluate_fn
        self.work = work  # what runs on the pool, and what its node's death leaves, for that line
        self.kept = kept
        self.owned = False
        self._stack = ExitStack()
        self.watcher: Watcher | None = None  # of a local Ray started here
        self._raylet: tuple[int, int] | None = None  # its node's raylet: (pid, start time)
        self.node_ended: str | None = None  # how that raylet ended, once it has

    def __enter__(self) -> _RayPool:
        bound = start_bound()
        shorten_ray_waits(bound)  # before Ray reads its settings, on import
        import ray

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if not ray.is_initialized():
            address = self.options.address
            where = f"join Ray at {address}" if address else "start a local Ray"
            why = refused(address) if address else None
            if why is not None:  # at once, rather than after Ray's connection attempts
                raise RayStartError(f"cannot {where}: nothing answers there ({why})")
            self._stack.enter_context(_ray_logs_to(RAY_LOG))
            self._stack.enter_context(_ray_errors_to(ray, RAY_LOG))
            kwargs: dict[str, Any] = dict(log_to_driver=False, configure_logging=False)
            # A signal while Ray starts is held until `ray.init` returns: raised at an arbitrary
            # point, a KeyboardInterrupt can land in a fork handler Ray's process start runs, where
            # Python prints and drops it, and the search went on. A second signal stops waiting.
            # `ray.init` also replaces SIGTERM's handler with one that exits 15: the caller's is
            # put back once Ray is up, and a SIGTERM while it starts ends as the caller's would.
            main = threading.current_thread() is threading.main_thread()
            held: list[int] = []

            def hold(signum: int, _frame: Any) -> None:
                if held:
                    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt
                held.append(signum)

            since = time.time()
            previous = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
            # `ray.init` would put its own SIGTERM handler (sys.exit, wherever the signal lands) in
            # place of ours: while it starts, it installs none.
            keep = _ray_keeps_our_sigterm(ray) if main else nullcontext()
            try:
                if address:
                    with keep, bounded(bound), native_stderr_to(RAY_LOG):
                        ray.init(address=address, **kwargs)
                else:
                    self.watcher = self._stack.enter_context(ray_reaped())
                    cpus = max(
                        os.cpu_count() or 1, math.ceil(self.options.workers * self.options.cpus_per_trial)
                    )
                    with keep, bounded(bound), native_stderr_to(RAY_LOG):
                        start_local_ray(cpus, **kwargs)
                    self._raylet = local_raylet(os.getpid())
            except BaseException as exc:  # the reaper (in the stack) stops what Ray started
                self._stack.close()
                # Ray's own exit hook (`ray.shutdown`, registered on import) was seen to wait without
                # end on a start that failed for want of memory, after the error line: with the
                # reaper done there is nothing left for it to stop.
                atexit.unregister(ray.shutdown)
                if held == [signal.SIGINT]:
                    raise KeyboardInterrupt from None
                if held or (isinstance(exc, SystemExit) and exc.code == signal.SIGTERM):
                    raise Terminated from None  # held, or Ray's own SIGTERM handler's exit
                if not isinstance(exc, (Exception, RayStartTimeout)):
                    raise
                raise RayStartError(self._start_failure(exc, where, bound, since)) from None
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)
            if held:  # Ray is up, and a signal came while it started: stop it and end as asked
                ray.shutdown()
                self._stack.close()
                raise Terminated if held[0] == signal.SIGTERM else KeyboardInterrupt
            self.owned = True
        self.ray = ray
        self.task = ray.remote(self.evaluate_fn).options(
            num_cpus=self.options.cpus_per_trial,
            num_gpus=self.options.gpus_per_trial,
            max_retries=0,  # the driver retries, so each crash is recorded (module docstring)
            retry_exceptions=False,
        )
        return self

    def _start_failure(self, exc: BaseException, where: str, bound: float, since: float) -> str:
        """Why Ray did not start: the bound that ran out, or Ray's error; and the cause a failed
        local start's own logs name (rather than Ray's guess, "some of the raylet failed to
        startup or the GCS has become overloaded"), else where Ray's messages went."""
        found = None if self.options.address else start_failure_cause(os.getpid(), since)
        if isinstance(exc, RayStartTimeout):
            late = f"Ray did not start within {bound:g} s (trying to {where}; ${RAY_START_ENV} sets it)"
            return late + (f"; the cause, from {found[1]}: {found[0]}" if found else f" ({RAY_LOG})")
        if found is not None:
            return f"cannot {where}: {found[0]} (from {found[1]})"
        return f"cannot {where}: {type(exc).__name__}: {_first_line(exc)} (Ray's messages: {RAY_LOG})"

    def __exit__(self, *exc: object) -> None:
        try:
            # Ray's shutdown asks the raylet to disconnect this driver; with the raylet dead, Ray
            # ends the process from C++ there (exit 1, before the error line): the watcher stops
            # what is left of the node instead.
            if self.owned and not self._node_gone():
                self.ray.shutdown()
        finally:
            self._stack.close()

    def arm(self, storage: Storage | None = None, continue_with: str | None = None) -> None:
        """Tell the watcher of a local Ray what to say if the node's death ends this process, and,
        with `storage`, to end the leases of this driver's running trials there."""
        if self.watcher is not None:
            self.watcher.arm(
                storage.url if storage else None, storage.host if storage else None, continue_with,
                work=self.work, kept=None if storage else self.kept,
            )  # fmt: skip

    def _node_gone(self) -> bool:
        """Whether the raylet of the local Ray started here has ended (noted in `node_ended`)."""
        if self.node_ended is None and self._raylet is not None:
            self.node_ended = how_it_ended(*self._raylet)
        return self.node_ended is not None

    def check_node(self) -> None:
        """Raise `RayNodeDiedError` once the raylet of the local Ray started here has ended.

        Called every turn of the loop, before a trial whose worker died is retried (a trial
        submitted to a dead node would wait forever), and when a call into Ray fails. A joined
        cluster's nodes are Ray's to watch: their deaths reach the driver as trial errors.
        """
        if self._node_gone():
            raise RayNodeDiedError(f"{node_died(self._raylet[0], self.node_ended, self.work)}; {self.kept}")

    @contextmanager
    def _call(self) -> Iterator[None]:
        """A call into Ray: one that fails because the local node died says so (`check_node`)."""
        try:
            yield
        except Exception:
            self.check_node()
            raise

    def board(self, pruner: MultiObjectiveHalving) -> Any:
        with self._call():
            return self.ray.remote(num_cpus=0)(_Board).remote(pruner)

    def submit(self, *args: Any) -> Any:
        """Start the task on `args` (a trial's request, what is known, the board; a run's request)."""
        with self._call():
            return self.task.remote(*args)

    def run_each(
        self,
        requests: list[tuple[str, Any]],
        *,
        retries: int,
        stop: _Stop,
        done: Callable[[int, Any, str | None], None],
        admit: Callable[[int], bool] | None = None,
        tick: Callable[[], None] | None = None,
    ) -> None:
        """Run each `(name, request)` as a task, `options.workers` at a time, in order; `done(index,
        result, reason)` as each finishes (None and the reason when it failed), after up to
        `retries` more tries of one whose worker died. Stops starting new ones once `stop` holds a
        signal, and cancels what runs when it returns or raises (the callers store each result in
        `done`, so what finished is kept). `validate` and `ladder` run their long runs so.
        `admit(index)` False just before a request would start leaves it out (another process has
        it); `tick()` runs every turn of the wait (half a second at most), to renew such claims.

        Raises:
            RayNodeDiedError: the local node died (checked every turn and before a retry: a task
                sent to a dead node would wait forever).
        """
        todo = list(enumerate(requests))
        running: dict[Any, tuple[int, int]] = {}  # ref -> index, attempt
        try:
            while stop.signum is None and (todo or running):
                self.check_node()
                while todo and len(running) < self.options.workers:
                    index, (_, request) = todo.pop(0)
                    if admit is None or admit(index):
                        running[self.submit(request)] = (index, 1)
                if tick is not None:
                    tick()
                if not running:
                    continue
                for ref in self.wait(list(running), 0.5):
                    index, attempt = running.pop(ref)
                    result, reason, died = self.result(ref)
                    if result is None and died and attempt <= retries:
                        self.check_node()
                        log.warning("%s: %s; retrying", requests[index][0], reason)
                        running[self.submit(requests[index][1])] = (index, attempt + 1)
                        continue
                    done(index, result, reason)
        finally:
            for ref in running:  # Ctrl-C, or the node died: what finished is stored; what runs is dropped
                self.cancel(ref)

    def put(self, value: Any) -> Any:
        with self._call():
            return self.ray.put(value)

    def wait(self, refs: list[Any], timeout: float) -> list[Any]:
        """The refs done within `timeout` (at least one, unless the time runs out)."""
        with self._call():
            ready, _ = self.ray.wait(refs, num_returns=1, timeout=timeout)
            rest = [r for r in refs if r not in ready]
            if ready and rest:  # collect any others that finished meanwhile, without waiting
                more, _ = self.ray.wait(rest, num_returns=len(rest), timeout=0)
                ready += more
        return ready

    def result(self, ref: Any) -> tuple[TrialOutcome | None, str | None, bool]:
        """(outcome, failure reason, whether the worker died and a retry may help)."""
        from ray import exceptions as rex

        try:
            return self.ray.get(ref), None, False
        except rex.RayTaskError as exc:
            cause = exc.cause if exc.cause is not None else exc
            return None, f"error in the evaluation: {type(cause).__name__}: {_first_line(cause)}", False
        except rex.RayError as exc:  # worker or node died, out of memory, object lost
            return None, f"worker died: {type(exc).__name__}: {_first_line(exc)}", True

    def cancel(self, ref: Any) -> None:
        if not self._node_gone():  # a dead node's workers are gone, and Ray would ask its raylet
            self.ray.cancel(ref, force=True)


class _Board:
    """The pruning state, in one Ray actor that every worker asks at each rung."""

    def __init__(self, pruner: MultiObjectiveHalving) -> None:
        self.pruner = pruner

    def decide(self, number: int, rung: int, loss: float, flops: float) -> str | None:
        return self.pruner.decide(number, rung, loss, flops)

    def record(self, number: int, rung: int, loss: float, flops: float) -> None:
        self.pruner.record(number, rung, loss, flops)


class _RayRecordsToFile(logging.Handler):
    """Python's last-resort log handler, but with the `ray` loggers' records sent to a file.

    `ray.init(configure_logging=False)` clears the `ray` logger's handlers, so Ray's warnings (its
    token-authentication notice, worker warnings) reach stderr through `logging.lastResort`; this
    stands in for it, leaving every other logger's records where they went.
    """

    def __init__(self, path: Path, fallback: logging.Handler | None) -> None:
        super().__init__(logging.WARNING)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = logging.FileHandler(path, delay=True)  # the file appears once Ray says something
        self.file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.fallback = fallback

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "ray" or record.name.startswith("ray."):
            self.file.handle(record)
        elif self.fallback is not None:
            self.fallback.handle(record)

    def close(self) -> None:
        self.file.close()
        super().close()


@contextmanager
def _ray_logs_to(path: Path) -> Iterator[None]:
    """Ray's log records go to `path` (appended) instead of stderr while inside."""
    fallback = logging.lastResort
    handler = _RayRecordsToFile(path, fallback)
    logging.lastResort = handler
    try:
        yield
    finally:
        logging.lastResort = fallback
        handler.close()


@contextmanager
def _ray_errors_to(ray: Any, path: Path) -> Iterator[None]:
    """The errors Ray publishes to the driver (a raylet's death with its log's tail, a monitor's
    traceback), which Ray's error thread prints to stdout whatever `log_to_driver` says, are
    appended to `path` instead (`ray._private.worker.print_to_stdstream`, where this Ray has it).

    For as long as Ray stays connected: after a node's death the driver skips Ray's shutdown
    (`_RayPool.__exit__`), and the thread lives on until the process ends.
    """
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    original = getattr(worker, "print_to_stdstream", None)
    if original is None:
        yield
        return

    def to_file(data: dict[str, Any], ignore_prefix: bool = False) -> None:
        with open(path, "a") as handle:
            handle.writelines(f"({data.get('pid')}) {line}\n" for line in data.get("lines", ()))

    worker.print_to_stdstream = to_file
    try:
        yield
    finally:
        if not ray.is_initialized():
            worker.print_to_stdstream = original


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1 if type(exc).__name__ == "RayTaskError" else 0][:500] if lines else ""


def _unusable_objectives(outcome: TrialOutcome) -> str:
    """Why a complete outcome cannot be told to Optuna (`objective_values` gave None)."""
    loss = (outcome.train or {}).get("val_loss")
    if loss is not None and not math.isfinite(loss):
        return f"non-finite loss: the proxy loss is {loss}"
    step_time = outcome.step_time_s
    if step_time is not None and not math.isfinite(step_time):
        return f"non-finite step time: {step_time}"
    return "an objective is missing"


def with_serve_times(spec: SearchSpec, cfg: ArchConfig, outcome: TrialOutcome) -> TrialOutcome:
    """A complete outcome with its serving times, modelled under the spec's [serve] scenario when
    its device is a catalogued GPU (pure and instant: the driver computes them, no worker)."""
    serve = spec.serve
    if outcome.status != COMPLETE or serve is None or not serve.modelled:
        return outcome
    from archsearch.evaluators.serving import scenario_report

    report = scenario_report(cfg, serve)
    return replace(outcome, prefill_time_s=report.prefill.time_s, decode_time_s=report.decode.time_s)


def objective_values(
    spec: SearchSpec, record: TrialRecord | TrialOutcome, cfg: ArchConfig
) -> list[float] | None:
    """The Optuna values of a complete trial in the spec's objective order, or None if any is missing.

    The loss is the spec's loss objective (`spec.loss_rule`, `objectives.loss_objective`): the
    proxy loss, extrapolated by its curve's last change and credited for size as the spec says;
    the trial's row keeps the proxy loss as measured.
    """
    if isinstance(record, TrialOutcome):
        train = record.train or {}
        loss, change = train.get("val_loss"), curve_change(train.get("val_curve") or ())
        step_time, prefill, decode = record.step_time_s, record.prefill_time_s, record.decode_time_s
    else:
        loss, change, step_time = record["loss"], record["loss_change"], record["step_time_s"]
        prefill, decode = record["prefill_time_s"], record["decode_time_s"]
    if loss is not None:
        loss = spec.loss_rule.value(loss, change, param_counts(cfg).total)
    by_name = {
        "loss": loss,
        "flops": float(flop_counts(cfg).forward),
        "step_time": step_time,
        "kv_bytes": float(kv_cache_bytes_per_token(cfg)),
        "prefill_time": prefill,
        "decode_time": decode,
    }
    values = [by_name[name] for name in spec.objectives]
    if any(v is None or not math.isfinite(v) for v in values):
        return None
    return [float(v) for v in values]


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
        self.stop = _Stop()
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
        """Refuse a study clash before Ray starts, from a read (`open_study` checks again, atomically).

        Ray starts before the study is created, so a Ctrl-C or a failure while it starts leaves
        no empty study behind for a plain rerun to refuse. Optuna's tables are opened here too, so
        tables this Optuna cannot use (a newer Optuna's) are refused before Ray starts.
        """
        name = self.options.study
        self.storage.optuna_storage()
        if self.options.replay is not None:
            self._check_replay(self.options.replay)
        record = self.storage.study(name)
        found = self.storage.optuna_objectives(name)
        if record is None:
            if found is not None:  # never adopted: its trials are not archsearch's
                raise SearchError(
                    f"{self.storage.display_url} holds an Optuna study {name!r} that archsearch did not "
                    "create: choose another --study"
                )
            self._new_study = True
            return
        if found is not None and found != len(record.objectives):
            raise SearchError(
                f"Optuna's study {name!r} has {found} objective(s), archsearch's {len(record.objectives)} "
                f"({', '.join(record.objectives)}): the database was changed outside archsearch"
            )
        if not self.options.resume:
            raise SearchError(
                f"study {self.options.study!r} already exists ({record.finished} finished trials): pass "
                "--resume to continue it, or choose another --study"
            )
        self._check_fingerprint(record.spec_fingerprint)

    def _check_fingerprint(self, found: str) -> None:
        if found != self.spec.fingerprint:
            raise SearchError(
                f"study {self.options.study!r} was created from a different space file (fingerprint "
                f"{found[:12]}, this one {self.spec.fingerprint[:12]}): use another --study"
            )

    def open_study(self) -> None:
        """Create or load the study (archsearch's record, then Optuna's). A new study whose
        creation fails part-way is removed again where the database still allows it, so a
        plain rerun is not refused as a clash with an empty study."""
        try:
            self._open_study()
        except BaseException:
            self.discard_new_study()
            raise

    def discard_new_study(self) -> None:
        """Remove the study this driver created, if it still holds no trial: what fails before the
        first trial (a signal included) leaves no empty study for a plain rerun to clash with."""
        import optuna

        if not self._new_study:
            return
        with contextlib.suppress(Exception):  # best effort: the database may be what failed
            if self.storage.discard_empty_study(self.options.study):
                ostorage = self.storage.optuna_storage()
                study_id = ostorage.get_study_id_from_name(self.options.study)
                if not ostorage.get_all_trials(study_id, deepcopy=False):
                    optuna.delete_study(study_name=self.options.study, storage=ostorage)

    def _open_study(self) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        name, spec = self.options.study, self.spec
        try:  # atomic: of drivers starting one study together, one creates it, the others see it
            record = self.storage.create_study(
                name, spec_fingerprint=spec.fingerprint, spec_source=spec.source, spec=spec.to_dict(),
                objectives=spec.objectives, exist_ok=self.options.resume,
            )  # fmt: skip
        except StudyExistsError as exc:
            raise SearchError(f"{exc}: pass --resume to continue it, or choose another --study") from None
        self._check_fingerprint(record.spec_fingerprint)
        ostorage = self.storage.optuna_storage()
        # Trials recorded so far (any driver's); counted from archsearch's table because another
        # driver may not have created Optuna's study yet.
        existing = sum(self.storage.counts(name).values())
        seed = self.options.seed + existing  # drivers joining a study sample their own streams
        sampler = SAMPLERS[self.options.sampler](seed, len(spec.objectives))
        self.storage.add_search_run(name, {**asdict(self.options), "sampler_seed": seed})
        self.study = optuna.create_study(
            study_name=name,
            storage=ostorage,
            directions=["minimize"] * len(spec.objectives),
            sampler=sampler,
            load_if_exists=True,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self.study.set_metric_names(list(spec.objectives))  # shown by optuna-dashboard
        if self.options.replay is not None:
            self._enqueue_replay(self.options.replay)

    def _enqueue_replay(self, source: str) -> None:
        """Queue the complete shapes of study `source` (same space), in trial order, ahead of the
        sampler's: the same shapes under another proxy (seed, precision, tokens), to compare them
        shape for shape. A shape this study already holds (a resumed replay) is not queued again."""
        import optuna

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # skip_if_exists
            for trial in self.storage.trials(source, status=COMPLETE):
                origin = {"replayed_from": f"{source}#{trial.number}"}
                self.study.enqueue_trial(trial.params, user_attrs=origin, skip_if_exists=True)

    def _check_replay(self, source: str) -> None:
        """Refuse a --replay study that is missing, this one, or of another space: before Ray starts
        (`check_study`), not after it (seconds of start-up spent on a typo)."""
        record = self.storage.study(source, counts=False)
        if record is None:
            raise SearchError(f"--replay: no study {source!r} in this database")
        if source == self.options.study:
            raise SearchError("--replay names the study being searched; name another study")
        if record.spec.get("space") != self.spec.space.to_dict():
            raise SearchError(
                f"--replay: study {source!r} searched another space (its [model], [rules] or [budget] "
                "differ), so its shapes are not points of this one"
            )

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
    def run(self, pool: _RayPool) -> int | None:
        opts, spec = self.options, self.spec
        board = None
        if opts.prune and spec.defaults.rungs:
            records = self.storage.trials(opts.study)  # the rungs earlier runs reached
            pruner = MultiObjectiveHalving(
                spec.defaults.rungs, spec.defaults.prune_min_trials, DEFAULT_REDUCTION_FACTOR
            )
            self._restore_rungs(pruner, records)
            board = pool.board(pruner)
        known = self.storage.measurements()
        known_ref = pool.put(known)
        rejections = 0
        finished = False  # a trial ended since the last display: show it once the slot is refilled
        failure: BaseException | None = None
        with _signals(self.stop):
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
        )

    def _submit(
        self, pool: _RayPool, item: _Running, known_ref: Any, board: Any, note: str | None = None
    ) -> None:
        self.doing = f"starting trial {item.trial.number}"
        item.attempt = self.storage.start_attempt(item.slot, self.options.lease_s, note)
        item.ref = pool.submit(self._request(item), known_ref, board)
        self.running[item.ref] = item
        self._in_hand = None

    def _collect(self, pool: _RayPool, ref: Any, known_ref: Any, board: Any) -> list[dict[str, Any]]:
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
            outcome = replace(outcome, status=FAILED, reason=_unusable_objectives(outcome))
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

    def _interrupt_all(self, pool: _RayPool, failure: BaseException | None = None) -> None:
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
        with _RayPool(options, evaluate_fn or evaluate) as pool:
            driver.open_study()
            try:
                pool.arm(storage, continue_with)
                driver.doing = "sweeping the trials a stopped driver left"
                driver.sweep()
            except BaseException:  # Ctrl-C or SIGTERM before the run's own handlers (probe 9) too
                driver.discard_new_study()
                raise
            signum = driver.run(pool)
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
    )
