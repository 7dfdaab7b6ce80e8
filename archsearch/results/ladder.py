"""`archsearch ladder`: a design's loss trend over size, and the loss it predicts at the user's size.

A search ranks designs at 0.1-2M parameters; users train at 100M-70B, and the best design can
change with scale (Tay et al. 2022; BRIEF.md sections 9 and 12). A ladder trains one chosen
trial's design at several sizes and fits a law across ladders (`ladder_fit`):

1. The designs: `--trial N` (repeatable), the front's `--knee`, or every `--front` member; each a
   complete trial whose design (`space.scale.design_choices`) is kept.
2. The rungs: `rungs` sizes spaced `spacing` x apart (`SPACING`, 2x, by default), the largest
   `top` total parameters (default the trial's own size, raised when the smallest rung cannot be
   built: `default_top`; never past the space's `[budget]`); neighbours that come out as one shape
   are one rung. Each rung's shape is re-chosen the
   way `export --scale-to` re-chooses one (`space.scale.scaled_candidates`: the design kept,
   depth from the aspect window published models use at that size) on finer grids than a GPU's
   (d_model a multiple of `D_MODEL_GRID`, d_ff of `D_FF_GRID`, the trial's head_dim): at 20k-2M
   parameters the 128-wide tiles of the GPU grid are coarser than the 2x between rungs. The pick
   trades closeness to the target against an aspect near the window's centre (`rung_shape`), so
   a design's rungs form one family; the fit uses each shape's exact count.
3. Training: the study's `[proxy]` settings and corpus with `tokens_per_param` x the rung's total
   parameters tokens (Chinchilla's 20 by default: `--scale-to 1.3B --tokens 26B` is that ratio),
   with the cosine schedule and floor that `validate`'s long runs use (how users train), at the
   proxy's batch or `--batch-size`, on Ray tasks (`search.validate.long_run`). A ratio and a batch
   size make a recipe: rungs of one recipe share one law, and a rung is stored per recipe. The
   batch matters at these sizes: at the tiny study's batch of 16 its 62k rungs train 150 steps,
   too few for their loss to follow the law (`MIN_RUNG_STEPS`). Every rung is stored as it finishes
   (`Storage.add_ladder_rung`); a rerun trains only the rungs not yet stored, and Ctrl-C keeps
   what finished.
4. The fit: every design of the study laddered with that recipe with 2 sizes or more, fitted
   jointly on non-embedding parameters (Kaplan et al. 2020: embeddings bend the law at small
   sizes; at byte-level vocabularies they are 10-30% of a rung); stored with its residuals
   (`Storage.add_ladder_fit`).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from archsearch.errors import ArchsearchError
from archsearch.results.ladder_fit import LadderFit, LadderFitError, Prediction, RungPoint, fit_ladders
from archsearch.space.costs import flop_counts, param_counts
from archsearch.space.scale import aspect_range, scaled_candidates
from archsearch.trial import COMPLETE
from archsearch.units import MAX_WHOLE, SEED_MAX, format_si, ray_resources_problem, short_number, whole

if TYPE_CHECKING:
    from archsearch.space.config import ArchConfig
    from archsearch.storage import LadderRungRecord, Storage, TrialRecord

log = logging.getLogger(__name__)

DEFAULT_RUNGS = 4
SPACING = 2.0  # "about 2x apart": four rungs span 8x, the top one 4x from the size predicted
MAX_SPACING = 16.0  # wider and a ladder of 2 rungs spans more than the law is known to hold over
DEFAULT_TOKENS_PER_PARAM = 20.0  # Chinchilla's compute-optimal ratio (Hoffmann et al. 2022)
TOLERANCE = (
    0.25  # a rung within 25% of its target: 2x apart, neighbours never overlap (denser: plan_ladder checks)
)
ASPECT_SLACK = 2.0  # the published aspect window, widened 2x each way for tiny shapes (rung_shape)
D_MODEL_GRID = 32  # finer than the GPU tile (128): 2x in parameters is about 1.4x in width
D_FF_GRID = 16
# Fewer optimizer steps than this on a rung, and its loss sits above the law (measured: a ladder of
# 8 designs at batch 16, its small rungs at 150-300 steps, backtested at 16.7% median error and
# fitted no floor; at batch 4, 600+ steps, 5.0%: docs/guide/ladder.md).
MIN_RUNG_STEPS = 500
# Default top rungs tried, as multiples of the trial's size (`default_top`): 1 first, then up.
TOP_SHIFTS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0)
LADDER_SCHEDULE = dict(schedule="cosine", min_lr=0.1)  # as `validate`'s long runs: how users train
# A ladder claims each rung just before it starts (`Storage.claim_ladder_rung`), so two ladders of
# one study train each rung once; storing a rung drops its claim, the ladder renews the rest every
# CLAIM_RENEW_S while it runs and releases them when it ends, and a killed ladder's claims lapse
# CLAIM_LEASE_S after their last renewal.
CLAIM_LEASE_S = 600.0
CLAIM_RENEW_S = 60.0


class LadderError(ArchsearchError):
    """A ladder that cannot start: bad options, an unknown study, a trial without a design to keep,
    rungs past the space's budget or with no shape that keeps the design."""


