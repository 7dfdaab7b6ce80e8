"""Pareto fronts of finished trials: the front, its knee and its hypervolume.

Plain numpy over "lower is better" values (every archsearch objective is minimised). FLOPs and
step times span orders of magnitude, so the knee and the hypervolume see them on a log scale
(`LOG_OBJECTIVES`); losses are used as they are. Background: docs/explanations/fronts.md.

- The front: trials no other trial dominates (no worse in every objective, better in one).
- The knee: the front member closest to the ideal point (each objective's best on the front)
  after scaling each objective to [0, 1] over the front; the best trade-off when every
  objective weighs the same.
- The hypervolume: the volume the front dominates up to a reference point, in the scaled space
  `(log10 value)` for log objectives. Two searches compare by it only with the same reference
  point, so the reference is always stated with the number.

A study's front ranks its own loss objective by default: the proxy loss as stored, or, for a
study with a size beta or an extrapolation (`[objectives].size_beta`, `extrapolate`), the proxy
loss extrapolated by its curve's last change and credited for size,
`loss + extrapolate * change - beta ln(params / 1M)` (`objectives.loss_objective`), which ranks
10x-longer training better than the proxy loss alone (docs/accuracy.md, "The loss objective").
Either can be asked for: `loss="proxy"`, or `loss="adjusted"` (the study's rule; without a beta
of its own, `fidelity.size_adjusted_losses`'s equal-weight beta over the trials ranked).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from archsearch.errors import ArchsearchError
from archsearch.search.fidelity import loss_objectives
from archsearch.space.objectives import (
    LOG_OBJECTIVES,
    OBJECTIVE_COLUMNS,
    LossRule,
    parse_objectives,
)

if TYPE_CHECKING:
    from archsearch.storage import PromotionRanking, Storage

# The loss a study's front ranks: the proxy loss as stored, or the study's loss objective.
LOSS_MEASURES = ("proxy", "adjusted")


def pareto_mask(values: np.ndarray) -> np.ndarray:
    """Which rows of `values` (n x m, all minimised) no other row dominates.

    Rows with a NaN are never on the front. Duplicated rows are all kept. O(n log n) for two
    objectives, O(n x front) beyond.
    """
    values = np.asarray(values, dtype=float)
    n = len(values)
    mask = np.zeros(n, dtype=bool)
    finite = np.flatnonzero(~np.isnan(values).any(axis=1))
    if len(finite) == 0:
        return mask
    v = values[finite]
    if v.shape[1] == 2:
        # Sorted by the first objective, ties by the second, a row is kept when its second
        # objective is its run of equal firsts' smallest and below every earlier run's.
        order = np.lexsort((v[:, 1], v[:, 0]))
        first, second = v[order, 0], v[order, 1]
        starts = np.flatnonzero(np.r_[True, first[1:] != first[:-1]])
        start = starts[np.searchsorted(starts, np.arange(len(order)), side="right") - 1]
        best_before = np.r_[np.inf, np.minimum.accumulate(second)][start]
        keep = (second == second[start]) & (second[start] < best_before)
        mask[finite[order[keep]]] = True
        return mask
    order = np.lexsort(v.T[::-1])
    front: list[int] = []
    for idx in order:
        row = v[idx]
        dominated = any(np.all(v[f] <= row) and np.any(v[f] < row) for f in front)
        if not dominated:
            front.append(idx)
    mask[finite[front]] = True
    return mask


def scaled(values: np.ndarray, objectives: Sequence[str]) -> np.ndarray:
    """Values with the log objectives as log10 (non-positive values become NaN)."""
    out = np.array(values, dtype=float)
    for j, name in enumerate(objectives):
        if name in LOG_OBJECTIVES:
            col = out[:, j]
            with np.errstate(divide="ignore", invalid="ignore"):
                out[:, j] = np.where(col > 0, np.log10(np.where(col > 0, col, 1.0)), np.nan)
    return out


def knee_index(front_values: np.ndarray, objectives: Sequence[str]) -> int:
    """Index (into `front_values`) of the front member closest to the ideal point.

    Each objective is scaled to [0, 1] over the front (log10 for FLOPs and step time), so the
    ideal point is the origin; ties go to the lower loss (the first objective).
    """
    v = scaled(front_values, objectives)
    low, high = np.nanmin(v, axis=0), np.nanmax(v, axis=0)
    span = np.where(high > low, high - low, 1.0)
    distance = np.sqrt((((v - low) / span) ** 2).sum(axis=1))
    return int(np.lexsort((v[:, 0], distance))[0])


def hypervolume(front_values: np.ndarray, reference: Sequence[float]) -> float:
    """The volume dominated by `front_values` (n x m, minimised) up to `reference` (exact).

    Points not strictly better than the reference in every objective add nothing. Two
    objectives: a sweep; more: slices along the last objective, each an (m-1)-D hypervolume
    (exact, O(n^(m-1) log n): fine for fronts of hundreds of points).
    """
    ref = np.asarray(reference, dtype=float)
    v = np.asarray(front_values, dtype=float)
    v = v[np.all(v < ref, axis=1)] if len(v) else v.reshape(0, len(ref))
    if len(v) == 0:
        return 0.0
    if v.shape[1] == 1:
        return float(ref[0] - v[:, 0].min())
    if v.shape[1] == 2:
        v = v[pareto_mask(v)]
        v = v[np.argsort(v[:, 0])]
        xs = np.append(v[1:, 0], ref[0])
        return float(np.sum((xs - v[:, 0]) * (ref[1] - v[:, 1])))
    # Slice along the last objective: between consecutive levels, the dominated region's cross
    # section is the (m-1)-D hypervolume of the points at or below that level.
    levels = np.unique(v[:, -1])
    bounds = np.append(levels[1:], ref[-1])
    total = 0.0
    for level, upper in zip(levels, bounds, strict=True):
        below = v[v[:, -1] <= level][:, :-1]
        total += hypervolume(below, ref[:-1]) * (upper - level)
    return float(total)


@dataclass(frozen=True)
class Front:
    """The Pareto front of a set of trials, in the objectives given, sorted by the first."""

    objectives: tuple[str, ...]
    numbers: tuple[int, ...]  # trial numbers on the front, by the first objective (loss)
    values: np.ndarray  # their objective values, one row each (raw units)
    knee: int  # the knee's trial number
    hypervolume: float  # in the scaled space (log10 for FLOPs and step time)
    reference: tuple[float, ...]  # the reference point, raw units


def reference_point(values: np.ndarray, objectives: Sequence[str], margin: float = 0.1) -> tuple[float, ...]:
    """A default reference point: each objective's worst value among `values`, plus a margin
    (10% of the loss, 10% on the log scale for FLOPs and step time)."""
    worst = np.nanmax(np.asarray(values, dtype=float), axis=0)
    # w + |w| margin, not w (1 + margin): a size-adjusted loss can be negative (a huge shape).
    return tuple(
        float(w * 10**margin) if name in LOG_OBJECTIVES else float(w + abs(w) * margin)
        for w, name in zip(worst, objectives, strict=True)
    )


def pareto_front(
    numbers: Sequence[int],
    values: np.ndarray,
    objectives: Sequence[str],
    reference: Sequence[float] | None = None,
) -> Front | None:
    """The front of the trials `numbers` with objective `values` (rows aligned); None if empty.

    Args:
        numbers: trial numbers.
        values: n x len(objectives), raw units, minimised; rows with a NaN are left out.
        objectives: names from OBJECTIVE_COLUMNS, loss first by convention.
        reference: the hypervolume's reference point in raw units; default `reference_point`
            over all the given trials.
    """
    values = np.asarray(values, dtype=float).reshape(len(numbers), len(objectives))
    mask = pareto_mask(scaled(values, objectives))
    if not mask.any():
        return None
    idx = np.flatnonzero(mask)
    idx = idx[np.argsort(values[idx, 0], kind="stable")]  # along the front, by loss
    finite = values[~np.isnan(values).any(axis=1)]
    ref = tuple(reference) if reference is not None else reference_point(finite, objectives)
    front_values = values[idx]
    scaled_ref = scaled(np.asarray([ref]), objectives)[0]
    with np.errstate(over="ignore", invalid="ignore"):  # said below, not as numpy's warning on stderr
        volume = hypervolume(scaled(front_values, objectives), scaled_ref)
    if not math.isfinite(volume):  # `--reference 1e308,1e308`: inf, printed as JSON's invalid Infinity
        raise ArchsearchError(
            f"the hypervolume against the reference point {tuple(float(r) for r in ref)} overflows a float: "
            "give a reference nearer the front"
        )
    return Front(
        objectives=tuple(objectives),
        numbers=tuple(int(numbers[i]) for i in idx),
        values=front_values,
        knee=int(numbers[idx[knee_index(front_values, objectives)]]),
        hypervolume=volume,
        reference=ref,
    )


# ------------------------------------------------------------------------------------------------
# Fronts of studies in a trial database
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StudyFront:
    """A study's front with what a report or plot needs."""

    study: str
    front: Front
    records: tuple[Any, ...]  # the front members' TrialRecords, in front order
    trial_numbers: tuple[int, ...]  # every complete trial with all objectives (faded plot points)
    trial_values: np.ndarray  # and their objective values
    throughput: dict[int, tuple[float, str, bool]]  # number -> (tokens/s, device, modelled)
    # Set when the loss column of the values is the adjusted loss: its rule (`objectives.LossRule`,
    # its beta the one used) and where the beta came from; None when it is the proxy loss as stored.
    loss_rule: LossRule | None = None
    beta_rule: str | None = None
    # Set for a study with promotions: the loss of its contenders in the values is their loss at
    # `ranking.budget`, the other trials' estimated there from their first pass (`placed`;
    # `promotion.ranking_line` says so).
    ranking: PromotionRanking | None = None

    def ranked_tokens(self, number: int) -> int | None:
        """The tokens trial `number`'s loss is ranked at: the ranking's budget (measured for a
        contender, estimated for the others), else the proxy's."""
        if self.ranking is None:
            return None
        return self.ranking.budget if self.ranking.ranked else self.ranking.proxy_tokens

    def estimated(self, number: int) -> bool:
        """Whether trial `number`'s ranked loss is estimated at the ranking's budget (not promoted)."""
        return self.ranking is not None and bool(self.ranking.ranked) and number not in self.ranking.ranked

    def ranked_loss(self, record: Any) -> float:
        """A front member's loss at the budget it is ranked at (before any size credit): measured
        for a contender; for a trial not promoted, estimated there on a front of the proxy loss
        (the value it is ranked by), its first pass's measured loss on a front of the adjusted loss
        (whose estimate is of the adjusted loss alone)."""
        p = self.ranking.ranked.get(record.number) if self.ranking else None
        if p is not None and p.val_loss is not None:
            return float(p.val_loss)
        if self.loss_rule is None and self.estimated(record.number) and "loss" in self.front.objectives:
            row = self.trial_numbers.index(record.number)
            return float(self.trial_values[row, list(self.front.objectives).index("loss")])
        return float(record["loss"])

    @property
    def size_beta(self) -> float | None:
        """The adjusted loss's beta (nats per e-fold of parameters); None: the proxy loss."""
        return None if self.loss_rule is None else self.loss_rule.size_beta

    def to_dict(self, long: dict[int, tuple[float, float, int]] | None = None) -> dict[str, Any]:
        """JSON-ready; `long` (`Storage.long_run_losses`) adds each member's long-run loss.

        "loss" is the loss the member is ranked by; a front of the adjusted loss ranks
        "adjusted_loss", adds it to each member and states its rule ("size_beta", "extrapolate"),
        and "loss" is then the measured loss (at the member's first pass unless promoted). A study
        with promotions adds each member's "budget_tokens" (the tokens it is ranked at),
        "estimated" (true: not promoted, its ranked loss estimated at that budget, `placed`) and a
        "ranking" entry (`ranking_dict`).
        """
        rows = []
        for r, values in zip(self.records, self.front.values, strict=True):
            tps = self.throughput.get(r.number)
            extra = {}
            if long:
                multiplier, loss, seeds = long.get(r.number, (None, None, 0))
                extra = {"long_loss": loss, "long_multiplier": multiplier, "long_seeds": seeds}
            objectives = dict(zip(self.front.objectives, map(float, values), strict=True))
            if self.size_beta is not None:  # the values hold the adjusted loss; "loss" stays as measured
                adjusted = objectives.pop("loss")
                objectives = {"loss": self.ranked_loss(r), "adjusted_loss": adjusted, **objectives}
            if self.ranking is not None:
                objectives["budget_tokens"] = self.ranked_tokens(r.number)
                objectives["estimated"] = self.estimated(r.number)
            rows.append(
                {
                    "number": r.number,
                    "knee": r.number == self.front.knee,
                    **objectives,
                    "params_total": r["params_total"],
                    "tokens_per_second": tps[0] if tps else None,
                    "throughput_device": tps[1] if tps else None,
                    "throughput_modelled": tps[2] if tps else None,
                    **extra,
                    "config": r.config.to_dict(),
                }
            )
        return {
            "study": self.study,
            "objectives": list(self.front.objectives),
            "loss": "proxy" if self.loss_rule is None else "adjusted",
            "size_beta": self.size_beta,
            "extrapolate": None if self.loss_rule is None else self.loss_rule.extrapolate,
            "trials": len(self.trial_numbers),
            "hypervolume": self.front.hypervolume,
            "reference": list(self.front.reference),
            "knee": self.front.knee,
            "front": rows,
            **self.ranking_dict(),
        }

    def ranking_dict(self) -> dict[str, Any]:
        """JSON-ready, for a study with promotions: {"ranking": the contenders, the budget they
        are ranked at (None: the proxy's) and the proxy's tokens, at which every other trial is
        ranked, and where the contenders were trained at more than one proxy seed, how many ("seeds":
        their values are the means over them)}; else nothing, so a study without promotions reads as
        it always did; and the stall-checked trials with the seeds each one's first pass is the
        mean of ("stall_checked": {trial number: seeds})."""
        r = self.ranking
        if r is None:
            return {}
        said = {"contenders": list(r.contenders), "ranked_at": r.budget, "proxy_tokens": r.proxy_tokens}
        if r.seeds > 1:  # the contenders' values are means over seed repeats; one seed reads as it did
            said["seeds"] = r.seeds
        if r.checked:  # stall-checked trials: their first pass is their mean over these seeds
            said["stall_checked"] = {str(n): list(m.seeds) for n, m in r.checked.items()}
        return {"ranking": said}


