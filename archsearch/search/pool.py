"""The pool of Ray tasks that a search, `validate` and `ladder` run their work on.

`RayPool` starts a local Ray (or joins a cluster) on enter, or at its first use where it is
lazy, and stops what it started on exit, even when the driver is killed (`reaper`); Ray's own
messages go to `ray_logs.RAY_LOG`. A task whose worker died is retried by the caller, so each
crash is recorded; the local node's death ends the work in one line (`RayNodeDiedError`).
`Stop` and `handle_signals` turn the first SIGINT / SIGTERM into a flag the caller's loop polls,
and a second one into an immediate stop.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

from archsearch.errors import ArchsearchError, EnvironmentFailure, Terminated
from archsearch.search.ray_logs import RAY_LOG, ray_errors_to, ray_logs_to
from archsearch.search.raystart import (
    RAY_START_ENV,
    RayStartTimeout,
    bounded,
    native_stderr_to,
    refused,
    shortened_ray_waits,
    start_bound,
    start_failure_cause,
)
from archsearch.search.reaper import Watcher, how_it_ended, local_raylet, node_died, ray_reaped

if TYPE_CHECKING:
    from archsearch.search.pruning import MultiObjectiveHalving
    from archsearch.storage import Storage

log = logging.getLogger(__name__)

EVALUATION_ERROR = "error in the evaluation: "  # `RayPool.result`'s prefix of an exception's reason


class SearchError(ArchsearchError):
    """A search that cannot start or continue (a study clash, a space the sampler cannot meet)."""


class RayNodeDiedError(SearchError, EnvironmentFailure):
    """The local Ray node (its raylet) died under the search; the running trials were re-queued."""


class RayStartError(SearchError, EnvironmentFailure):
    """Ray did not start here, or the cluster of `--address` could not be joined, within the bound."""


class PoolOptions(Protocol):
    """What the pool reads of a search's, a validation's or a ladder's options."""

    @property
    def address(self) -> str | None: ...  # a Ray cluster to join; None starts a local one

    @property
    def workers(self) -> int: ...  # tasks at once

    @property
    def cpus_per_trial(self) -> float: ...

    @property
    def gpus_per_trial(self) -> float: ...


class Stop:
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
def handle_signals(stop: Stop) -> Iterator[None]:
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


