"""`archsearch validate`: how well a study's proxy loss ranks shapes the way longer training does.
Its command line is `archsearch.cli.validate`.

The loss axis of a study's front comes from a short proxy run, and short runs favour shapes that
learn fast early (docs/explanations/proxy-fidelity.md). Validation retrains a calibration set of
the study's trials for `multiplier` x the proxy's token budget and compares rankings:

1. The calibration set: the study's Pareto front plus a seeded random sample of the other
   complete trials spread over the parameter-count range (one per equal-count stratum of the
   sorted parameter counts), `trials` in all; or explicit trial numbers.
2. Each chosen trial's stored config is retrained with the study's stored `[proxy]` settings and
   corpus, at `multiplier` x the budget, always with the cosine schedule and the default floor
   (`schedule="cosine", min_lr=0.1`: the long run stands for how users really train), for seeds
   0..seeds-1. Runs are Ray tasks as in `search`: the driver owns the database, tasks take and
   return plain data. Every finished run is stored at once (`Storage.add_long_run`); a rerun
   skips the (trial, multiplier, seed) runs already stored, and Ctrl-C keeps what finished. A run
   stopped part-way goes on from its last checkpoint (`long_run`: every 5 minutes, in the cache).
3. The report: Spearman and Kendall of the proxy loss, of -params, of -FLOPs and of the
   adjusted proxy loss, the study's loss objective (`fidelity.loss_objectives`: extrapolated by
   the study's `[objectives].extrapolate`, credited for size with `size_beta`, else the study's
   `[objectives].size_beta`, else its beta over the calibration set) against the long-run loss
   (seed mean), naming which of the two losses is the study's objective; iso-parameter pair
   agreement of the proxy, of -params and of the adjusted loss; the seed noise floor; how many
   members the proxy front, the adjusted front and the long-run front (loss vs forward FLOPs,
   over the calibration set) share; and the long-run hypervolume of each front with one
   reference point; and the measures that can decide (`deciding`: each predictor's
   correlations with 95% bootstrap intervals, its paired difference against -params and -FLOPs,
   pairs beyond the long runs' seed noise, front recall, the knee's regret). It is stored
   with the study (`Storage.add_validation`) as JSON; reports stored before the size-adjusted
   predictor lack its keys (`adjusted`, `size_beta`), before studies had a size beta, the
   `objective` key (their objective was the proxy loss), and before the extrapolation, the
   `extrapolate` key (0).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from archsearch.errors import ArchsearchError
from archsearch.search import fidelity_stats as fs
from archsearch.search.fidelity import (
    iso_pair_agreement,
    kendall,
    loss_objectives,
    noise_floor,
    spearman,
)
from archsearch.search.pareto import hypervolume, pareto_mask, reference_point, scaled, study_front
from archsearch.search.promotion import ranking_line
from archsearch.trial import COMPLETE
from archsearch.units import SEED_MAX, ray_resources_problem, short_number

if TYPE_CHECKING:
    from archsearch.storage import Storage, TrialRecord

log = logging.getLogger(__name__)

MIN_TRIALS = 4  # rank correlations over fewer shapes say nothing
# Each seed is one more long run of every chosen trial: a noise floor needs a few. The plan holds
# every run before Ray starts, so --seeds 1000000000 spent minutes and gigabytes building it.
MAX_SEEDS = 100
DEFAULT_TRIALS = 12
DEFAULT_MULTIPLIER = 10.0
LONG_SCHEDULE = dict(schedule="cosine", min_lr=0.1)  # the long run always trains like users do
FRONT_OBJECTIVES = ("loss", "flops")  # the fronts compared: loss against forward FLOPs per token


class ValidateError(ArchsearchError):
    """A validation that cannot start: bad options, an unknown study, too few complete trials."""


@dataclass(frozen=True)
class ValidateOptions:
    """What to validate and how. Checked on construction, before anything is opened or written."""

    study: str
    trials: int = DEFAULT_TRIALS  # calibration-set size when `numbers` is empty
    numbers: tuple[int, ...] = ()  # explicit trial numbers; empty: the front plus a sample
    multiplier: float = DEFAULT_MULTIPLIER  # long runs train this many times the proxy's tokens
    seeds: int = 1  # long runs per trial, seeds 0..seeds-1
    workers: int = 1  # long runs at once
    sample_seed: int = 0  # seeds the choice of the non-front trials
    # The adjusted predictor's beta; None: the study's [objectives].size_beta, else 0 when the
    # study extrapolates (its objective), else the equal-weight beta over the calibration set.
    # Changes the report only, never a long run.
    size_beta: float | None = None
    # Ray, as `SearchOptions` names them (the driver's pool reads these four).
    address: str | None = None
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    retries: int = 1  # re-runs of a long run whose worker died

    def __post_init__(self) -> None:
        if not self.study:
            raise ValidateError("--study is required")
        if not (isinstance(self.multiplier, (int, float)) and math.isfinite(self.multiplier)):
            raise ValidateError(f"--multiplier must be a finite number > 1, got {self.multiplier}")
        if self.multiplier <= 1:
            raise ValidateError(
                f"--multiplier must be > 1 (a longer run than the proxy), got {self.multiplier:g}"
            )
        if not 1 <= self.seeds <= MAX_SEEDS:
            raise ValidateError(f"--seeds must be in 1..{MAX_SEEDS}, got {short_number(self.seeds)}")
        if not 0 <= self.sample_seed <= SEED_MAX:
            raise ValidateError(f"--seed must be in 0..{SEED_MAX}, got {short_number(self.sample_seed)}")
        if not self.numbers and self.trials < MIN_TRIALS:
            raise ValidateError(f"--trials must be at least {MIN_TRIALS}, got {short_number(self.trials)}")
        if len(set(self.numbers)) != len(self.numbers):
            raise ValidateError("a --trial number is given twice")
        if self.size_beta is not None and not (math.isfinite(self.size_beta) and self.size_beta >= 0):
            raise ValidateError(f"--size-beta must be a finite number >= 0, got {self.size_beta}")
        if problem := ray_resources_problem(
            self.cpus_per_trial, self.gpus_per_trial, "run", self.workers, self.address
        ):
            raise ValidateError(problem)
        if self.retries < 0:
            raise ValidateError(f"--retries must be >= 0, got {short_number(self.retries)}")


@dataclass(frozen=True)
class ValidateProgress:
    """A snapshot for progress displays: long runs stored of those the report needs."""

    done: int
    total: int
    failed: int
    last: str  # what just happened, e.g. "trial 3 seed 0: 2.1034"
    elapsed_s: float


@dataclass(frozen=True)
class ValidateSummary:
    study: str
    report: dict[str, Any] | None  # None when interrupted before every run was stored
    trained: int  # long runs trained by this call
    skipped: int  # long runs found stored and reused
    failed: tuple[str, ...]  # "trial N seed S: reason" of the runs that failed here
    signal: int | None = None  # the signal that stopped it early


# ------------------------------------------------------------------------------------------------
# The calibration set
# ------------------------------------------------------------------------------------------------
def calibration_set(
    storage: Storage, study: str, n: int = DEFAULT_TRIALS, numbers: Sequence[int] = (), seed: int = 0
) -> list[TrialRecord]:
    """The trials to retrain, by trial number.

    Args:
        n: how many: the study's front (all of it, or `n` spread along it when larger) plus a
            random sample of the other complete trials, one from each of equal-count strata of
            their sorted parameter counts, so small and large shapes are both in. A shape
            trained by several trials is in once, as its first trial.
        numbers: explicit trial numbers instead; each must be a complete trial.
        seed: seeds the sample.

    Raises:
        ValidateError: an unknown study, fewer than `MIN_TRIALS` complete trials (or numbers),
            or a number that is not a complete trial.
    """
    storage.require_study(study)
    complete = [
        r
        for r in storage.trials(study, status=COMPLETE)
        if r.config is not None and r["loss"] is not None and math.isfinite(r["loss"])
    ]
    if len(complete) < MIN_TRIALS:
        raise ValidateError(
            f"study {study!r} has {len(complete)} complete trials with a loss; validate needs at least "
            f"{MIN_TRIALS}"
        )
    by_number = {r.number: r for r in complete}
    if numbers:
        missing = [n for n in numbers if n not in by_number]
        if missing:
            raise ValidateError(
                f"not complete trials of {study!r}: {', '.join(map(str, missing))} (see `archsearch trials`)"
            )
        if len(numbers) < MIN_TRIALS:
            raise ValidateError(f"give at least {MIN_TRIALS} --trial numbers, got {len(numbers)}")
        return sorted((by_number[n] for n in numbers), key=lambda r: r.number)
    # One trial per shape: a shape evaluated twice (two drivers, or two workers asking it at once)
    # would enter every measure as a pair tied on both sides. The first trial stands for it.
    shapes: dict[str, int] = {}
    for r in complete:
        shapes.setdefault(r.config.to_json(indent=None), r.number)  # type: ignore[union-attr]
    distinct = set(shapes.values())
    complete = [r for r in complete if r.number in distinct]
    sf = study_front(storage, study)
    front = [n for n in (sf.front.numbers if sf else ()) if n in distinct]
    if len(front) >= n:
        picks = np.unique(np.round(np.linspace(0, len(front) - 1, n)).astype(int))
        chosen = [front[i] for i in picks]
    else:
        others = sorted((r for r in complete if r.number not in set(front)), key=lambda r: r["params_total"])
        k = min(n - len(front), len(others))
        rng = np.random.default_rng(seed)
        strata = np.array_split(np.arange(len(others)), k) if k else []
        chosen = front + [others[int(rng.choice(s))].number for s in strata]
    return sorted((by_number[c] for c in chosen), key=lambda r: r.number)


# ------------------------------------------------------------------------------------------------
# Long-run settings and the Ray task
# ------------------------------------------------------------------------------------------------
def long_settings(proxy: dict[str, Any], multiplier: float, seed: int, tokens_trained: int | None) -> dict:
    """The long run's `TrainSettings` fields: the proxy's budget times `multiplier`, the cosine
    schedule with the default floor, seed `seed`.

    A tokens or FLOPs budget is multiplied; a seconds budget is not reproducible, so the long run
    trains `multiplier` x the tokens the trial's proxy run actually trained.

    Raises:
        ValidateError: the settings cannot train (a budget past `TrainSettings`' bounds).
    """
    from archsearch.evaluators.settings import TrainError, TrainSettings
    from archsearch.units import whole

    settings = dict(proxy)
    if settings.get("tokens") is not None:
        settings["tokens"] = whole(settings["tokens"] * multiplier)
    elif settings.get("flops") is not None:
        settings["flops"] = float(settings["flops"] * multiplier)
    else:
        if not tokens_trained:
            raise ValidateError("a seconds-budget proxy run without a token count cannot be scaled")
        settings["tokens"], settings["seconds"] = whole(tokens_trained * multiplier), None
    settings = {**settings, **LONG_SCHEDULE, "seed": seed}
    try:  # before Ray starts: a huge `--multiplier` (1e300) would start runs that never end
        TrainSettings(**settings)
    except TrainError as exc:
        raise ValidateError(f"--multiplier {multiplier:g} makes long runs that cannot train: {exc}") from None
    return settings


def checkpoint_path(request: dict[str, Any]) -> Path:
    """Where a long run keeps its checkpoint unless told: `cache_dir()/checkpoints/KEY.pt`, KEY the
    sha256 of the run's config, settings (threads aside: they change no result) and data, so a
    `validate` or `ladder` stopped with its runs part-way trains each on from where it was. The
    file is written only once a run has trained 5 minutes (`trainer.CHECKPOINT_EVERY_S`) and is
    removed when the run ends; a run never resumed leaves its file (delete the folder freely)."""
    from archsearch.evaluators.data import cache_dir

    settings = {k: v for k, v in request["settings"].items() if k != "threads"}
    what = json.dumps([request["config"], settings, request.get("data")], sort_keys=True, default=str)
    return cache_dir() / "checkpoints" / f"{hashlib.sha256(what.encode()).hexdigest()}.pt"


def long_run(request: dict[str, Any]) -> dict[str, Any]:
    """The Ray task: train one config with the given settings; plain data in and out.

    Args:
        request: "config" (`ArchConfig.to_dict()`), "settings" (`TrainSettings` fields), "data"
            (the corpus path, None for the bundled corpus), "cpus" (the CPUs Ray gave the run:
            with no `threads` in the settings, they cap the chosen thread count, as in a search),
            "checkpoint" (optional: a file where the run keeps its state every few minutes and
            from which a stopped run goes on, `evaluators.trainer.Checkpoint`; default
            `checkpoint_path(request)`, in the cache; False: none), "keep" (optional: leave the
            complete run's final state in that file, for a longer run to go on from), "stall"
            (optional: follow a search's stall rule, as a trial at these settings is trained: a
            run judged stalled, `worker.stall_reason`, is trained again with `worker.stall_retry`'s
            settings, keeping no state, at its own `checkpoint_path` unless "checkpoint" is False).

    Returns:
        status ("complete" or "failed"), reason (for a run trained again for stalling, the stall's
        note first, as a trial's), val_loss (nats per token), tokens, val_curve, wall_time_s,
        corpus_fingerprint, device_fingerprint: of the run that stands, the retry where there was
        one. Deterministic on CPU for one request.
    """
    from archsearch.evaluators.settings import TrainSettings
    from archsearch.evaluators.trainer import Checkpoint, intra_op_threads, resolve_device, run_threads, train
    from archsearch.search.worker import stall_reason, stall_retry, trial_cores, worker_dataset
    from archsearch.space.config import ArchConfig

    cfg = ArchConfig.from_dict(request["config"])
    asked = TrainSettings(**request["settings"])
    data = worker_dataset(request.get("data"), cfg.vocab_size, asked.seq_len or cfg.seq_len)

    def run(what: dict[str, Any], wanted: TrainSettings) -> tuple[Any, Any]:
        """Train `what` (a request) at `wanted`; its result and the device it trained on."""
        threads = run_threads(cfg, wanted, trial_cores(what.get("cpus")))
        settings = wanted if threads is None else dataclasses.replace(wanted, threads=threads)
        with intra_op_threads(threads):  # so the device fingerprint counts the threads it trained on
            path = what.get("checkpoint")
            path = checkpoint_path(what) if path is None else path
            keep = bool(what.get("keep"))
            result = train(cfg, data, settings, checkpoint=Checkpoint(path, keep=keep) if path else None)
            return result, resolve_device(settings.device)

    result, device = run(request, asked)
    stalled = None
    if request.get("stall") and result.status == COMPLETE:
        # The whole run is judged, not stopped at half its budget as a trial is: a run resumed
        # from a checkpoint evaluates only its rest, and the verdict is the same either way.
        stalled = stall_reason(cfg, asked, request.get("data"), result.val_curve)
    if stalled is not None:
        retry = stall_retry(asked)
        # Its own checkpoint (none where the request has none), never the stalled run's kept state.
        checkpoint = False if request.get("checkpoint") is False else None
        again = dict(request, settings=dataclasses.asdict(retry), checkpoint=checkpoint, keep=False)
        result, device = run(again, retry)
    reason = result.reason
    if stalled is not None:
        reason = stalled if reason is None else f"{stalled}; {reason}"
    return dict(
        status=result.status,
        reason=reason,
        val_loss=result.val_loss,
        tokens=result.tokens,
        val_curve=[list(p) for p in result.val_curve],
        wall_time_s=result.wall_time_s,
        resumed_tokens=result.resumed_tokens,
        corpus_fingerprint=result.corpus_fingerprint,
        device_fingerprint=device.fingerprint,
    )


# ------------------------------------------------------------------------------------------------
# The metrics
# ------------------------------------------------------------------------------------------------
def fidelity_report(
    rows: Sequence[dict[str, Any]],
    multiplier: float,
    seeds: int,
    size_beta: float | None = None,
    objective: str = "proxy",
    extrapolate: float = 0.0,
) -> dict[str, Any]:
    """The rank-fidelity report of a calibration set.

    Args:
        rows: one per trial: number, params_total, flops (forward per token), proxy_loss,
            loss_change (its curve's last change; left out: 0) and long_losses (one per seed;
            trials without any are left out of the measures).
        size_beta: the adjusted predictor's beta; None: the equal-weight beta over the set.
        objective: which predictor is the study's loss objective, "proxy" or "adjusted".
        extrapolate: the adjusted predictor's extrapolation (`objectives.loss_objective`).

    Returns:
        Plain data (JSON-ready): see the module docstring; NaN correlations become None.
    """
    used = [r for r in rows if r["long_losses"]]
    numbers = [r["number"] for r in used]
    proxy = np.array([r["proxy_loss"] for r in used], dtype=float)
    long = np.array([float(np.mean(r["long_losses"])) for r in used], dtype=float)
    params = np.array([r["params_total"] for r in used], dtype=float)
    flops = np.array([r["flops"] for r in used], dtype=float)

    def finite(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None

    changes = [r.get("loss_change") or 0.0 for r in used]
    # Never fitted to the long runs.
    adjusted, rule = loss_objectives(proxy, changes, params, size_beta, extrapolate)
    # Lower predicted = better.
    predictors = {"proxy": proxy, "params": -params, "flops": -flops, "adjusted": adjusted}
    correlations = {
        name: {"spearman": finite(spearman(p, long)), "kendall": finite(kendall(p, long))}
        for name, p in predictors.items()
    } if len(used) >= 2 else {name: {"spearman": None, "kendall": None} for name in predictors}  # fmt: skip
    iso = {n: list(iso_pair_agreement(predictors[n], long, params)) for n in ("proxy", "params", "adjusted")}

    # Fronts over the calibration set in (loss, forward FLOPs): ranked by the proxy loss, by the
    # adjusted loss and by the long-run loss; all scored by their long-run hypervolume, one
    # reference point.
    long_pts = np.column_stack([long, flops])

    def front_of(losses: np.ndarray) -> list[int]:
        mask = pareto_mask(scaled(np.column_stack([losses, flops]), FRONT_OBJECTIVES))
        return [numbers[i] for i in np.flatnonzero(mask)]

    proxy_front, adjusted_front, long_front = front_of(proxy), front_of(adjusted), front_of(long)
    fronts: dict[str, Any] = {"objectives": list(FRONT_OBJECTIVES)}
    if used:
        ref = reference_point(long_pts, FRONT_OBJECTIVES)
        scaled_ref = scaled(np.asarray([ref]), FRONT_OBJECTIVES)[0]
        index = {n: i for i, n in enumerate(numbers)}

        def long_hv(members: list[int]) -> float:
            return hypervolume(scaled(long_pts[[index[m] for m in members]], FRONT_OBJECTIVES), scaled_ref)

        fronts.update(
            proxy=proxy_front,
            adjusted=adjusted_front,
            long=long_front,
            shared=len(set(proxy_front) & set(long_front)),
            adjusted_shared=len(set(adjusted_front) & set(long_front)),
            proxy_long_hypervolume=long_hv(proxy_front),
            adjusted_long_hypervolume=long_hv(adjusted_front),
            long_long_hypervolume=long_hv(long_front),
            reference=list(ref),
        )
    floor = noise_floor([r["long_losses"] for r in used]) if seeds > 1 else None
    return {
        "deciding": deciding_measures(predictors, long, flops, [r["long_losses"] for r in used]),
        "multiplier": float(multiplier),
        "seeds": int(seeds),
        "trials": numbers,
        "correlations": correlations,
        "iso_pairs": iso,
        # the adjusted loss: proxy_loss + extrapolate * loss_change - size_beta * ln(params_total / 1M)
        "size_beta": rule.size_beta,
        "extrapolate": rule.extrapolate,
        "size_beta_fixed": size_beta is not None,  # given (or the study's), not taken over the set
        "objective": objective,  # the predictor the study told Optuna: "proxy" or "adjusted"
        "noise_floor": floor,
        "fronts": fronts,
        "rows": [
            {
                **r,
                "long_loss": float(np.mean(r["long_losses"])) if r["long_losses"] else None,
                "long_losses": list(r["long_losses"]),
            }
            for r in rows
        ],
    }


def deciding_measures(
    predictors: dict[str, np.ndarray],
    long: np.ndarray,
    flops: np.ndarray,
    long_losses: Sequence[Sequence[float]],
) -> dict[str, Any] | None:
    """The measures that can decide (`fidelity_stats`), per predictor:
    Spearman and Kendall with 95% bootstrap intervals over the trials, the paired difference
    against -params and -FLOPs with its interval, pairs ordered right among those whose long-run
    gap exceeds the long runs' own seed noise, front recall and the knee's regret at the long
    runs; and that noise and the seed-to-seed ceiling where trials have two seeds. None below 3
    trials (nothing to rank)."""
    if len(long) < 3:
        return None
    twice = [ls for ls in long_losses if len(ls) >= 2]
    noise = fs.seed_noise([ls[0] for ls in twice], [ls[1] for ls in twice]) if twice else 0.0
    ceiling = None
    if len(twice) >= 3:
        ceiling = fs.rank_correlation([ls[1] for ls in twice], [ls[0] for ls in twice]).to_dict()
    out: dict[str, Any] = {"reference_noise": noise, "seed_pairs": len(twice), "reference_ceiling": ceiling}
    for name, values in predictors.items():
        out[name] = fs.measures(
            values, long, flops, params_predictor=predictors["params"], flops_predictor=predictors["flops"],
            noise=noise,
        )  # fmt: skip
    return out


# ------------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------------
def run_validate(
    storage: Storage,
    options: ValidateOptions,
    *,
    on_update: Callable[[ValidateProgress], None] | None = None,
    run_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> ValidateSummary:
    """Choose the calibration set, train the long runs not yet stored, report and store the metrics.

    Args:
        storage: the trial database (the study must be in it).
        options: see `ValidateOptions`.
        on_update: called with a `ValidateProgress` after each long run, for progress displays.
        run_fn: the Ray task body; `long_run` by default.

    Returns:
        A `ValidateSummary`; its report is None, and `signal` set, when SIGINT / SIGTERM stopped it
        before every run was stored (the runs that finished are kept; a rerun continues).

    Raises:
        ValidateError: too few complete trials, unknown trial numbers or study.
        ReadOnlyStorageError: the database cannot be written here.
    """
    from archsearch.search.pool import RayPool, Stop, handle_signals

    record = storage.require_study(options.study)
    storage.require_writable()  # before training runs whose results could not be stored
    chosen = calibration_set(storage, options.study, options.trials, options.numbers, options.sample_seed)
    proxy = record.spec.get("proxy")
    if not proxy:
        raise ValidateError(f"study {options.study!r} stores no [proxy] settings to retrain with")
    data = record.spec.get("data")
    stored = {r.key for r in storage.long_runs(options.study, options.multiplier)}
    # Every request is built before Ray starts, so a settings error writes and trains nothing.
    todo = [
        (r, seed, dict(
            config=r.config.to_dict(),  # type: ignore[union-attr]
            settings=long_settings(proxy, options.multiplier, seed, r["tokens_trained"]),
            data=data,
            cpus=options.cpus_per_trial,
        ))
        for r in chosen
        for seed in range(options.seeds)
        if (r.number, float(options.multiplier), seed) not in stored
    ]  # fmt: skip
    total = len(chosen) * options.seeds
    skipped = total - len(todo)
    start = time.monotonic()
    failed: list[str] = []
    trained = 0
    stop = Stop("validate")

    def done(index: int, result: dict[str, Any] | None, reason: str | None) -> None:
        nonlocal trained
        r, seed, request = todo[index]
        why = _store(storage, options, r.number, seed, request, result, reason)
        if why is None:
            trained += 1
            last = f"trial {r.number} seed {seed}: {result['val_loss']:.4f}"  # type: ignore[index]
        else:
            failed.append(last := f"trial {r.number} seed {seed}: {why}")
            log.warning("long run failed: %s", last)
        if on_update is not None:
            elapsed = time.monotonic() - start
            on_update(ValidateProgress(skipped + trained, total, len(failed), last, elapsed))

    if todo:
        log.info("validate %s: %d long runs to train, %d stored", options.study, len(todo), skipped)
        kept = "the long runs stored so far are kept; rerun the same command to train the rest"
        with RayPool(options, run_fn or long_run, "validate", kept) as pool, handle_signals(stop):  # type: ignore[arg-type]
            pool.arm()
            if on_update is not None:
                on_update(ValidateProgress(skipped, total, 0, f"training {len(todo)} long runs", 0.0))
            requests = [(f"trial {r.number} seed {seed}", request) for r, seed, request in todo]
            pool.run_each(requests, retries=options.retries, stop=stop, done=done)
    if stop.signum is not None:
        return ValidateSummary(options.study, None, trained, skipped, tuple(failed), stop.signum)
    report = _report(storage, options, chosen)
    storage.add_validation(options.study, multiplier=options.multiplier, seeds=options.seeds, report=report)
    return ValidateSummary(options.study, report, trained, skipped, tuple(failed))


def _store(
    storage: Storage,
    options: ValidateOptions,
    number: int,
    seed: int,
    request: dict[str, Any],
    result: dict[str, Any] | None,
    reason: str | None,
) -> str | None:
    """Store one finished long run (one transaction); the reason instead when it has no loss.

    A failed run is not stored, so a rerun tries it again.
    """
    if result is None or result["status"] != COMPLETE or result["val_loss"] is None:
        return reason or (result or {}).get("reason") or "no loss"
    storage.add_long_run(
        options.study,
        trial_number=number,
        multiplier=options.multiplier,
        seed=seed,
        tokens=result["tokens"],
        val_loss=result["val_loss"],
        val_curve=result["val_curve"],
        settings=request["settings"],
        device_fingerprint=result["device_fingerprint"],
        corpus_fingerprint=result["corpus_fingerprint"],
        wall_time_s=result["wall_time_s"],
    )
    return None


def _report(storage: Storage, options: ValidateOptions, chosen: list[TrialRecord]) -> dict[str, Any]:
    losses: dict[int, list[float]] = {}
    for run in storage.long_runs(options.study, options.multiplier):
        if run.seed < options.seeds:
            losses.setdefault(run.trial_number, []).append(run.val_loss)
    rows = [
        dict(
            number=r.number,
            params_total=int(r["params_total"]),
            flops=float(r["flops_forward_per_token"]),
            proxy_loss=float(r["loss"]),
            proxy_tokens=r["tokens_trained"],  # with params_total, places the study in a regime
            loss_change=r["loss_change"],
            long_losses=losses.get(r.number, []),
            shape=r.config.describe() if r.config is not None else "",
        )
        for r in chosen
    ]
    own = storage.require_study(options.study).loss_rule
    beta = options.size_beta if options.size_beta is not None else own.size_beta
    if beta is None and not own.plain:
        beta = 0.0  # the study's objective extrapolates and credits no size: so does its predictor
    objective = "proxy" if own.plain else "adjusted"
    report = fidelity_report(rows, options.multiplier, options.seeds, beta, objective, own.extrapolate)
    # The set is chosen from the front as the study ranks it: a study with promotions ranks its
    # contenders at a longer budget than the proxy losses compared here, and the report says so.
    ranking = storage.promotion_ranking(options.study)
    if ranking is not None:
        report["promotion"] = {
            "contenders": list(ranking.contenders), "ranked_at": ranking.budget,
            "proxy_tokens": ranking.proxy_tokens, "seeds": ranking.seeds, "said": ranking_line(ranking),
        }  # fmt: skip
    return report


def adjusted_label(report: dict[str, Any]) -> str:
    """The adjusted predictor of a stored report as a reader sees it: "adjusted proxy (beta
    0.150, + 2 x last change)"; reports from before the extrapolation lack its key (0)."""
    extrapolate = report.get("extrapolate") or 0.0
    beta = report.get("size_beta")
    terms = [f"beta {beta:.3f}"] if beta is not None else []
    terms += [f"+ {extrapolate:g} x last change"] if extrapolate else []
    name = "adjusted proxy" if extrapolate else "size-adjusted proxy"
    return f"{name} ({', '.join(terms)})" if terms else name