def loss_measure(storage: Storage, study: str, loss: str | None) -> tuple[str, LossRule | None]:
    """(the loss a front of `study` ranks, the study's rule for it or None): `loss` None is the
    study's own loss objective; "adjusted" is the study's rule (`StudyRecord.loss_rule`), whose
    beta None is then taken over the trials ranked.

    Raises:
        ArchsearchError: an unknown study or `loss`.
    """
    if loss is not None and loss not in LOSS_MEASURES:
        raise ArchsearchError(f"--loss must be one of {', '.join(LOSS_MEASURES)}, got {loss!r}")
    rule = storage.require_study(study).loss_rule
    if loss is None:
        loss = "proxy" if rule.plain else "adjusted"
    return loss, rule if loss == "adjusted" else None


def _ranked(
    storage: Storage, study: str, objectives: Sequence[str] | None, loss: str
) -> tuple[tuple[str, ...], list[int], np.ndarray, np.ndarray, np.ndarray]:
    """The trials a front of `study` ranks: (objectives, numbers, raw values, params_total, the
    curves' last changes, 0 where none is stored); a stall-checked trial's loss and change its
    means over its seeds at the proxy's budget (`Storage.stall_checks`), its first pass.

    Complete trials with every objective, and with a parameter count when `loss` is "adjusted".
    """
    record = storage.require_study(study)
    names = parse_objectives(objectives or record.objectives)
    columns = [*(OBJECTIVE_COLUMNS[o] for o in names), "params_total", "loss_change"]
    numbers, rows = storage.complete_values(study, columns)
    table = np.array(rows, dtype=float).reshape(len(numbers), len(names) + 2)  # None -> NaN
    values, params, changes = table[:, :-2], table[:, -2], table[:, -1]
    changes = np.where(np.isnan(changes), 0.0, changes)  # rows from before the change was stored
    if "loss" in names:
        column, checks = names.index("loss"), storage.stall_checks(study)
        for i, number in enumerate(numbers):
            if (m := checks.get(number)) is not None and m.val_loss is not None:
                values[i, column], changes[i] = m.val_loss, m.loss_change
    keep = ~np.isnan(values).any(axis=1)
    if loss == "adjusted":
        keep &= np.isfinite(values[:, 0]) & (params > 0)
    kept = [n for n, k in zip(numbers, keep, strict=True) if k]
    return names, kept, values[keep], params[keep], changes[keep]