class RayPool:
    """Ray tasks for trials: started (or joined) on enter, shut down on exit if started here.

    Ray's own messages (its token-authentication notice, worker warnings) go to `RAY_LOG`, not to
    the user's terminal; a Ray that fails to start says where to look. A local Ray started here
    is stopped when the driver ends, even by SIGKILL, and its node's death ends the search in
    one line, said by the driver (`check_node`) or, when Ray ended the driver first, by the
    watcher (`reaper`).
    """

    def __init__(
        self,
        options: PoolOptions,
        evaluate_fn: Callable[..., Any],
        work: str = "the search",
        kept: str = "its running trials were re-queued",
        *,
        lazy: bool = False,
    ) -> None:
        self.options = options
        # Lazy: Ray starts at the first call that needs it (`start`), not on enter, so a resumed
        # search with nothing left to train never pays a local Ray's start (seconds of CPU).
        self.lazy = lazy
        self.started = False
        self._armed: tuple[Storage | None, str | None] | None = None  # `arm`'s, until Ray is up
        self.evaluate_fn = evaluate_fn
        self.work = work  # what runs on the pool, and what its node's death leaves, for that line
        self.kept = kept
        self.owned = False
        self._stack = ExitStack()
        self.watcher: Watcher | None = None  # of a local Ray started here
        self._raylet: tuple[int, int] | None = None  # its node's raylet: (pid, start time)
        self.node_ended: str | None = None  # how that raylet ended, once it has

    def __enter__(self) -> RayPool:
        if not self.lazy:
            self.start()
        return self

    def start(self) -> None:
        """Start a local Ray or join the cluster of `address` (at once, unless `lazy`); nothing
        once done. A signal that comes while Ray starts is held until `ray.init` returns; then it
        goes to the caller's `Stop` where one is in place (a lazy start inside a search's loop),
        else it ends the start (`KeyboardInterrupt` / `Terminated`)."""
        if self.started:
            return
        bound = start_bound()
        with shortened_ray_waits(bound):  # read by Ray on import and as it starts; put back after
            self._start(bound)

    def _start(self, bound: float) -> None:
        import ray

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if not ray.is_initialized():
            address = self.options.address
            where = f"join Ray at {address}" if address else "start a local Ray"
            why = refused(address) if address else None
            if why is not None:  # at once, rather than after Ray's connection attempts
                raise RayStartError(f"cannot {where}: nothing answers there ({why})")
            self._stack.enter_context(ray_logs_to(RAY_LOG))
            self._stack.enter_context(ray_errors_to(ray, RAY_LOG))
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
            caller = previous.get(held[0]) if held else None
            if held and not isinstance(caller, Stop):
                # Ray is up, and a signal came while it started: stop it and end as asked
                ray.shutdown()
                self._stack.close()
                raise Terminated if held[0] == signal.SIGTERM else KeyboardInterrupt
            self.owned = True
            if isinstance(caller, Stop):  # the caller's loop stops as it would have a moment later
                caller(held[0], None)
        self.ray = ray
        self.task = ray.remote(self.evaluate_fn).options(
            num_cpus=self.options.cpus_per_trial,
            num_gpus=self.options.gpus_per_trial,
            max_retries=0,  # the driver retries, so each crash is recorded (this module's docstring)
            retry_exceptions=False,
        )
        self.started = True
        if self._armed is not None:
            self.arm(*self._armed)

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
        with `storage`, to end the leases of this driver's running trials there (once Ray is up,
        when it starts lazily)."""
        self._armed = (storage, continue_with)
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
        """A call into Ray, which starts it where it has not (`lazy`): one that fails because the
        local node died says so (`check_node`)."""
        self.start()
        try:
            yield
        except Exception:
            self.check_node()
            raise

    def board(self, pruner: MultiObjectiveHalving) -> Any:
        with self._call():
            return self.ray.remote(num_cpus=0)(Board).remote(pruner)

    def submit(self, *args: Any) -> Any:
        """Start the task on `args` (a trial's request, what is known, the board; a run's request)."""
        with self._call():
            return self.task.remote(*args)

    def run_each(
        self,
        requests: list[tuple[str, Any]],
        *,
        retries: int,
        stop: Stop,
        done: Callable[[int, Any, str | None], None],
        admit: Callable[[int], bool] | None = None,
        tick: Callable[[], None] | None = None,
        task: Callable[[Any], Any] | None = None,
    ) -> None:
        """Run each `(name, request)` as a task, `options.workers` at a time, in order; `done(index,
        result, reason)` as each finishes (None and the reason when it failed), after up to
        `retries` more tries of one whose worker died. Stops starting new ones once `stop` holds a
        signal, and cancels what runs when it returns or raises (the callers store each result in
        `done`, so what finished is kept). `validate` and `ladder` run their long runs so.
        `admit(index)` False just before a request would start leaves it out (another process has
        it); `tick()` runs every turn of the wait (half a second at most), to renew such claims.
        `task`: the function each request runs, with the pool's resources; None: the pool's own.

        Raises:
            RayNodeDiedError: the local node died (checked every turn and before a retry: a task
                sent to a dead node would wait forever).
        """
        self.start()  # before any request is admitted: a failed start leaves no claim behind
        todo = list(enumerate(requests))
        running: dict[Any, tuple[int, int]] = {}  # ref -> index, attempt
        submit = self.submit if task is None else self._submitter(task)
        try:
            while stop.signum is None and (todo or running):
                self.check_node()
                while todo and len(running) < self.options.workers:
                    index, (_, request) = todo.pop(0)
                    if admit is None or admit(index):
                        running[submit(request)] = (index, 1)
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
                        running[submit(requests[index][1])] = (index, attempt + 1)
                        continue
                    done(index, result, reason)
        finally:
            for ref in running:  # Ctrl-C, or the node died: what finished is stored; what runs is dropped
                self.cancel(ref)

    def _submitter(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """`submit` for another function than the pool's, on the same resources per task."""
        with self._call():
            remote = self.ray.remote(fn).options(
                num_cpus=self.options.cpus_per_trial, num_gpus=self.options.gpus_per_trial,
                max_retries=0, retry_exceptions=False,
            )  # fmt: skip

        def submit(request: Any) -> Any:
            with self._call():
                return remote.remote(request)

        return submit

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

    def result(self, ref: Any) -> tuple[Any, str | None, bool]:
        """(outcome, failure reason, whether the worker died and a retry may help)."""
        from ray import exceptions as rex

        try:
            return self.ray.get(ref), None, False
        except rex.RayTaskError as exc:
            cause = exc.cause if exc.cause is not None else exc
            return None, f"{EVALUATION_ERROR}{type(cause).__name__}: {_first_line(cause)}", False
        except rex.RayError as exc:  # worker or node died, out of memory, object lost
            return None, f"worker died: {type(exc).__name__}: {_first_line(exc)}", True

    def cancel(self, ref: Any) -> None:
        if not self._node_gone():  # a dead node's workers are gone, and Ray would ask its raylet
            self.ray.cancel(ref, force=True)


class Board:
    """The pruning state, in one Ray actor that every worker asks at each rung."""

    def __init__(self, pruner: MultiObjectiveHalving) -> None:
        self.pruner = pruner

    def decide(self, number: int, rung: int, loss: float, flops: float) -> str | None:
        return self.pruner.decide(number, rung, loss, flops)

    def record(self, number: int, rung: int, loss: float, flops: float) -> None:
        self.pruner.record(number, rung, loss, flops)


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1 if type(exc).__name__ == "RayTaskError" else 0][:500] if lines else ""
