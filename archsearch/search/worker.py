"""What a Ray worker does for one trial: train the proxy, profile the step, return plain data.

`evaluate` maps a `TrialRequest` (the shape and the search's settings, frozen) to a
`trial.TrialOutcome`; Ray pickles both across the process boundary. It never touches the database
or Optuna: the driver owns both, so a retried or crashed task can never create, duplicate or
strand a trial: Ray retries a task whose worker died, and a task that asked Optuna for its own
trial would leave one RUNNING per retry (docs/explanations/stack-pitfalls.md).

Determinism: the proxy run is seeded (the same request gives the same loss on the same device);
kernel times are medians of repeats and vary with machine load; modelled step times are exact
functions of the shape.

Stalled runs: a proxy run whose held-out loss is still within `STALL_MARGIN` of the unigram loss
(what token frequencies alone score, `Dataset.unigram_loss`) at half its budget, after at least
`STALL_MIN_STEPS` optimizer steps and `STALL_MIN_TOKENS` tokens, has learned nothing of context:
with the proxy's short warm-up some shapes (post-norm ReLU MLPs at the tiny example's rate) sit on
that plateau for the whole run, yet train as well as their neighbours at 10x, whose warm-up is 10
times longer. Such a run is stopped and trained again from scratch with a `STALL_WARMUP` warm-up
(the warm-up of a 10x run of the tiny proxy); its result is the trial's, and its reason says so. A
run stalled at that warm-up too is a shape that does not train at this rate, and stands. Promotion's
seed repeats at the proxy's budget follow the same rule (`stall_reason`, judged on the whole run).

Threads: a CPU trial trains and profiles on `[proxy] threads` torch threads, or on the count
`settings.choose_threads` picks for its shape within the CPUs Ray gave it (`trial_cores`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from archsearch.search.pruning import rung_at
from archsearch.space.config import ArchConfig
from archsearch.space.costs import flop_counts, param_counts
from archsearch.space.objectives import LossRule, curve_change
from archsearch.trial import COMPLETE, FAILED, PRUNED, STALLED, TrialOutcome

if TYPE_CHECKING:
    from archsearch.evaluators.settings import TrainSettings
    from archsearch.search.spec import ProfileSpec


@dataclass(frozen=True)
class TrialRequest:
    """What the driver asks of a worker for one trial.

    Attributes:
        number: the trial's number (the pruning board's key).
        config: the shape.
        proxy: the proxy run's settings.
        profile: where step times are measured (local) or modelled (devices).
        data: the corpus path; None: the bundled corpus.
        step_time_device: "local", a catalogue name, or None when step time is not an objective.
        rungs: the pruning fractions of the proxy budget; empty: no pruning.
        loss_rule: the study's loss objective (`objectives.LossRule`), which the rungs judge:
            the loss at the rung, extrapolated by the curve's change so far and credited for size.
        cpus: the CPUs Ray gave the trial, which cap its threads; None: see `trial_cores`.
        keep_state: leave a complete run's final state at `kept_state_path`, for promotion to go on
            from (only where the settings are `budget_free`: another budget could not resume it).
        study: the study's name; with `created_at` and `number`, whose state `keep_state` keeps.
        created_at: the study's creation time (`StudyRecord.created_at`).
    """

    number: int
    config: ArchConfig
    proxy: TrainSettings
    profile: ProfileSpec
    data: str | None = None
    step_time_device: str | None = None
    rungs: tuple[float, ...] = ()
    loss_rule: LossRule = dataclasses.field(default_factory=LossRule)
    cpus: float | None = None
    keep_state: bool = False
    study: str = ""
    created_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready): the config as `ArchConfig.to_dict`, settings as their fields."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out.update(
            config=self.config.to_dict(),
            proxy=dataclasses.asdict(self.proxy),
            profile=dataclasses.asdict(self.profile),
            rungs=list(self.rungs),
            loss_rule=dataclasses.asdict(self.loss_rule),
        )
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialRequest:
        """The inverse of `to_dict`; settings are validated as they are built.

        Raises:
            ConfigError: an invalid shape. TrainError, SpecError: an invalid setting.
        """
        from archsearch.evaluators.settings import TrainSettings
        from archsearch.search.spec import ProfileSpec

        values = dict(data)
        profile = dict(values["profile"])
        profile["devices"] = tuple(profile.get("devices") or ())
        values.update(
            config=ArchConfig.from_dict(values["config"]),
            proxy=TrainSettings(**values["proxy"]),
            profile=ProfileSpec(**profile),
            rungs=tuple(values.get("rungs") or ()),
            loss_rule=LossRule(**(values.get("loss_rule") or {})),
        )
        return cls(**values)


# A run within this many nats of the unigram loss has learned nothing beyond token frequencies.
STALL_MARGIN = 0.1
# Judged at half the budget or later, and only in runs that by then have taken this many optimizer
# steps on this many tokens: a run too short to leave the plateau (a smoke test's few thousand
# tokens) is short, not stalled. The tiny proxy has 59 steps and 120,832 tokens by half.
STALL_MIN_STEPS = 30
STALL_MIN_TOKENS = 50_000
STALL_WARMUP = 0.5  # the retry's warm-up fraction (59 of the tiny proxy's 118 steps)


def stall_retry(settings: TrainSettings) -> TrainSettings:
    """The settings a stalled run is trained again with: a `STALL_WARMUP` fraction of its budget
    as warm-up (a warm-up in tokens is replaced by it). Promotion trains a stalled trial on with
    them too."""
    return dataclasses.replace(settings, warmup=STALL_WARMUP, warmup_tokens=None)


def may_stall(settings: TrainSettings) -> bool:
    """Whether a run of `settings` is checked for the plateau: where `stall_retry` would warm up
    longer."""
    return settings.warmup_tokens is not None or settings.warmup < STALL_WARMUP


def kept_state_path(
    study: str, created_at: float, number: int, config: ArchConfig, settings: TrainSettings, data: str | None
) -> Path:
    """Where trial `number` of `study` (created at `created_at`) keeps its final state for promotion:
    `cache_dir()/checkpoints/kept-KEY.pt`, KEY the sha256 of the study's name and creation time,
    the trial's number, the config, the settings but for what a budget-free run may change
    (threads, tokens, FLOPs, evaluation count) and the corpus path, so a run of the same shape and
    settings at any token budget finds it (`trainer.Checkpoint(keep=True)`).

    The study and trial are in the key because a trial starts by deleting the state at its key:
    two studies sharing a cache (two searches of one space and seed, two test processes) would
    otherwise delete and overwrite each other's. The creation time tells apart studies of one
    name in two databases."""
    from archsearch.evaluators.data import cache_dir

    free = ("threads", "tokens", "flops", "evals")
    fixed = {k: v for k, v in dataclasses.asdict(settings).items() if k not in free}
    what = json.dumps([study, created_at, number, config.to_dict(), fixed, data], sort_keys=True, default=str)
    return cache_dir() / "checkpoints" / f"kept-{hashlib.sha256(what.encode()).hexdigest()}.pt"


def on_plateau(val_loss: float, unigram_loss: float, half_tokens: float, tokens_per_step: int) -> bool:
    """Whether a held-out loss sits on the unigram plateau, in a run long enough to be judged
    stalled at half its budget (`half_tokens` trained by then, `tokens_per_step` per step).

    The rule of the module docstring; `benchmarks/proxy_fidelity.py` applies it to recorded runs.
    """
    long_enough = half_tokens >= max(STALL_MIN_TOKENS, STALL_MIN_STEPS * tokens_per_step)
    return long_enough and val_loss >= unigram_loss - STALL_MARGIN


def stalls(fraction: float, tokens: int, val_loss: float, unigram_loss: float, tokens_per_step: int) -> bool:
    """Whether a run is judged stalled at its evaluation at `fraction` of its budget (`tokens`
    trained, `val_loss` there): at half its budget or later, on the plateau (`on_plateau`)."""
    half_tokens = tokens * 0.5 / fraction
    return fraction >= 0.5 and on_plateau(val_loss, unigram_loss, half_tokens, tokens_per_step)


def stalled_at(
    curve: Sequence[Sequence[float]], evals: int, unigram_loss: float, tokens_per_step: int
) -> tuple[int, float] | None:
    """Where a finished run is judged stalled, as `run_trial` judges it while it trains: the first
    (tokens, held-out loss) of its `curve`, the i-th at (i + 1) / `evals` of its budget, that
    `stalls`; None where none does. A run stopped there would have ended with the same verdict."""
    for i, (tokens, loss) in enumerate(curve):
        if stalls((i + 1) / evals, int(tokens), float(loss), unigram_loss, tokens_per_step):
            return int(tokens), float(loss)
    return None


def stall_note(settings: TrainSettings, tokens: int, loss: float, unigram_loss: float) -> str:
    """The reason of a run of `settings` stalled at `loss` after `tokens` and trained again: it
    starts with `STALLED`, which is how a reader tells such a run's settings (`stall_retry`'s)."""
    warmup = (
        f"{settings.warmup:.0%}" if settings.warmup_tokens is None else f"{settings.warmup_tokens:,}-token"
    )
    return (
        f"{STALLED} ({loss:.3f} nats after {tokens:,} tokens with a "
        f"{warmup} warm-up; token frequencies alone score {unigram_loss:.3f}): "
        f"trained again with a {STALL_WARMUP:.0%} warm-up"
    )


def stall_reason(
    config: ArchConfig, settings: TrainSettings, data: str | None, curve: Sequence[Sequence[float]]
) -> str | None:
    """Why a complete run of `config` at `settings` on corpus `data` (None: the bundled one), whose
    held-out curve is `curve`, is trained again with `stall_retry`'s settings, as a search's trial
    is (`stall_note`); None where it is not: it left the plateau, it was too short to tell, or
    its settings warm up as long as the retry (`may_stall`)."""
    if not may_stall(settings):
        return None
    seq_len = settings.seq_len or config.seq_len
    unigram = _unigram_loss(data, config.vocab_size, seq_len)
    point = stalled_at(curve, settings.evals, unigram, settings.batch_size * seq_len)
    return None if point is None else stall_note(settings, *point, unigram)


@functools.lru_cache(maxsize=4)
def worker_dataset(path: str | None, vocab_size: int, seq_len: int) -> Any:
    """One open dataset per worker process: Ray reuses workers, so later trials skip the scan."""
    from archsearch.evaluators.data import load_dataset

    return load_dataset(path, None if path is None else vocab_size, seq_len=seq_len)


@functools.lru_cache(maxsize=4)
def _unigram_loss(path: str | None, vocab_size: int, seq_len: int) -> float:
    """`Dataset.unigram_loss` of `worker_dataset`'s corpus, counted once per worker process."""
    return worker_dataset(path, vocab_size, seq_len).unigram_loss()  # type: ignore[no-any-return]