def promoted(
    storage: Storage,
    study: str,
    objectives: Sequence[str],
    numbers: Sequence[int],
    values: np.ndarray,
    changes: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, PromotionRanking | None]:
    """`values` and `changes` (rows of `numbers`) with each promoted contender's proxy loss and
    curve change replaced by its promotion's at the budget the study ranks it at
    (`Storage.promotion_ranking`; the means over its seeds where it was trained at several, and
    every loss measure, linear in both, then ranks the mean), so every loss measure ranks it there;
    and that ranking, None for a study without promotions (its values returned as they are). The
    other trials keep their first pass: `placed` then estimates them at that budget in the measure
    the front ranks."""
    ranking = storage.promotion_ranking(study)
    if ranking is None or not ranking.ranked or "loss" not in objectives:
        return values, changes, ranking
    values, changes = values.copy(), changes.copy()
    column = list(objectives).index("loss")
    for i, number in enumerate(numbers):
        p = ranking.ranked.get(number)
        if p is not None and p.val_loss is not None:
            values[i, column], changes[i] = p.val_loss, p.loss_change
    return values, changes, ranking


def placed(
    ranking: PromotionRanking | None, numbers: Sequence[int], first: np.ndarray, at_budget: np.ndarray
) -> np.ndarray:
    """A loss measure of the rows `numbers` as a promoted study's front ranks it
    (`PromotionRanking.place`): `at_budget` (the measure after `promoted`) for the contenders
    ranked at the budget, the others' `first` (the measure of their first pass) plus the
    contenders' median change; `at_budget` as it is without such a budget."""
    if ranking is None or not ranking.ranked:
        return at_budget
    rows = dict(zip(numbers, range(len(numbers)), strict=True))
    promoted_values = {n: float(at_budget[rows[n]]) for n in ranking.ranked if n in rows}
    values, _ = ranking.place(dict(zip(numbers, map(float, first), strict=True)), promoted_values)
    return np.array([values[n] for n in numbers], dtype=float)