@dataclass(frozen=True)
class LadderOptions:
    """What to ladder and how. Checked on construction, before anything is opened or written."""

    study: str
    numbers: tuple[int, ...] = ()  # --trial N ...
    knee: bool = False
    front: bool = False
    rungs: int = DEFAULT_RUNGS
    spacing: float = SPACING  # each rung this many times the one below (--spacing 1.414: twice as dense)
    top: int | None = None  # the largest rung's total parameters; None: the trial's own size
    tokens_per_param: float = DEFAULT_TOKENS_PER_PARAM
    batch_size: int | None = None  # sequences per step of every rung; None: the study's proxy batch
    seed: int = 0  # the training seed of every rung
    workers: int = 1  # rungs at once
    # Ray, as `SearchOptions` names them (the driver's pool reads these four).
    address: str | None = None
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    retries: int = 1

    def __post_init__(self) -> None:
        if not self.study:
            raise LadderError("--study is required")
        chosen = [
            flag
            for flag, on in (("--trial", self.numbers), ("--knee", self.knee), ("--front", self.front))
            if on
        ]
        if len(chosen) != 1:
            got = f" (got {', '.join(chosen)})" if chosen else ""
            raise LadderError(f"give exactly one of --trial N, --knee, --front{got}")
        if len(set(self.numbers)) != len(self.numbers):
            raise LadderError("a --trial number is given twice")
        if self.rungs < 2:
            raise LadderError(
                f"a ladder of {self.rungs} rung{'s' * (self.rungs != 1)} fits no trend: give --rungs 2 "
                "or more"
            )
        s = self.spacing
        if not (isinstance(s, (int, float)) and math.isfinite(s) and 1.0 < s <= MAX_SPACING):
            raise LadderError(f"--spacing must be a ratio > 1 and <= {MAX_SPACING:g}, got {s}")
        most = max_rungs(s)
        if self.rungs > most:  # `spacing ** k` overflowed at --rungs 1000000
            raise LadderError(
                f"--rungs must be at most {most} (rungs {s:g}x apart from one parameter up to "
                f"the most the database stores, 2**63 - 1), got {short_number(self.rungs)}"
            )
        t = self.tokens_per_param
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
            raise LadderError(f"--tokens-per-param must be a finite number > 0, got {t}")
        if self.top is not None and self.top <= 0:
            raise LadderError(f"--top must be a positive parameter count, got {short_number(self.top)}")
        if self.batch_size is not None and not 1 <= self.batch_size <= MAX_WHOLE:
            raise LadderError(
                f"--batch-size must be a positive number of sequences, got {short_number(self.batch_size)}"
            )
        if not 0 <= self.seed <= SEED_MAX:
            raise LadderError(f"--seed must be in 0..{SEED_MAX}, got {short_number(self.seed)}")
        if problem := ray_resources_problem(
            self.cpus_per_trial, self.gpus_per_trial, "run", self.workers, self.address
        ):
            raise LadderError(problem)
        if self.retries < 0:
            raise LadderError(f"--retries must be >= 0, got {short_number(self.retries)}")


@dataclass(frozen=True)
class PlannedRung:
    """One rung to train (or found stored): a design at one size with its training settings."""

    trial: int
    target: int  # total parameters asked for
    config: ArchConfig
    settings: dict[str, Any]  # TrainSettings fields

    @property
    def params(self) -> int:
        return param_counts(self.config).total

    @property
    def batch_size(self) -> int:
        return int(self.settings["batch_size"])

    @property
    def seq_len(self) -> int:
        return int(self.settings.get("seq_len") or self.config.seq_len)

    @property
    def steps(self) -> int:
        """Optimizer steps the rung trains."""
        return math.ceil(self.settings["tokens"] / (self.batch_size * self.seq_len))


@dataclass(frozen=True)
class LadderProgress:
    """A snapshot for progress displays: rungs stored of those planned."""

    done: int
    total: int
    failed: int
    last: str
    elapsed_s: float


@dataclass(frozen=True)
class LadderSummary:
    study: str
    tokens_per_param: float
    batch_size: int
    planned: tuple[PlannedRung, ...]
    rungs: tuple[LadderRungRecord, ...]  # every stored rung of the study with this recipe
    fit: LadderFit | None  # None when interrupted or when the rungs cannot be fitted
    fit_error: str | None  # why there is no fit
    trained: int
    skipped: int
    failed: tuple[str, ...]
    signal: int | None = None
    busy: tuple[str, ...] = ()  # rungs another ladder was training: left to it


# ------------------------------------------------------------------------------------------------
# Rungs
# ------------------------------------------------------------------------------------------------
def max_rungs(spacing: float = SPACING) -> int:
    """The most rungs `spacing` apart between one parameter and the most the database stores (64 at
    2x)."""
    return math.floor(math.log(MAX_WHOLE) / math.log(spacing)) + 1


def rung_targets(top: int, rungs: int, spacing: float = SPACING) -> tuple[int, ...]:
    """The rungs' target sizes, smallest first: `top / spacing^k` for k = rungs-1 .. 0, at least one
    parameter (`rung_shape` then says no shape is that small, not that a target of 0 is invalid)."""
    return tuple(max(1, round(top / spacing**k)) for k in range(rungs - 1, -1, -1))