def evaluate(
    request: TrialRequest, known_kernels: dict[str, float] | None = None, board: Any = None
) -> TrialOutcome:
    """The Ray task: `run_trial`, judged at the rungs by the driver's pruning actor `board`."""
    judge = None
    if board is not None:
        import ray

        def judge(number: int, rung: int, loss: float, flops: float) -> str | None:
            return ray.get(board.decide.remote(number, rung, loss, flops))

    return run_trial(request, known_kernels, judge)


Judge = Callable[[int, int, float, float], "str | None"]


def trial_cores(cpus: float | None) -> int | None:
    """The cores a CPU trial may use: the whole CPUs Ray gave it (`cpus_per_trial`, at least 1, at
    most the cores this process may run on). None (a request not from a search): the trainer's
    own choice, the free cores now (`settings.available_cores`).

    Ray's share, not the load average: the load counts the trials Ray placed beside this one, and
    this worker's own previous trial, which Ray's share already accounts for.
    """
    from archsearch.evaluators.settings import usable_cores

    if cpus is None:
        return None
    return max(1, min(usable_cores(), math.floor(cpus)))


def run_trial(
    request: TrialRequest, known_kernels: dict[str, float] | None = None, judge: Judge | None = None
) -> TrialOutcome:
    """Train and profile one candidate.

    Args:
        request: the shape and the search's settings.
        known_kernels: kernel seconds already measured (`Storage.measurements()`), so a shape is
            timed once per device across all trials and studies.
        judge: called as `judge(number, rung, loss, flops)` when the run reaches a pruning rung;
            returns the reason to stop it, or None to go on. None: no pruning.

    Returns:
        The outcome; losses in nats per token, times in seconds. Training failures (NaN, out of
        memory, too large) come back as status "failed"; a pruned run as "pruned" with its rung.

    Raises:
        Whatever a bug raises: the driver records it as the trial's failure reason.
    """
    from archsearch.evaluators.trainer import intra_op_threads, run_threads

    settings = request.proxy
    threads = run_threads(request.config, settings, trial_cores(request.cpus))
    if threads is not None:
        settings = dataclasses.replace(settings, threads=threads)
    # Training and local profiling alike: the kernels are timed, and the device (whose
    # fingerprint counts CPU threads) described, on the threads the step trained on.
    with intra_op_threads(threads):
        return _run_trial(request, settings, known_kernels, judge)