def study_front(
    storage: Storage,
    study: str,
    objectives: Sequence[str] | None = None,
    reference: Sequence[float] | None = None,
    loss: str | None = None,
    size_beta: float | None = None,
    beta_rule: str = "given",
    first_pass: bool = False,
) -> StudyFront | None:
    """The Pareto front of `study`'s complete trials (None when none has every objective).

    Args:
        storage: the trial database.
        study: the study name.
        objectives: default: the study's own objectives.
        reference: the hypervolume reference point in raw units (default: see `reference_point`);
            its loss is the adjusted loss when `loss` is "adjusted".
        loss: None: the study's own loss objective (`loss_measure`); "proxy": the proxy loss as
            stored; "adjusted": the study's rule, `loss + extrapolate * change - beta ln(params / 1M)`.
        size_beta: the adjusted loss's beta; default: the study's, else the equal-weight beta over
            the trials ranked (the complete trials with every objective;
            `fidelity.loss_objectives`).
        beta_rule: how a given `size_beta` was chosen, for the reader.
        first_pass: rank every trial by its first pass, promotions or not: the front promotion
            chooses its contenders from, the same before and after some of them were promoted.

    Raises:
        ArchsearchError: an unknown study or `loss`, or a reference point of the wrong length.
    """
    asked = loss
    loss, own = loss_measure(storage, study, loss)
    # The study's own objective without a size beta (extrapolated only) credits no size: beta 0.
    uncredited = asked is None and size_beta is None and own is not None and own.size_beta is None
    if size_beta is None and own is not None and own.size_beta is not None:
        size_beta, beta_rule = own.size_beta, "the study's [objectives].size_beta"
    elif uncredited:
        beta_rule = "none: the study's [objectives] has no size_beta"
    elif size_beta is None:
        beta_rule = "sd(loss) / sd(ln params) over the complete trials"
    objectives, numbers, first, params, first_changes = _ranked(storage, study, objectives, loss)
    values, changes, ranking = (
        (first, first_changes, None)
        if first_pass
        else promoted(storage, study, objectives, numbers, first, first_changes)
    )
    if reference is not None and len(reference) != len(objectives):
        raise ArchsearchError(f"the reference point needs {len(objectives)} values, one per objective")
    rule = None
    first = first.copy()
    if loss == "adjusted" and own is not None:
        values = values.copy()
        beta = 0.0 if uncredited else size_beta
        values[:, 0], rule = loss_objectives(values[:, 0], changes, params, beta, own.extrapolate)
        first[:, 0] = loss_objectives(first[:, 0], first_changes, params, rule.size_beta, own.extrapolate)[0]
        rule = own if uncredited else rule
    if ranking is not None and "loss" in objectives:
        column = list(objectives).index("loss")
        values = values.copy()
        values[:, column] = placed(ranking, numbers, first[:, column], values[:, column])
    front = pareto_front(numbers, values, objectives, reference) if numbers else None
    if front is None:
        return None
    records = tuple(storage.trials_by_number(study, front.numbers))
    throughput = {}
    for r in records:
        profiles = {p.device: p for p in storage.profiles(r.id)}
        for name in (r["step_time_device"], "local", *sorted(profiles)):
            if name in profiles:
                p = profiles[name]
                throughput[r.number] = (p.tokens_per_second, name, p.modelled)
                break
    why = beta_rule if rule is not None else None
    return StudyFront(study, front, records, tuple(numbers), values, throughput, rule, why, ranking)