def rung_shape(cfg: ArchConfig, target: int, params_max: int | None = None) -> ArchConfig:
    """`cfg`'s design at `target` total parameters, as a ladder builds it (module docstring, 2).

    The candidates are `scaled_candidates`' within `TOLERANCE` of the target, with the aspect
    window of published models at that size (`aspect_range`) widened `ASPECT_SLACK` x each way: at
    20k-2M parameters one layer more or less is a 2x step, so the strict window leaves gaps. The
    pick weighs the distance from the target (`TOLERANCE` counts 1) against the aspect's distance
    from the window's centre (`ASPECT_SLACK` counts 1), both on log scales, so a design's rungs
    form one family of shapes; the fit uses each shape's exact count.

    Args:
        cfg: the trial's shape; its vocabulary, context and head_dim are kept.
        target: total parameters wanted.
        params_max: a budget's cap; candidates above it are left out.

    Raises:
        LadderError: no shape near the target keeps the design (under the cap).
    """
    low, high = aspect_range(target)
    candidates = [
        c
        for c in scaled_candidates(
            cfg,
            target,
            seq_len=cfg.seq_len,
            vocab_size=cfg.vocab_size,
            tolerance=TOLERANCE,
            aspect=(max(1, math.floor(low / ASPECT_SLACK)), math.ceil(high * ASPECT_SLACK)),
            d_model_multiple=D_MODEL_GRID,
            d_ff_multiples=(D_FF_GRID,),
            head_dims=(cfg.head_dim,),
        )
        if params_max is None or param_counts(c).total <= params_max
    ]
    if not candidates:
        raise LadderError(
            f"no shape keeping the design ({cfg.attention_layout}, head_dim {cfg.head_dim}, d_ff/d_model "
            f"{cfg.d_ff_ratio:.3g}) has {format_si(target)} parameters within {TOLERANCE:.0%}"
            + (f" and at most the budget's {format_si(params_max)}" if params_max is not None else "")
            + ": choose another --top or fewer --rungs"
        )
    centre = math.sqrt(low * high)

    def cost(c: ArchConfig) -> tuple[float, int, int]:
        size = math.log(param_counts(c).total / target) / math.log(1 + TOLERANCE)
        aspect = math.log(c.aspect_ratio / centre) / math.log(ASPECT_SLACK)
        return (size**2 + aspect**2, c.n_layers, c.d_model)

    return min(candidates, key=cost)


def default_top(
    cfg: ArchConfig, own: int, rungs: int, params_max: int | None = None, spacing: float = SPACING
) -> int:
    """The top rung when none is given: the trial's own size, raised (up to `TOP_SHIFTS`) until
    every rung below it can be built, within the budget. A design's smallest shape has a floor (a
    layer of its smallest valid width plus the embeddings: 93k parameters for an MQA SwiGLU 4x design
    with 32-wide heads at vocabulary 256), which 4 rungs under a 0.5M trial would cross."""
    for shift in TOP_SHIFTS:
        top = round(own * shift)
        if params_max is not None and top > params_max:
            break
        try:
            for target in rung_targets(top, rungs, spacing):
                rung_shape(cfg, target, params_max)
        except LadderError:
            continue
        return top
    return own  # plan_ladder reports why the trial's own size does not ladder


def ladder_settings(
    proxy: dict[str, Any], tokens: int, seed: int, batch_size: int | None = None
) -> dict[str, Any]:
    """A rung's `TrainSettings` fields: the proxy's, with a token budget, the cosine schedule, `seed`
    and `batch_size` (None: the proxy's).

    Raises:
        LadderError: the settings cannot train (`--tokens-per-param 1e300` started rungs that never
            end: probe 7).
    """
    from archsearch.evaluators.settings import TrainError, TrainSettings

    settings = {**proxy, "tokens": int(tokens), "flops": None, "seconds": None, **LADDER_SCHEDULE}
    settings["seed"] = seed
    if batch_size is not None:
        settings["batch_size"] = batch_size
    try:
        TrainSettings(**settings)
    except TrainError as exc:
        raise LadderError(f"a rung cannot train: {exc}; give a smaller --tokens-per-param") from None
    return settings


def rung_tokens(cfg: ArchConfig, tokens_per_param: float) -> int:
    """Training tokens of a rung: `tokens_per_param` x its total parameters."""
    return max(1, whole(tokens_per_param * param_counts(cfg).total))


def ladder_designs(storage: Storage, options: LadderOptions) -> list[TrialRecord]:
    """The trials whose designs the ladder keeps.

    Raises:
        LadderError: an unknown trial, or one that is not complete (no design to keep).
        ArchsearchError: `--knee` / `--front` of a study without a front (`selection.select`).
    """
    if not options.numbers:
        from archsearch.search.selection import Choice, select

        return list(
            select(storage, options.study, Choice("json", knee=options.knee, front=options.front)).members
        )
    found = {t.number: t for t in storage.trials_by_number(options.study, list(options.numbers))}
    out = []
    for n in options.numbers:
        t = found.get(n)
        if t is None:
            raise LadderError(f"study {options.study!r} has no trial {n} (see `archsearch trials`)")
        if t.status != COMPLETE or t.config is None:
            why = f" ({t.reason})" if t.reason else ""
            raise LadderError(
                f"trial {n} of {options.study!r} is {t.status}{why}: no design to keep; a ladder keeps a "
                "complete trial's design"
            )
        out.append(t)
    return out


