"""Reading size ladders: the law fitted over a study's stored rungs (`ladder_fit`), the loss it
predicts for a trial's design at another size, and the lines that say how far to trust it.

The rungs are planned in `search.ladder_plan` and trained in `search.ladder_runs`
(`archsearch ladder`, whose command line is `archsearch.cli.ladder`); `export --scale-to` and
`pareto --at-size` read them here. A design's shape
at another size is built as its rungs were (`ladder_plan.rung_shape`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from archsearch.results.ladder_fit import LadderFit, LadderFitError, Prediction, RungPoint, fit_ladders
from archsearch.search.ladder_plan import LadderError, rung_shape
from archsearch.space.costs import param_counts
from archsearch.trial import COMPLETE
from archsearch.units import format_si

if TYPE_CHECKING:
    from archsearch.space.config import ArchConfig
    from archsearch.storage import LadderRungRecord, Storage, TrialRecord


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
    return _fit_rungs(rungs, resamples, with_tokens=False)


def fit_study_ladders_joint(rungs: Sequence[LadderRungRecord], *, resamples: int | None = None) -> LadderFit:
    """The joint law `L(N, D) = E + A_d N^-alpha + B D^-beta` over stored rungs of one batch size at
    two tokens-per-parameter ratios or more: every design with at least 2 sizes, on non-embedding
    parameters and each rung's training tokens; deterministic (the bootstrap is seeded).

    Raises:
        LadderFitError: rungs of several batch sizes, of one ratio, no design of 2 sizes, too few rungs.
    """
    batches = {r.batch_size for r in rungs}
    if len(batches) > 1:
        raise LadderFitError(f"rungs of {len(batches)} batch sizes cannot share one law L(N, D)")
    if len({r.tokens_per_param for r in rungs}) < 2:
        raise LadderFitError("rungs of one tokens-per-parameter ratio cannot fit L(N, D): ladder a second")
    return _fit_rungs(rungs, resamples, with_tokens=True)


def _fit_rungs(rungs: Sequence[LadderRungRecord], resamples: int | None, *, with_tokens: bool) -> LadderFit:
    """The law over every design of `rungs` with at least 2 sizes, on non-embedding parameters (and
    with its training tokens, each rung's, for the joint law)."""
    sizes: dict[int, set[int]] = {}
    for r in rungs:
        sizes.setdefault(r.trial_number, set()).add(r.params_non_embedding)
    points = []
    for r in rungs:
        if len(sizes[r.trial_number]) >= 2:
            tokens = float(r.tokens) if with_tokens else None
            points.append(RungPoint(r.trial_number, float(r.params_non_embedding), r.val_loss, tokens))
    if not points:
        raise LadderFitError("no design has rungs of 2 sizes yet")
    kw = {} if resamples is None else {"resamples": resamples}
    return fit_ladders(points, **kw)


def joint_batch(rungs: Sequence[LadderRungRecord], trial: int | None = None) -> int | None:
    """The batch size whose rungs (of `trial`, or of any design) lie at two tokens-per-parameter
    ratios or more, the one with the most such designs (ties: the smaller batch); None where none."""
    ratios: dict[tuple[int, int], set[float]] = {}
    for r in rungs:
        if trial is None or r.trial_number == trial:
            ratios.setdefault((r.batch_size, r.trial_number), set()).add(r.tokens_per_param)
    designs: dict[int, int] = {}
    for (batch, _), seen in ratios.items():
        if len(seen) >= 2:
            designs[batch] = designs.get(batch, 0) + 1
    return max(designs, key=lambda b: (designs[b], -b)) if designs else None


def ratio_note(ladder_ratio: float, yours: float) -> str | None:
    """The one line that says a prediction is at the ladder's one ratio, not the user's, and how to
    get theirs; None where the two are one ratio (within 5%)."""
    if abs(yours / ladder_ratio - 1) <= 0.05:
        return None
    far = yours / ladder_ratio
    how = f"{far:,.0f}x past" if far >= 10 else f"{far:.1f}x past" if far > 1 else f"{1 / far:.1f}x below"
    second = ladder_ratio / 4 if far > 1 else ladder_ratio * 4
    pair = ",".join(f"{r:g}" for r in sorted((second, ladder_ratio)))
    return (
        f"predicted at {ladder_ratio:g} tokens per parameter; you train at {yours:,.0f} ({how}): ladder a "
        f"second ratio (--tokens-per-param {pair}) for the loss at yours"
    )


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
    # The ratios laddered where the joint law L(N, D) made the prediction (then `tokens_per_param` is
    # the user's ratio, not a ladder's); empty for the law in N alone at the ladder's one ratio.
    ratios: tuple[float, ...] = ()

    @property
    def joint(self) -> bool:
        return bool(self.ratios)

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
            **({"ratios_laddered": list(self.ratios)} if self.ratios else {}),
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
    batch = joint_batch(rungs, trial) if tokens else None
    if tokens and batch is not None:
        return _predict_joint(rungs, trial, batch, counts.total, counts.non_embedding, tokens)
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


def _predict_joint(
    rungs: Sequence[LadderRungRecord], trial: int, batch: int, total: int, non_embedding: int, tokens: int
) -> LadderPrediction:
    """`trial`'s loss at (`non_embedding` parameters, `tokens`) by the joint law over every design's
    rungs of `batch` (the trial's at two ratios or more)."""
    same = [r for r in rungs if r.batch_size == batch]
    mine = tuple(r for r in same if r.trial_number == trial)
    fit = fit_study_ladders_joint(same)
    prediction = fit.predict(trial, float(non_embedding), float(tokens))
    ratios = tuple(sorted({r.tokens_per_param for r in mine}))
    return LadderPrediction(
        trial, tokens / total, batch, total, non_embedding, prediction, mine, len(fit.designs), fit,
        ratios=ratios,
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
    storage: Storage,
    study: str,
    target_params: int,
    tokens_per_param: float | None = None,
    tokens: int | None = None,
) -> tuple[list[tuple[TrialRecord, LadderPrediction]], list[str]]:
    """Every laddered design of `study` at `target_params`, best predicted loss first; each
    design's shape at the size is built as its rungs were (`rung_shape`). With `tokens`, where
    designs are laddered at two ratios or more of one batch size, the joint law L(N, D) over that
    batch's rungs predicts each at (N, `tokens`) (`LadderPrediction.joint`); else the recipe's law
    at its own ratio does, as without.

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
        if not storage.counts(study).get(COMPLETE):  # `ladder --knee` would fail too: say so
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
    batch = joint_batch(rungs) if tokens and tokens_per_param is None else None
    if batch is not None:  # the joint law: every ratio of the batch, one fit
        same = [r for r in rungs if r.batch_size == batch]
        fit = fit_study_ladders_joint(same)
        designs[recipe] = {r.trial_number for r in same}
    else:
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
        if batch is not None:
            p = fit.predict(number, float(counts.non_embedding), float(tokens))  # type: ignore[arg-type]
            ratios = tuple(sorted({r.tokens_per_param for r in mine}))
            found = LadderPrediction(
                number, tokens / counts.total, batch, counts.total, counts.non_embedding, p, mine,  # type: ignore[operator]
                len(fit.designs), fit, ratios=ratios,
            )  # fmt: skip
        else:
            p = fit.predict(number, float(counts.non_embedding))
            found = LadderPrediction(
                number, *recipe, counts.total, counts.non_embedding, p, mine, len(fit.designs), fit
            )
        ranked.append((trial, found))
    left = sorted({r.trial_number for r in same} - set(fit.designs))
    notes += [f"trial {n}: its ladder has one size so far" for n in left]
    # Designs laddered under other recipes only: named, with the recipe ranked, so none vanishes
    # from the ranking unsaid.
    elsewhere: dict[int, set[tuple[float, int]]] = {}
    for r in rungs:
        if r.trial_number not in designs[recipe]:
            elsewhere.setdefault(r.trial_number, set()).add(r.recipe)
    ranking = (
        f"the joint law L(N, D) over batch {batch}'s rungs"
        if batch is not None
        else f"at {recipe[0]:g} tokens per parameter at batch {recipe[1]}, the recipe most designs share"
    )
    for n, recipes in sorted(elsewhere.items()):
        theirs = ", ".join(f"{t:g} tokens per parameter at batch {b}" for t, b in sorted(recipes))
        notes.append(f"trial {n}: laddered only at {theirs}; this ranking is {ranking}")
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


def joint_line(fit: LadderFit, ratios: Sequence[float], batch: int) -> str:
    """The joint law `fit_study_ladders_joint` fitted over rungs at `ratios` tokens per parameter of
    `batch`, in one line: its constants with their 95% bootstrap intervals and its residuals."""
    d = fit.to_dict()
    (e_low, e_high), (a_low, a_high), (b_low, b_high) = (
        d[k] or (math.nan, math.nan) for k in ("E_interval", "alpha_interval", "beta_interval")
    )
    return (
        f"joint law: L(N, D) = E + A_d N^-alpha + B D^-beta over {len(fit.designs)} designs at "
        f"{' and '.join(f'{r:g}' for r in sorted(ratios))} tokens per parameter, batch {batch}: E "
        f"{fit.e:.4f} [{e_low:.3f}, {e_high:.3f}], alpha "
        f"{fit.alpha:.4f} [{a_low:.3f}, {a_high:.3f}], B {fit.token_coefficient:.4g}, beta {fit.beta:.4f} "
        f"[{b_low:.3f}, {b_high:.3f}] ({d['resamples']} resamples); residuals rms {d['rmse']:.4f}, worst "
        f"{d['max_abs_relative_residual']:.2%}; `export --scale-to N --tokens D` and `pareto --at-size N "
        "--tokens D` predict at your (N, D)"
    )
