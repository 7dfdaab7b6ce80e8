"""Which trials of a study to export, and the file tree that exports them; one trial's shape.

The formats are pure (`space.export`: an ArchConfig and a provenance dict in, files out); this
module chooses trials the way `pareto` ranks them and lays out what `export` writes:

- a selector picks the trials: one by number, the knee of the Pareto front, the lowest loss under
  a FLOPs limit, or the whole front; "loss" is the study's loss objective (credited for size
  when the study has a size beta), as `pareto` ranks it: a promoted contender's at the budget the
  study ranks its contenders at (`Storage.promotion_ranking`), any other trial's estimated at that
  budget from its first pass (`PromotionRanking.place`);
- `exportable=True` first drops the trials the format cannot represent, so "the knee" means the
  knee of the front of the trials that export, the best a user can actually train;
- `export_plan` turns the chosen trials into files (one folder per member for a front, with an
  `index.json`) and the refusals; `fileio.write_tree` writes it all or nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from archsearch.errors import ArchsearchError
from archsearch.search.pareto import pareto_front
from archsearch.space.export import EXPORT_FORMATS, parse_flops
from archsearch.space.objectives import OBJECTIVE_COLUMNS, LossRule
from archsearch.trial import COMPLETE

if TYPE_CHECKING:
    from archsearch.space.config import ArchConfig
    from archsearch.storage import PromotionRanking, Storage, StudyRecord, TrialRecord

# The trial columns that are its measured (or exactly counted) results, copied into provenance.
RESULT_COLUMNS = (
    "loss", "bits_per_byte", "params_total", "params_non_embedding", "flops_forward_per_token",
    "flops_train_per_token", "kv_cache_bytes_per_token", "tokens_trained", "steps", "train_seconds",
    "tokens_per_second", "mfu", "precision", "step_time_s", "step_time_device", "prefill_time_s",
    "decode_time_s",
)  # fmt: skip


def trial_provenance(
    study: StudyRecord, trial: TrialRecord, device: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Where an exported shape comes from, as plain JSON-ready data.

    Args:
        study: the study record (name, spec fingerprint, objectives).
        trial: the trial record (number, results columns, corpus and device fingerprints).
        device: what is recorded of the device the trial trained on (a `DeviceRecord`'s `info`),
            if known.
    """
    from archsearch.version import __version__

    values = trial.values
    fingerprint = values.get("device_fingerprint")
    return {
        "study": study.name,
        "trial": trial.number,
        "spec_fingerprint": study.spec_fingerprint,
        "objectives": list(study.objectives),
        "corpus_fingerprint": values.get("corpus_fingerprint"),
        "device": dict(device) if device else ({"fingerprint": fingerprint} if fingerprint else None),
        "archsearch_version": __version__,
        "results": {column: values.get(column) for column in RESULT_COLUMNS},
    }


SELECTORS = ("--trial N", "--knee", "--best-under-flops F", "--front")


@dataclass(frozen=True)
class Choice:
    """What to export: exactly one selector, the format, and whether to skip what it refuses."""

    fmt: str
    trial: int | None = None
    knee: bool = False
    best_under_flops: str | None = None  # "1e9", "2G": parsed by `space.export.parse_flops`
    front: bool = False
    exportable: bool = False
    flops_limit: float | None = field(init=False, default=None)  # `best_under_flops`, parsed

    def __post_init__(self) -> None:
        EXPORT_FORMATS[self.fmt]  # an unknown format fails before the database is opened
        given = (self.trial is not None, self.knee, self.best_under_flops is not None, self.front)
        chosen = [flag for flag, on in zip(SELECTORS, given, strict=True) if on]
        if len(chosen) != 1:
            got = f" (got {', '.join(chosen)})" if chosen else ""
            raise ArchsearchError(f"give exactly one of {', '.join(SELECTORS)}{got}")
        if self.exportable and self.trial is not None:
            raise ArchsearchError("--exportable chooses among trials; it does not apply to --trial N")
        if self.best_under_flops is not None:
            object.__setattr__(self, "flops_limit", parse_flops(self.best_under_flops))