def plan_ladder(storage: Storage, options: LadderOptions) -> list[PlannedRung]:
    """Every rung of every chosen design, stored or not; checked whole before anything trains.

    Raises:
        LadderError: see `ladder_designs`, `rung_shape`; a top rung past the space's budget; two
            rungs of one design that come out as the same shape; too few rungs to fit the law.
    """
    record = storage.require_study(options.study)
    proxy = record.spec.get("proxy")
    if not proxy:
        raise LadderError(f"study {options.study!r} stores no [proxy] settings to train rungs with")
    budget = record.spec.get("space", {}).get("budget", {})
    params_max, flops_max = budget.get("params_max"), budget.get("flops_max")
    designs = ladder_designs(storage, options)
    d = len(designs)
    if d * options.rungs <= d + 2:
        raise LadderError(
            f"{d} design{'s' * (d > 1)} of {options.rungs} rungs cannot fit the law's {d + 2} constants "
            f"(E, alpha and one A per design): give --rungs {math.floor(1 + 2 / d) + 1} or more"
        )
    planned = []
    for trial in designs:
        cfg = trial.config
        if options.top is not None:
            top = options.top
        else:
            top = default_top(cfg, int(trial["params_total"]), options.rungs, params_max, options.spacing)  # type: ignore[arg-type]
        if params_max is not None and top > params_max:
            raise LadderError(
                f"the top rung of {format_si(top)} parameters is past the space's budget of "
                f"{format_si(params_max)}: give a smaller --top"
            )
        targets = rung_targets(top, options.rungs, options.spacing)  # type: ignore[arg-type]
        try:
            shapes = [rung_shape(cfg, t, params_max) for t in targets]
        except LadderError as exc:
            raise LadderError(f"trial {trial.number}: {exc}") from None
        for shape in shapes:
            if flops_max is not None and flop_counts(shape).forward > flops_max:
                raise LadderError(
                    f"trial {trial.number}'s rung of {format_si(param_counts(shape).total)} parameters "
                    f"needs {format_si(flop_counts(shape).forward)} forward FLOPs/token, past the space's "
                    f"budget of {format_si(flops_max)}: give a smaller --top"
                )
        # Neighbouring targets can come out as one shape where the grid is coarse (one 64-wide head:
        # d_model 64 at 1 layer is both 62k's and 88k's nearest at --spacing 1.41): one rung, the
        # first target's (`merged_rungs_note` says so); a design needs 2 shapes to have a trend.
        distinct = {shape: target for target, shape in reversed(list(zip(targets, shapes, strict=True)))}
        if len(distinct) < 2:
            raise LadderError(
                f"trial {trial.number}'s rungs below {format_si(top)} are all one shape: give a larger "
                "--top or a wider --spacing"
            )
        for shape, target in sorted(distinct.items(), key=lambda item: item[1]):
            tokens = rung_tokens(shape, options.tokens_per_param)
            settings = ladder_settings(proxy, tokens, options.seed, options.batch_size)
            planned.append(PlannedRung(trial.number, target, shape, settings))  # type: ignore[arg-type]
    if len(planned) <= d + 2:
        raise LadderError(
            f"{d} design{'s' * (d > 1)} with {len(planned)} distinct rungs cannot fit the law's {d + 2} "
            "constants (E, alpha and one A per design): give a larger --top or more --rungs"
        )
    _check_memory(planned)
    return planned


def merged_rungs_note(planned: Sequence[PlannedRung], rungs: int) -> str | None:
    """A note naming the designs whose neighbouring rungs came out as one shape (trained once), or
    None when every design has `rungs` shapes."""
    counts: dict[int, int] = {}
    for p in planned:
        counts[p.trial] = counts.get(p.trial, 0) + 1
    short = {t: n for t, n in counts.items() if n < rungs}
    if not short:
        return None
    listed = ", ".join(f"trial {t} {n}" for t, n in sorted(short.items()))
    return (
        f"note: neighbouring rungs of {len(short)} design{'s' * (len(short) > 1)} are one shape on the "
        f"width grid and train once ({listed} of {rungs} sizes); a wider --spacing gives distinct ones"
    )


def _check_memory(planned: Sequence[PlannedRung]) -> None:
    """Refuse rungs the device here cannot train at their batch, before Ray starts (the trainer's
    own check: `--batch-size 1T` failed every rung, exit 0, probe 8). Skipped where the device
    cannot be described here (CUDA asked for on a driver without one)."""
    from archsearch.evaluators.device import DeviceError, resolve_device
    from archsearch.evaluators.settings import TrainSettings
    from archsearch.evaluators.trainer import too_large

    if not planned:
        return
    settings = TrainSettings(**planned[0].settings)  # one device and batch for every rung
    try:
        info = resolve_device(settings.device)
    except DeviceError:
        return
    largest = max(planned, key=lambda p: p.params)
    if why := too_large(largest.config, settings.batch_size, largest.seq_len, info):
        raise LadderError(
            f"{_rung_name(largest)} at batch {settings.batch_size}: {why}; give a smaller --batch-size"
        )