def _run_trial(
    request: TrialRequest,
    settings: TrainSettings,
    known_kernels: dict[str, float] | None,
    judge: Judge | None,
) -> TrialOutcome:
    from archsearch.evaluators.trainer import Checkpoint, resolve_device, train
    from archsearch.storage.measurement_cache import KernelCache

    cfg = request.config
    seq_len = settings.seq_len or cfg.seq_len
    data = worker_dataset(request.data, cfg.vocab_size, seq_len)
    flops = float(flop_counts(cfg).forward)
    params = param_counts(cfg).total
    rungs = request.rungs
    # The stall check only where a longer warm-up is left to try.
    unigram = _unigram_loss(request.data, cfg.vocab_size, seq_len) if may_stall(settings) else None
    tokens_per_step = settings.batch_size * seq_len
    judged: dict[str, Any] = {}

    def on_eval(tokens: int, val_loss: float) -> bool:
        # The trainer evaluates at (i + 1) / evals of the budget, whatever the budget's unit.
        judged["evals"] += 1
        judged["curve"].append((tokens, val_loss))
        fraction = judged["evals"] / settings.evals
        plateau = judged["unigram"]
        if plateau is not None and stalls(fraction, tokens, val_loss, plateau, tokens_per_step):
            judged["stalled"] = (tokens, val_loss)
            return True
        if plateau is not None and on_plateau(val_loss, plateau, tokens * 0.5 / fraction, tokens_per_step):
            return False  # on the plateau before half its budget: not judged on that loss
        if judge is None or not rungs:
            return False
        rung = rung_at(rungs, fraction)
        if rung is None or rung <= judged["rung"]:
            return False
        judged["rung"] = rung
        # Judged on the study's loss objective, as the finished trials it is compared with: the
        # curve so far ends at the rung, and its last change is the one the objective extrapolates.
        told = request.loss_rule.value(val_loss, curve_change(judged["curve"]), params)
        reason = judge(request.number, rung, told, flops)
        if reason is not None:
            judged["pruned_rung"], judged["reason"] = rungs[rung], reason
        return reason is not None

    def attempt(run_settings: TrainSettings, plateau: float | None) -> Any:
        judged.update(evals=0, curve=[], rung=-1, pruned_rung=None, reason=None, stalled=None)
        judged["unigram"] = plateau
        keep = None
        if request.keep_state and run_settings.budget_free:
            # From step 0, as every trial: a state left at this key (by an attempt of this trial
            # whose worker died) would hand back its result with no steps timed.
            path = kept_state_path(
                request.study, request.created_at, request.number, cfg, run_settings, request.data
            )
            keep = Checkpoint(path, keep=True)
            keep.path.unlink(missing_ok=True)
        result = train(cfg, data, run_settings, on_eval=on_eval, cache=cache, checkpoint=keep)
        if judged["stalled"] is None and plateau is not None and result.status == COMPLETE:
            if stalls(1.0, result.tokens, result.val_loss, plateau, tokens_per_step):
                judged["stalled"] = (result.tokens, result.val_loss)  # on the plateau to the end
        return result

    cache = KernelCache(known_kernels)  # kernel times and the MFU peak, shared through the database
    result = attempt(settings, unigram)
    note = None
    if judged["stalled"] is not None:
        note = stall_note(settings, *judged["stalled"], unigram)
        settings = stall_retry(settings)
        result = attempt(settings, None)
    reason = judged["reason"] if result.status == PRUNED else result.reason
    if note is not None:
        reason = note if reason is None else f"{note}; {reason}"
    outcome = TrialOutcome(
        status=result.status,
        reason=reason,
        train=result.to_dict(),
        pruned_rung=judged["pruned_rung"] if result.status == PRUNED else None,
        measurements=tuple(cache.new),
    )
    if result.status != COMPLETE:
        return outcome  # no profiling spent on a pruned or failed shape
    info = resolve_device(settings.device)
    profiled = _profile(request, settings, result, str(info.torch_device), cache)
    return dataclasses.replace(outcome, device=info.to_dict(), **profiled)