def study_fronts(
    storage: Storage,
    studies: Sequence[str],
    objectives: Sequence[str] | None = None,
    reference: Sequence[float] | None = None,
    loss: str | None = None,
) -> list[StudyFront]:
    """The fronts of several studies against one reference point, so their hypervolumes compare.

    Without `reference`, the default point is taken over every study's trials pooled. `loss` None
    ranks the studies' own loss objective, which must then be the same. With the adjusted loss
    and studies that do not share one fixed beta, one beta is taken over every study's ranked
    trials pooled, for the same reason: the studies' adjusted losses then share one axis.

    Raises:
        ArchsearchError: as `study_front`; studies with different objectives and none given, or
            different loss objectives and no `loss`; a study with no complete trial that has
            every objective; a study given twice (`pareto` overlaid it on itself, exit 0).
    """
    twice = sorted({s for s in studies if list(studies).count(s) > 1})
    if twice:
        raise ArchsearchError(f"--study {', '.join(twice)} given more than once")
    asked = loss
    measures = {loss_measure(storage, s, loss) for s in studies}
    if len(measures) > 1 and loss is None:
        raise ArchsearchError("the studies rank different loss objectives: pass --loss proxy or adjusted")
    loss, own = measures.pop() if len(measures) == 1 else (loss, None)
    beta = None if own is None else own.size_beta
    rule = "the studies' [objectives].size_beta"
    if loss == "adjusted" and beta is None and len(studies) > 1 and asked is not None:
        carried, sizes = [], []  # each study's losses extrapolated by its own rule; one beta over all
        for s in studies:
            names, numbers, values, params, changes = _ranked(storage, s, objectives, loss)
            values, changes, _ = promoted(storage, s, names, numbers, values, changes)
            extrapolate = storage.require_study(s).loss_rule.extrapolate
            carried.append(loss_objectives(values[:, 0], changes, params, 0.0, extrapolate)[0])
            sizes.append(params)
        flat = np.concatenate(carried)
        beta = loss_objectives(flat, np.zeros(len(flat)), np.concatenate(sizes))[1].size_beta
        rule = "sd(loss) / sd(ln params) over the complete trials of the studies shown"
    if len(studies) == 1:
        beta = None  # the study's own, or over its trials (study_front says which)
    # As asked: None is each study's own objective, which they share (without a beta, no size credit).
    fronts = [study_front(storage, s, objectives, reference, asked, beta, rule) for s in studies]
    missing = [s for s, f in zip(studies, fronts, strict=True) if f is None]
    if missing:
        # Its trials, by state: a study with no front is usually one whose trials failed, and their
        # reasons are what the user needs next.
        said = []
        for s in missing:
            counts = storage.counts(s)
            states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()) if n) or "no trials"
            said.append(f"{s!r} ({states})")
        raise ArchsearchError(
            f"no complete trial with every objective in {', '.join(said)}: `archsearch trials --study "
            f"{shlex.quote(missing[0])}` lists its trials with their reasons"
        )
    found = [f for f in fronts if f is not None]
    if reference is None and len(found) > 1:
        if len({f.front.objectives for f in found}) > 1:
            raise ArchsearchError("studies with different objectives: pass --objectives")
        names = found[0].front.objectives
        pooled = reference_point(np.concatenate([f.trial_values for f in found]), names)
        again = (study_front(storage, s, names, pooled, asked, beta, rule) for s in studies)
        found = [f for f in again if f is not None]
    return found