def few_steps_note(planned: Sequence[PlannedRung]) -> str | None:
    """A note when the smallest rung trains fewer than `MIN_RUNG_STEPS` steps, naming the batch
    that would give it enough (or, where even batch 1 cannot, a larger --tokens-per-param); None
    when every rung has enough."""
    if not planned:
        return None
    short = min(planned, key=lambda p: p.steps)
    if short.steps >= MIN_RUNG_STEPS:
        return None
    batch = short.settings["tokens"] // (short.seq_len * MIN_RUNG_STEPS)  # the largest that gives enough
    fix = (
        f"--batch-size {batch} gives it enough"
        if batch >= 1
        else f"even batch 1 gives it {math.ceil(short.settings['tokens'] / short.seq_len)}: give a larger "
        "--tokens-per-param"
    )
    return (
        f"note: the smallest rung ({_rung_name(short)}) trains {short.steps} steps at batch "
        f"{short.batch_size}, fewer than the {MIN_RUNG_STEPS} a rung needs to follow the law; {fix}"
    )


# ------------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------------
def run_ladder(
    storage: Storage,
    options: LadderOptions,
    *,
    on_update: Callable[[LadderProgress], None] | None = None,
    run_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    planned: Sequence[PlannedRung] | None = None,
) -> LadderSummary:
    """Train the rungs not yet stored, then fit the study's ladders at this ratio and store the fit.

    Args:
        storage: the trial database (the study must be in it).
        options: see `LadderOptions`.
        on_update: called with a `LadderProgress` after each rung, for progress displays.
        run_fn: the Ray task body; `search.validate.long_run` (train one config) by default.
        planned: `plan_ladder(storage, options)` where the caller made it already (the CLI's note
            before training reads it): planning reads every design's trials and shapes once.

    Returns:
        A `LadderSummary`; `fit` is None and `signal` set when SIGINT / SIGTERM stopped it early
        (finished rungs are kept; a rerun continues), and `fit_error` says why when the rungs
        cannot be fitted.

    Raises:
        LadderError: see `plan_ladder`.
        ReadOnlyStorageError: the database cannot be written here.
    """
    from archsearch.search.driver import _RayPool, _signals, _Stop
    from archsearch.search.validate import long_run
    from archsearch.storage import shape_key

    record = storage.require_study(options.study)
    storage.require_writable()  # before training rungs whose results could not be stored
    planned = plan_ladder(storage, options) if planned is None else planned
    ratio = float(options.tokens_per_param)
    batch = planned[0].batch_size  # one recipe: every rung's settings come from one proxy
    records = storage.ladder_rungs(options.study, ratio, batch)
    stored = {r.key for r in records}
    # A shape trained for another trial of the same design (two trials differing only in size,
    # laddered to the same --top) is the same run: its result is stored for this trial too.
    known = {(r.shape_key, r.seed): r for r in records}
    todo, twins = [], {}  # twins: shape key -> rungs of other trials waiting on its run
    for p in planned:
        key = shape_key(p.config)
        if (p.trial, ratio, batch, key, options.seed) in stored:
            continue
        if (key, options.seed) in known:
            _store_twin(storage, options, p, known[(key, options.seed)])
        elif key in twins:
            twins[key].append(p)
        else:
            twins[key] = []
            todo.append(p)
    skipped = len(planned) - len(todo) - sum(len(t) for t in twins.values())
    data = record.spec.get("data")
    start = time.monotonic()
    failed: list[str] = []
    busy: list[str] = []
    trained = 0
    stop = _Stop("the ladder")
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    renewed = time.monotonic()

    def progress(last: str) -> None:
        if on_update is not None:
            elapsed = time.monotonic() - start
            on_update(LadderProgress(skipped + trained, len(planned), len(failed), last, elapsed))

    def admit(index: int) -> bool:
        """Claim a rung just before it starts; leave it to the ladder that holds it, or count it
        stored where another ladder stored it meanwhile."""
        nonlocal skipped
        rung = todo[index]
        why = storage.claim_ladder_rung(
            options.study, trial_number=rung.trial, tokens_per_param=ratio, batch_size=batch,
            config=rung.config, seed=options.seed, owner=owner, lease_s=CLAIM_LEASE_S,
        )  # fmt: skip
        if why is None:
            return True
        if why == "claimed":
            busy.append(_rung_name(rung))
            progress(f"{_rung_name(rung)}: another ladder is training it")
        else:  # stored by another ladder since this one planned
            skipped += 1
            progress(f"{_rung_name(rung)}: stored by another ladder")
        return False

    def renew() -> None:
        nonlocal renewed
        if time.monotonic() - renewed >= CLAIM_RENEW_S:
            storage.renew_ladder_claims(owner, CLAIM_LEASE_S)
            renewed = time.monotonic()

    def done(index: int, result: dict[str, Any] | None, reason: str | None) -> None:
        nonlocal trained, skipped
        rung = todo[index]
        name = _rung_name(rung)
        why = _store(storage, options, rung, result, reason)
        if why is None:
            trained += 1
            last = f"{name}: {result['val_loss']:.4f}"  # type: ignore[index]
            for twin in twins.get(shape_key(rung.config), []):  # the same run, stored once more
                _store(storage, options, twin, result, reason)
                skipped += 1
        else:
            failed.append(last := f"{name}: {why}")  # the summary reports it (the CLI once)
        progress(last)

    if todo:
        log.info("ladder %s: %d rungs to train, %d stored", options.study, len(todo), skipped)
        # Largest first: the longest runs start while the small ones fill the other workers.
        todo.sort(key=lambda p: -p.params)
        kept = "the rungs stored so far are kept; rerun the same command to train the rest"
        with _RayPool(options, run_fn or long_run, "the ladder", kept) as pool, _signals(stop):  # type: ignore[arg-type]
            pool.arm()
            if on_update is not None:
                on_update(LadderProgress(skipped, len(planned), 0, f"training {len(todo)} rungs", 0.0))
            cpus = options.cpus_per_trial
            requests = [
                (_rung_name(r), dict(config=r.config.to_dict(), settings=r.settings, data=data, cpus=cpus))
                for r in todo
            ]
            try:
                pool.run_each(
                    requests, retries=options.retries, stop=stop, done=done, admit=admit, tick=renew
                )
            finally:
                _release(storage, owner)
    rungs = tuple(storage.ladder_rungs(options.study, ratio, batch))
    if stop.signum is not None:
        return LadderSummary(
            options.study,
            ratio,
            batch,
            tuple(planned),
            rungs,
            None,
            None,
            trained,
            skipped,
            tuple(failed),
            stop.signum,
            tuple(busy),
        )
    fit, fit_error = None, None
    try:
        fit = fit_study_ladders(rungs)
    except LadderFitError as exc:
        fit_error = str(exc)
    if fit is not None:
        storage.add_ladder_fit(options.study, tokens_per_param=ratio, batch_size=batch, fit=fit.to_dict())
    return LadderSummary(
        options.study, ratio, batch, tuple(planned), rungs, fit, fit_error, trained, skipped, tuple(failed),
        busy=tuple(busy),
    )  # fmt: skip