@dataclass(frozen=True)
class Selection:
    """The chosen trials with what their provenance needs."""

    study: StudyRecord
    members: tuple[TrialRecord, ...]  # in front order for a front
    knee: int | None  # the knee's number when a front was ranked
    devices: dict[Any, dict[str, Any]]  # device fingerprint -> device row
    # Where a study with promotions ranked its trials (None: without promotions, or one --trial N).
    ranking: PromotionRanking | None = None


def select(db: Storage, study: str, choice: Choice) -> Selection:
    """The trials of `study` that `choice` names.

    Raises:
        ArchsearchError: an unknown study or trial, a trial that is not complete, nothing within
            the FLOPs limit, no trial with every objective, none the format represents.
    """
    record = db.require_study(study)
    knee, ranking = None, None
    if choice.trial is not None:
        members = [_numbered(db.trials(study), study, choice.trial)]
    else:
        complete = db.trials(study, status=COMPLETE)
        if choice.exportable:
            complete = _exportable(complete, study, choice.fmt)
        ranking = db.promotion_ranking(study)
        # The study's loss objective as `trials --format json` gives it: contenders measured at the
        # ranking's budget, the others estimated there (`PromotionRanking.place`).
        ranked = {n: v for n, (v, _, _) in db.ranked_objectives(study).items()} if ranking else {}
        if choice.flops_limit is not None:
            members = [_best_under(complete, record, choice.flops_limit, ranked)]
        else:
            members, knee = _front(complete, record, ranked)
            if choice.knee:
                members = [m for m in members if m.number == knee]
    devices = {d.fingerprint: d.info for d in db.devices()}
    return Selection(record, tuple(members), knee, devices, ranking)


def _exportable(complete: list[Any], study: str, fmt: str) -> list[Any]:
    fits = [t for t in complete if EXPORT_FORMATS[fmt].refusal(t.config) is None]
    if not fits:
        raise ArchsearchError(f"no complete trial of {study!r} can be exported as {fmt}")
    return fits


def trial_config(db: Storage, study: str, number: int) -> ArchConfig:
    """The shape of trial `number` of `study`, for commands that take a trial's shape (`cost`, `train`).

    Raises:
        ArchsearchError: an unknown study or trial, or a trial that is not complete.
    """
    db.require_study(study)
    found = db.trials_by_number(study, [number])
    # Only a missing trial needs them all: the error names the study's span of trial numbers.
    trial = _numbered(found or db.trials(study), study, number, use="give their shape")
    return trial.config  # type: ignore[no-any-return]


def _numbered(trials: list[Any], study: str, number: int, use: str = "export") -> Any:
    found = [t for t in trials if t.number == number]
    if not found:
        numbers = sorted(t.number for t in trials if t.number is not None)
        span = f"trials {numbers[0]} to {numbers[-1]}" if numbers else "no trials"
        raise ArchsearchError(f"study {study!r} has no trial {number} ({span})")
    t = found[0]
    if t.status != COMPLETE or t.config is None:
        why = f" ({t.reason})" if t.reason else ""
        raise ArchsearchError(f"trial {number} of {study!r} is {t.status}{why}: only complete trials {use}")
    return t


def _objective(t: Any, column: str, rule: LossRule, ranked: Mapping[int, float | None]) -> float:
    """A trial's value of an objective column; the loss as the study's loss objective (`rule`,
    `objectives.loss_objective`), as a study with promotions ranks it (`ranked`, by trial number:
    `Storage.ranked_objectives`). NaN when missing."""
    if column == "loss" and t.number in ranked:
        promoted = ranked[t.number]
        return float("nan") if promoted is None else float(promoted)
    value = t[column]
    if value is None:
        return float("nan")
    if column == "loss" and not rule.plain:
        return rule.value(value, t["loss_change"], t["params_total"]) if t["params_total"] else float("nan")
    return float(value)