def _profile(
    request: TrialRequest, settings: TrainSettings, result: Any, device: str, cache: Any
) -> dict[str, Any]:
    """Step times: measured here (the real step, its kernels as the breakdown) and modelled on the
    catalogued GPUs.

    The local step time is the trainer's own median step, and its kernels are profiled in the
    precision it trained in ([profile] dtype "auto"). A profile at another batch or an explicitly
    asked dtype is a different step: a short run (`trainer.measure_step`) times that one instead,
    so the report's lines always add up to a real step of what was profiled.
    """
    from archsearch.evaluators.device import DeviceError
    from archsearch.evaluators.profiler import AUTO
    from archsearch.evaluators.step_time import step_profile

    cfg, spec = request.config, request.profile
    batch, dtype = spec.batch or settings.batch_size, spec.dtype
    local_dtype = result.precision if dtype == AUTO else dtype
    same_step = (batch, local_dtype) == (settings.batch_size, result.precision) and result.step_time_s
    trained = (result.step_time_s, result.step_time_steps) if same_step else None
    reports = {}
    try:
        if spec.local:
            reports["local"] = step_profile(
                cfg, device, batch, local_dtype, cache, trained=trained, min_run_time=spec.min_run_time
            )
    except DeviceError as exc:  # ProfilerError included
        return dict(status=FAILED, reason=f"profiling: {exc}", measurements=tuple(cache.new))
    for name in spec.devices:
        reports[name] = step_profile(cfg, name, batch, dtype)
    profiles = tuple(
        dict(
            device=name,
            modelled=report.modelled,
            dtype=report.dtype,
            batch=report.batch,
            step_time_s=report.step_time_s,
            tokens_per_second=report.tokens_per_second,
            report=report.to_dict(),
        )
        for name, report in reports.items()
    )
    target = request.step_time_device
    step_time = reports[target].step_time_s if target in reports else None
    if target is not None and (step_time is None or not math.isfinite(step_time)):
        return dict(
            status=FAILED,
            reason=f"no step time on {target!r}",
            profiles=profiles,
            measurements=tuple(cache.new),
        )
    return dict(
        profiles=profiles,
        measurements=tuple(cache.new),
        step_time_s=step_time,
        step_time_device=target,
    )