def _release(storage: Storage, owner: str) -> None:
    """Drop this ladder's claims; where the database fails now, they lapse after their lease."""
    try:
        storage.release_ladder_claims(owner)
    except ArchsearchError as exc:
        log.warning(
            "the ladder's rung claims were not released (they lapse in %.0f s): %s", CLAIM_LEASE_S, exc
        )


def _store_twin(storage: Storage, options: LadderOptions, rung: PlannedRung, twin: LadderRungRecord) -> None:
    """Store `twin`'s run (the same shape, another trial) as `rung`'s, without training it again."""
    storage.add_ladder_rung(
        options.study,
        trial_number=rung.trial,
        tokens_per_param=options.tokens_per_param,
        batch_size=rung.batch_size,
        target_params=rung.target,
        config=rung.config,
        seed=options.seed,
        tokens=twin.tokens,
        val_loss=twin.val_loss,
        val_curve=twin.val_curve,
        settings={**twin.settings, "reused_from_trial": twin.trial_number},
        device_fingerprint=twin.device_fingerprint,
        corpus_fingerprint=twin.corpus_fingerprint,
        wall_time_s=0.0,
    )


def _rung_name(rung: PlannedRung) -> str:
    return f"trial {rung.trial} at {format_si(rung.params)}"


def _store(
    storage: Storage,
    options: LadderOptions,
    rung: PlannedRung,
    result: dict[str, Any] | None,
    reason: str | None,
) -> str | None:
    """Store one finished rung (one transaction); the reason instead when it has no loss.

    A failed rung is not stored, so a rerun tries it again.
    """
    if result is None or result["status"] != COMPLETE or result["val_loss"] is None:
        return reason or (result or {}).get("reason") or "no loss"
    storage.add_ladder_rung(
        options.study,
        trial_number=rung.trial,
        tokens_per_param=options.tokens_per_param,
        batch_size=rung.batch_size,
        target_params=rung.target,
        config=rung.config,
        seed=options.seed,
        tokens=result["tokens"],
        val_loss=result["val_loss"],
        val_curve=result["val_curve"],
        settings=rung.settings,
        device_fingerprint=result["device_fingerprint"],
        corpus_fingerprint=result["corpus_fingerprint"],
        wall_time_s=result["wall_time_s"],
    )
    return None


# ------------------------------------------------------------------------------------------------
# Reading ladders: the fit and its predictions
# ------------------------------------------------------------------------------------------------
def fit_study_ladders(rungs: Sequence[LadderRungRecord], *, resamples: int | None = None) -> LadderFit:
    """The law over stored rungs of one recipe (tokens per parameter and batch size): every design
    with at least 2 sizes, on non-embedding parameters; deterministic (the bootstrap is seeded).

    Raises:
        LadderFitError: no design has 2 sizes, rungs of several recipes, or too few rungs.
    """
    recipes = {r.recipe for r in rungs}
    if len(recipes) > 1:
        raise LadderFitError(
            f"rungs of {len(recipes)} recipes (tokens per parameter, batch size) cannot share one law"
        )
    sizes: dict[int, set[int]] = {}
    for r in rungs:
        sizes.setdefault(r.trial_number, set()).add(r.params_non_embedding)
    points = [
        RungPoint(r.trial_number, float(r.params_non_embedding), r.val_loss)
        for r in rungs
        if len(sizes[r.trial_number]) >= 2
    ]
    if not points:
        raise LadderFitError("no design has rungs of 2 sizes yet")
    kw = {} if resamples is None else {"resamples": resamples}
    return fit_ladders(points, **kw)