def _best_under(complete: list[Any], record: Any, limit: float, ranked: Mapping[int, float | None]) -> Any:
    """The complete trial with the lowest loss objective within the FLOPs limit; ties go to the
    lower trial number."""
    study, rule = record.name, record.loss_rule
    costed = [t for t in complete if t["loss"] is not None and t["flops_forward_per_token"] is not None]
    within = [t for t in costed if t["flops_forward_per_token"] <= limit]
    if not within:
        cheapest = min((t["flops_forward_per_token"] for t in costed), default=None)
        hint = f"; the cheapest has {cheapest:.4g}" if cheapest is not None else ""
        raise ArchsearchError(f"no complete trial of {study!r} has forward FLOPs/token <= {limit:.4g}{hint}")
    return min(within, key=lambda t: (_objective(t, "loss", rule, ranked), t.number))


def _front(complete: Sequence[Any], record: Any, ranked: Mapping[int, float | None]) -> tuple[list[Any], int]:
    """The Pareto front of `complete` over the study's objectives (its loss objective as `pareto`
    ranks it: `ranked` for a study with promotions), in front order, and its knee."""
    unknown = [o for o in record.objectives if o not in OBJECTIVE_COLUMNS]
    if unknown or not record.objectives:
        raise ArchsearchError(f"study {record.name!r} has objectives {record.objectives!r}: no front to rank")
    columns = [OBJECTIVE_COLUMNS[o] for o in record.objectives]
    values = np.array(
        [[_objective(t, c, record.loss_rule, ranked) for c in columns] for t in complete], dtype=float
    ).reshape(len(complete), len(columns))
    result = pareto_front([t.number for t in complete], values, record.objectives)
    if result is None:
        objectives = ", ".join(record.objectives)
        raise ArchsearchError(f"no complete trial of {record.name!r} has every objective ({objectives})")
    by_number = {t.number: t for t in complete}
    return [by_number[n] for n in result.numbers], result.knee


@dataclass(frozen=True)
class ExportPlan:
    """The files to write (relative path -> bytes) and one index entry per chosen trial."""

    tree: dict[str, bytes]
    index: tuple[dict[str, Any], ...]  # number, folder (None when refused), refused, notes, ...


def export_plan(selection: Selection, choice: Choice) -> ExportPlan:
    """The files that export `selection` as `choice.fmt`.

    A single trial the format refuses is an error; a front keeps the members it can write and
    lists the refusals in its `index.json`.

    Raises:
        ArchsearchError: the refusal, or every front member refused.
    """
    export_format = EXPORT_FORMATS[choice.fmt]
    study = selection.study.name
    tree: dict[str, bytes] = {}
    index = []
    for member in selection.members:
        cfg = member.config
        reason = export_format.refusal(cfg)
        if reason is not None and not choice.front:
            hint = (
                ""
                if choice.trial is not None
                else "; add --exportable to choose among the trials that export"
            )
            raise ArchsearchError(f"trial {member.number} cannot be exported as {choice.fmt}: {reason}{hint}")
        folder = f"trial-{member.number}" if choice.front else ""
        if reason is None:
            device = selection.devices.get(member["device_fingerprint"])
            provenance = trial_provenance(selection.study, member, device)
            for name, data in export_format.files(cfg, provenance).items():
                tree[f"{folder}/{name}" if folder else name] = data
        index.append(
            {
                "number": member.number,
                "knee": member.number == selection.knee,
                "loss": member["loss"],
                "flops_forward_per_token": member["flops_forward_per_token"],
                "params_total": member["params_total"],
                "step_time_s": member["step_time_s"],
                "format": choice.fmt,
                "target": export_format.target(cfg) if reason is None else None,
                "folder": folder if reason is None else None,
                "refused": reason,
                "notes": list(export_format.notes(cfg)) if reason is None else [],
            }
        )
    if not tree:
        refusals = "; ".join(f"trial {e['number']}: {e['refused']}" for e in index)
        raise ArchsearchError(f"no front member of {study!r} can be exported as {choice.fmt}: {refusals}")
    if choice.front:
        document = {
            "study": study,
            "format": choice.fmt,
            "objectives": list(selection.study.objectives),
            "knee": selection.knee,
            "exportable_only": choice.exportable,
            "trials": index,
        }
        tree["index.json"] = (json.dumps(document, indent=2) + "\n").encode("utf-8")
    return ExportPlan(tree, tuple(index))
