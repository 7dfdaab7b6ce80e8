"""Planning a size ladder: which designs, which rungs, and each rung's shape and training settings.

A search ranks designs at 0.1-2M parameters; users train at 100M-70B, and the best design can
change with scale (Tay et al. 2022), so the loss axis of a front says little about the user's size
on its own. A ladder trains one chosen trial's design at several sizes (`ladder_runs`) and fits a
law across ladders (`results.ladder`):

1. The designs: `--trial N` (repeatable), the front's `--knee`, or every `--front` member; each a
   complete trial whose design (`space.scale_candidates.design_choices`) is kept.
2. The rungs: `rungs` sizes spaced `spacing` x apart (`SPACING`, 2x, by default), the largest
   `top` total parameters (default the trial's own size, raised when the smallest rung cannot be
   built: `default_top`; never past the space's `[budget]`); neighbours that come out as one shape
   are one rung. Each rung's shape is re-chosen the
   way `export --scale-to` re-chooses one (`space.scale_candidates.scaled_candidates`: the design kept,
   depth from the aspect window published models use at that size) on finer grids than a GPU's
   (d_model a multiple of `D_MODEL_GRID`, d_ff of `D_FF_GRID`, the trial's head_dim): at 20k-2M
   parameters the 128-wide tiles of the GPU grid are coarser than the 2x between rungs. The pick
   trades closeness to the target against an aspect near the window's centre (`rung_shape`), so
   a design's rungs form one family; the fit uses each shape's exact count.
3. The settings: the study's `[proxy]` settings with `tokens_per_param` x the rung's total
   parameters tokens (Chinchilla's 20 by default: `--scale-to 1.3B --tokens 26B` is that ratio),
   with the cosine schedule and floor that `validate`'s long runs use (how users train), at the
   `--batch-size`, else the proxy's batch lowered until the smallest rung trains `MIN_RUNG_STEPS`
   steps (`plan_ladders`). A ratio and a batch size make a recipe: rungs of one recipe share one
   law, and a rung is stored per recipe. The batch matters at these sizes: at the tiny study's
   batch of 16, 5 tokens per parameter give its 62k rungs 150 steps, too few for their loss to
   follow the law.

Everything here is checked before anything trains: a plan that cannot train writes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from archsearch.errors import ArchsearchError
from archsearch.space.costs import flop_counts, param_counts
from archsearch.space.scale_candidates import aspect_range, scaled_candidates
from archsearch.trial import COMPLETE
from archsearch.units import MAX_WHOLE, SEED_MAX, format_si, ray_resources_problem, short_number, whole

if TYPE_CHECKING:
    from archsearch.space.config import ArchConfig
    from archsearch.storage import Storage, TrialRecord

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
    # Ray, as `SearchOptions` names them (`pool.PoolOptions`: the pool reads these four).
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
    """`cfg`'s design at `target` total parameters, as a ladder builds it (this module's docstring, 2).

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
            end).
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
    """Refuse rungs the device here cannot train at their batch, before Ray starts: the trainer's
    own check, so an impossible `--batch-size` fails once here rather than every rung failing with
    exit 0. Skipped where the device cannot be described here (CUDA asked for on a driver without
    one)."""
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
            f"{rung_name(largest)} at batch {settings.batch_size}: {why}; give a smaller --batch-size"
        )


def enough_batch(planned: Sequence[PlannedRung]) -> int | None:
    """The largest batch that gives the smallest rung `MIN_RUNG_STEPS` steps; None when it has them
    at its planned batch or when even batch 1 cannot give them."""
    if not planned:
        return None
    short = min(planned, key=lambda p: p.steps)
    if short.steps >= MIN_RUNG_STEPS:
        return None
    batch = short.settings["tokens"] // (short.seq_len * MIN_RUNG_STEPS)
    return int(batch) if batch >= 1 else None


def plan_ladders(
    storage: Storage, every: Sequence[LadderOptions]
) -> tuple[list[LadderOptions], list[list[PlannedRung]], str | None]:
    """Each ratio's plan (`plan_ladder`), all checked before any trains, and the batch they train at.

    Without `batch_size` the rungs train at the study's proxy batch, lowered where the smallest rung
    of any ratio would train fewer than `MIN_RUNG_STEPS` steps to the largest batch that gives it
    that many (measured on 0.06-2M CPU rungs at 5 tokens per parameter: the tiny study's batch of
    16 gave its smallest rungs 150-300 steps and missed real 2M runs by 5.2% at the median, batch 4,
    600+ steps, by 1.4%). One batch for every ratio, so their rungs make one recipe and one joint
    law. Returns the options as they will train, their plans, and a note naming a lowered batch.
    """
    plans = [plan_ladder(storage, options) for options in every]
    if any(options.batch_size is not None for options in every):
        return list(every), plans, None
    lowered = [b for b in (enough_batch(p) for p in plans) if b is not None]
    if not lowered:
        return list(every), plans, None
    batch = min(lowered)
    short = min((p for plan in plans for p in plan), key=lambda p: p.steps)
    every = [replace(options, batch_size=batch) for options in every]
    plans = [plan_ladder(storage, options) for options in every]
    note = (
        f"note: rungs train at batch {batch}, not the proxy's {short.batch_size}, so the smallest "
        f"({rung_name(short)}) gets {MIN_RUNG_STEPS}+ steps, not {short.steps}: the law needs them on "
        "small rungs (--batch-size sets another)"
    )
    return every, plans, note


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
        f"note: the smallest rung ({rung_name(short)}) trains {short.steps} steps at batch "
        f"{short.batch_size}, fewer than the {MIN_RUNG_STEPS} a rung needs to follow the law; {fix}"
    )


def rung_name(rung: PlannedRung) -> str:
    return f"trial {rung.trial} at {format_si(rung.params)}"


def parse_ratios(text: str) -> tuple[float, ...]:
    """`--tokens-per-param`: one ratio (20) or a comma list (5,20), each a finite number > 0, none
    twice; a ladder is trained at each and the joint law L(N, D) fitted across them.

    Raises:
        LadderError: an entry that is not a number, is not finite and > 0, or is given twice.
    """
    ratios = []
    for item in text.split(","):
        try:
            ratio = float(item)
        except ValueError:
            raise LadderError(
                f"--tokens-per-param takes numbers separated by commas (5,20), got {text!r}"
            ) from None
        if not (math.isfinite(ratio) and ratio > 0):
            raise LadderError(f"--tokens-per-param must be a finite number > 0, got {ratio}")
        if ratio in ratios:
            raise LadderError(f"--tokens-per-param gives {ratio:g} twice")
        ratios.append(ratio)
    return tuple(ratios)