@dataclass(frozen=True)
class LadderPrediction:
    """What a trial's ladder predicts at a target shape."""

    trial: int
    tokens_per_param: float
    batch_size: int  # the rungs' (with the ratio, the recipe)
    target_params: int  # total
    target_non_embedding: int  # what the law is evaluated at
    prediction: Prediction
    rungs: tuple[LadderRungRecord, ...]  # this design's
    designs: int  # designs sharing the fit's E and alpha
    fit: LadderFit
    # (seed, loss): the prediction from each training seed's rungs alone, where the recipe's rungs
    # were trained at 2 seeds or more (`ladder --seed S`); empty otherwise (`seed_predictions`)
    by_seed: tuple[tuple[int, float], ...] = ()

    @property
    def tokens(self) -> int:
        """The training tokens the prediction is for: the ladder's ratio at the target."""
        return round(self.tokens_per_param * self.target_params)

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial": self.trial,
            "tokens_per_param": self.tokens_per_param,
            "batch_size": self.batch_size,
            "tokens": self.tokens,
            "target_params": self.target_params,
            "target_non_embedding": self.target_non_embedding,
            **{k: v for k, v in self.prediction.to_dict().items() if k != "design"},
            "rungs": [
                {
                    "params_total": r.params_total,
                    "params_non_embedding": r.params_non_embedding,
                    "tokens": r.tokens,
                    "loss": r.val_loss,
                }
                for r in self.rungs
            ],
            "designs": self.designs,
            "E": self.fit.e,
            "alpha": self.fit.alpha,
            "by_seed": {str(seed): loss for seed, loss in self.by_seed},
        }


def choose_recipe(
    rungs: Sequence[LadderRungRecord], trial: int, tokens_per_param: float | None
) -> tuple[float, int] | None:
    """The recipe (tokens per parameter, batch size) whose ladder of `trial` to use: of the ratio
    nearest (log scale) `tokens_per_param` when given, else of any, the one with the most rungs of
    the trial (ties: the larger ratio, then the smaller batch: more steps per rung); None when the
    trial has no ladder."""
    counts: dict[tuple[float, int], int] = {}
    for r in rungs:
        if r.trial_number == trial:
            counts[r.recipe] = counts.get(r.recipe, 0) + 1
    if not counts:
        return None
    if tokens_per_param is not None and tokens_per_param > 0:
        near = min({t for t, _ in counts}, key=lambda t: (abs(math.log(t / tokens_per_param)), -t))
        counts = {k: n for k, n in counts.items() if k[0] == near}
    return max(counts, key=lambda k: (counts[k], k[0], -k[1]))


def predict_trial(
    rungs: Sequence[LadderRungRecord],
    trial: int,
    target: ArchConfig,
    tokens: int | None = None,
) -> LadderPrediction | None:
    """`trial`'s ladder's prediction at the shape `target` (e.g. `--scale-to`'s), or None without a
    ladder. With `tokens`, the ladder whose ratio is nearest tokens / target parameters is used.

    Raises:
        LadderFitError: the trial has rungs but they cannot be fitted (one size, too few).
    """
    counts = param_counts(target)
    wanted = tokens / counts.total if tokens else None
    recipe = choose_recipe(rungs, trial, wanted)
    if recipe is None:
        return None
    same = [r for r in rungs if r.recipe == recipe]
    mine = tuple(r for r in same if r.trial_number == trial)
    if len({r.params_non_embedding for r in mine}) < 2:
        raise LadderFitError(
            f"trial {trial}'s ladder at {recipe[0]:g} tokens per parameter and batch {recipe[1]} has one "
            "size so far: rerun its `archsearch ladder` to train the rest"
        )
    fit = fit_study_ladders(same)
    prediction = fit.predict(trial, float(counts.non_embedding))
    return LadderPrediction(
        trial, *recipe, counts.total, counts.non_embedding, prediction, mine, len(fit.designs), fit,
        seed_predictions(same, trial, float(counts.non_embedding)),
    )  # fmt: skip


def seed_fits(rungs: Sequence[LadderRungRecord]) -> dict[int, LadderFit]:
    """The law fitted over each training seed's rungs of one recipe alone (every design's), by
    seed; a seed whose rungs cannot be fitted (a ladder still under way) is left out, and rungs of
    one seed give none (nothing to compare)."""
    seeds = sorted({r.seed for r in rungs})
    fits: dict[int, LadderFit] = {}
    for seed in seeds if len(seeds) > 1 else ():
        try:
            fits[seed] = fit_study_ladders([r for r in rungs if r.seed == seed], resamples=0)
        except LadderFitError:
            continue
    return fits


def seed_predictions(
    rungs: Sequence[LadderRungRecord],
    trial: int,
    n_non_embedding: float,
    fits: dict[int, LadderFit] | None = None,
) -> tuple[tuple[int, float], ...]:
    """`trial`'s loss at `n_non_embedding` predicted from each training seed's rungs of one recipe
    alone (`seed_fits`, or `fits` already made), by seed; empty unless 2 seeds or more can each be
    fitted with the trial in. How far they differ is how much the prediction owes to the seeds the
    rungs happened to get, which the bootstrap over rungs does not carry: on 12 tiny designs 4x past
    the top rung, 3 seeds' predictions of each spanned 5-14% (docs/guide/ladder.md)."""
    if len({r.seed for r in rungs if r.trial_number == trial}) < 2:
        return ()
    out = tuple(
        (seed, float(fit.loss(trial, n_non_embedding)))
        for seed, fit in (seed_fits(rungs) if fits is None else fits).items()
        if trial in fit.designs
    )
    return out if len(out) >= 2 else ()


def predict_at_size(
    storage: Storage, study: str, target_params: int, tokens_per_param: float | None = None
) -> tuple[list[tuple[TrialRecord, LadderPrediction]], list[str]]:
    """Every laddered design of `study` at `target_params`, best predicted loss first; each
    design's shape at the size is built as its rungs were (`rung_shape`).

    Returns:
        (the ranked (trial, prediction) pairs, notes on designs left out and why).

    Raises:
        LadderError: the study has no ladder (at that ratio).
        LadderFitError: its rungs cannot be fitted.
    """
    storage.require_study(study)
    rungs = storage.ladder_rungs(study)
    ratios = sorted({r.tokens_per_param for r in rungs})
    if not ratios:
        if not storage.counts(study).get(COMPLETE):  # `ladder --knee` would fail too (probe 10)
            raise LadderError(f"study {study!r} has no ladder, and no complete trial to ladder yet")
        raise LadderError(
            f"study {study!r} has no ladder: run `archsearch ladder --study {study} --knee` first"
        )
    if tokens_per_param is not None and float(tokens_per_param) not in ratios:
        have = ", ".join(f"{t:g}" for t in ratios)
        raise LadderError(
            f"study {study!r} has no ladder at {tokens_per_param:g} tokens per parameter (it has {have})"
        )
    # The recipe with the most designs (ties: the larger ratio, then the smaller batch).
    designs: dict[tuple[float, int], set[int]] = {}
    for r in rungs:
        if tokens_per_param is None or r.tokens_per_param == float(tokens_per_param):
            designs.setdefault(r.recipe, set()).add(r.trial_number)
    recipe = max(designs, key=lambda k: (len(designs[k]), k[0], -k[1]))
    same = [r for r in rungs if r.recipe == recipe]
    fit = fit_study_ladders(same)
    trials = {t.number: t for t in storage.trials_by_number(study, list(fit.designs))}
    ranked, notes = [], []
    for number in fit.designs:
        trial = trials.get(number)
        if trial is None:  # a damaged rung row: its trial number names no trial of the study
            notes.append(f"trial {number}: its rungs name a trial the study does not have")
            continue
        try:
            shape = rung_shape(trial.config, target_params)  # type: ignore[arg-type]
        except LadderError:  # its message advises `ladder`'s flags, which are not this command's
            notes.append(
                f"trial {number}: no shape keeping its design has {format_si(target_params)} parameters"
            )
            continue
        counts = param_counts(shape)
        mine = tuple(r for r in same if r.trial_number == number)
        p = fit.predict(number, float(counts.non_embedding))
        ranked.append(
            (
                trial,
                LadderPrediction(
                    number, *recipe, counts.total, counts.non_embedding, p, mine, len(fit.designs), fit
                ),
            )
        )
    left = sorted({r.trial_number for r in same} - set(fit.designs))
    notes += [f"trial {n}: its ladder has one size so far" for n in left]
    # Designs laddered under other recipes only: named, with the recipe ranked (probe 10: they
    # vanished from the ranking unsaid).
    elsewhere: dict[int, set[tuple[float, int]]] = {}
    for r in rungs:
        if r.trial_number not in designs[recipe]:
            elsewhere.setdefault(r.trial_number, set()).add(r.recipe)
    for n, recipes in sorted(elsewhere.items()):
        theirs = ", ".join(f"{t:g} tokens per parameter at batch {b}" for t, b in sorted(recipes))
        notes.append(
            f"trial {n}: laddered only at {theirs}; this ranking is at {recipe[0]:g} tokens per parameter "
            f"at batch {recipe[1]}, the recipe most designs share"
        )
    if not ranked:
        raise LadderError(
            f"no laddered design of {study!r} can be ranked at {format_si(target_params)} parameters: "
            + "; ".join(notes)
        )
    ranked.sort(key=lambda pair: (pair[1].prediction.loss, pair[0].number))
    return ranked, notes


# Said wherever a law whose E sits on its bound is shown or used (`LadderFit.floor_pinned`).
UNPINNED_FLOOR = (
    "note: these rungs do not pin the floor E (fitted at its bound, 0): the law falls without limit, so "
    "its losses far past the top rung are likely too low; larger rungs or more designs pin it"
)


def backtest_line(fit: LadderFit) -> str | None:
    """A study fit's backtest (`LadderFit.backtest`, designs being trial numbers) in one line, or None
    where it has none."""
    tested = fit.backtest()
    if not tested:
        return None
    errors = {d: e for d, (e, _) in tested.items()}
    worst = max(errors, key=lambda d: abs(errors[d]))
    distances = [dist for _, dist in tested.values()]
    median = statistics.median(abs(e) for e in errors.values())
    return (
        f"backtest: fitted without each design's top rung, the law predicts it ({min(distances):.1f}x-"
        f"{max(distances):.1f}x past the rungs left) with median |error| {median:.1%}, worst "
        f"{errors[worst]:+.1%} (trial {worst}) over {len(errors)} design{'s' * (len(errors) != 1)}"
    )
