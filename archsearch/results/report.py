"""The study report: everything `archsearch report` shows, read from the database once. Its
command line is `archsearch.cli.report`.

`build_report` returns frozen records of plain data; `results.html.render` turns them into one
self-contained page, and `results.html.write_report` does both and writes the file (this module
imports nothing of the page's). Nothing here writes to the
database, and nothing imports torch.

Each study's section holds:

- its Pareto front (`pareto.study_fronts`: several studies against one reference point, so their
  hypervolumes compare) and its trials in every state, as `trials_table` returns them (at most
  `max_rows`, the front's members always among them);
- the knee as `archsearch export --knee` chooses it (`selection.select`) and, for every export
  format, the files `export` would write for it (`selection.export_plan`) or the format's refusal;
- the latest stored `validate` report, its rank correlations with 95% intervals (the bootstrap
  intervals `validate` stores, else `rank_interval`'s approximation for older reports), or
  None: the page then warns that the study was never validated;
- the knee's stored step profiles, each broken into the parts that add up to its step
  (`ProfileReport.breakdown`), or only the step time where no breakdown was stored;
- the space file as written, each driver's settings, the devices that trained the study's trials
  and long runs (with the torch and CUDA versions they ran), and the versions writing the report.
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from archsearch.errors import ArchsearchError

if TYPE_CHECKING:
    from archsearch.search.pareto import StudyFront
    from archsearch.storage import (
        ProfileRecord,
        SearchRunRecord,
        Storage,
        StudyRecord,
        TrialRecord,
        TrialTable,
        ValidationRecord,
    )

DEFAULT_MAX_ROWS = 5000  # a browser sorts a table of 5,000 rows at once; 100,000 would freeze it
TOP_KERNELS = 8  # the knee's slowest kernels shown under its step breakdown
REPORT_SUFFIXES = (".html", ".htm")
# The distributions whose versions a report states: those of the process that wrote it.
VERSIONED = ("archsearch", "torch", "optuna", "ray", "sqlalchemy", "plotly")
Z95 = 1.959963984540054  # the standard normal's 97.5% quantile: two-sided 95% intervals


class ReportError(ArchsearchError):
    """A report that cannot be written: no study given, one given twice, a bad output path."""


# ------------------------------------------------------------------------------------------------
# The records
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KneeExport:
    """What `archsearch export --knee --format <fmt>` writes for the knee, or why it refuses."""

    fmt: str
    description: str  # the format's one line
    target: str | None  # what the files describe (e.g. "llama (LlamaForCausalLM)"); None if refused
    refused: str | None  # the reason the format cannot represent the knee exactly
    notes: tuple[str, ...]  # approximations the export states
    files: tuple[tuple[str, str], ...]  # (relative name, text), as export writes them


@dataclass(frozen=True)
class Correlation:
    """One predictor of the long-run loss in a validation report (lower predicted = better)."""

    predictor: str  # in words
    objective: bool  # the study's own loss objective
    spearman: float | None
    spearman_interval: tuple[float, float] | None
    kendall: float | None
    kendall_interval: tuple[float, float] | None
    iso_pairs: tuple[int, int] | None  # (agreeing, compared) pairs of near-equal size


@dataclass(frozen=True)
class Validation:
    """The latest stored `validate` report of a study, with intervals."""

    record: ValidationRecord
    earlier: int  # older reports stored
    trials: int  # trials with a long run: the n of every correlation
    correlations: tuple[Correlation, ...]


@dataclass(frozen=True)
class StepBreakdown:
    """One stored profile of the knee's training step."""

    device: str  # "local" or a catalogued GPU
    modelled: bool
    dtype: str
    batch: int
    step_time_s: float
    tokens_per_second: float
    source: str | None  # where the step time comes from; None: no breakdown was stored
    parts: tuple[tuple[str, float, str | None], ...]  # (what, seconds, what it holds): sum to the step
    kernels: tuple[tuple[str, int, float, float], ...]  # the slowest: (name, calls, s per step, TFLOP/s)


@dataclass(frozen=True)
class DeviceRun:
    """A device that trained some of a study's trials or long runs."""

    fingerprint: str
    info: dict[str, Any] | None  # its `DeviceRecord.info`; None when only the fingerprint is known
    trials: int
    long_runs: int


@dataclass(frozen=True)
class StudySection:
    record: StudyRecord  # with its trial counts
    front: StudyFront
    table: TrialTable  # the trials the table shows, by trial number
    total_trials: int  # all of the study's trials (the table may show fewer)
    shapes: dict[int, str]  # trial number -> `ArchConfig.describe()`, every trial with a shape
    long: dict[int, tuple[float, float, int]]  # `Storage.long_run_losses`
    knee: TrialRecord
    exports: tuple[KneeExport, ...]
    validation: Validation | None
    breakdowns: tuple[StepBreakdown, ...]
    search_runs: tuple[SearchRunRecord, ...]
    devices: tuple[DeviceRun, ...]

    @property
    def name(self) -> str:
        return self.record.name


@dataclass(frozen=True)
class Report:
    sections: tuple[StudySection, ...]
    storage: str  # the database URL, any password hidden
    generated_at: float  # unix time
    versions: tuple[tuple[str, str], ...]  # (distribution, version) of the process that wrote it

    @property
    def fronts(self) -> tuple[StudyFront, ...]:
        return tuple(s.front for s in self.sections)


# ------------------------------------------------------------------------------------------------
# Building it
# ------------------------------------------------------------------------------------------------
def build_report(
    storage: Storage, studies: Sequence[str], *, loss: str | None = None, max_rows: int = DEFAULT_MAX_ROWS
) -> Report:
    """Everything the report of `studies` shows, read from `storage`.

    Args:
        storage: an open trial database (read only).
        studies: study names; several overlay on one front plot against one reference point,
            so they must rank the same objectives and loss (as `archsearch pareto` requires).
        loss: the loss the fronts rank, as `pareto.study_fronts` takes it: None for the studies'
            own loss objective (studies that rank different ones need "proxy" or "adjusted").
            The knee section always shows the knee `export --knee` writes, by the study's own.
        max_rows: at most this many trials in each study's table (its front's members always in).

    Raises:
        ReportError: no study, `max_rows` below 1.
        ArchsearchError: as `pareto.study_fronts`: an unknown study, one given twice, one with no
            complete trial that has every objective, studies with different objectives or loss
            objectives.
    """
    from archsearch.search.pareto import study_fronts

    if not studies:
        raise ReportError("give at least one --study")
    if max_rows < 1:
        raise ReportError(f"--max-rows must be at least 1, got {max_rows}")
    fronts = study_fronts(storage, list(studies), loss=loss)
    sections = tuple(_section(storage, front, loss is None, max_rows) for front in fronts)
    return Report(sections, storage.display_url, time.time(), _versions())


def _section(storage: Storage, front: StudyFront, own_loss: bool, max_rows: int) -> StudySection:
    from archsearch.search.selection import Choice, Selection, select
    from archsearch.space.config import ArchConfig
    from archsearch.storage import TrialTable, trials_table

    name = front.study
    record = storage.require_study(name, counts=True)
    everything = trials_table(storage, name)
    col = {c: i for i, c in enumerate(everything.columns)}
    described: dict[str, str] = {}  # config JSON -> its description: searches repeat shapes
    shapes = {}
    for row in everything.rows:
        number, config = row[col["number"]], row[col["config_json"]]
        if config and number is not None:
            if config not in described:
                described[config] = ArchConfig.from_json(config).describe()
            shapes[number] = described[config]
    members = set(front.front.numbers)
    room = max_rows - len(members)  # for trials off the front, the lowest numbers first
    shown = []
    for row in everything.rows:
        if row[col["number"]] in members:
            shown.append(row)
        elif room > 0:
            shown.append(row)
            room -= 1
    # The knee `export --knee` writes: that of the front of the study's own objectives and loss
    # objective. That is this front's knee when it ranks the study's own loss (the reference point
    # moves no knee): taken from it, not from `select`, which reads every complete trial's record.
    if own_loss:
        (knee,) = (r for r in front.records if r.number == front.front.knee)
        devices = {d.fingerprint: d.info for d in storage.devices()}
        selection = Selection(record, (knee,), knee.number, devices)
    else:
        selection = select(storage, name, Choice("json", knee=True))
        (knee,) = selection.members
    validations = storage.validations(name)
    return StudySection(
        record=record,
        front=front,
        table=TrialTable(everything.columns, shown),
        total_trials=len(everything),
        shapes=shapes,
        long=storage.long_run_losses(name),
        knee=knee,
        exports=knee_exports(selection),
        validation=validation_view(validations[-1], len(validations) - 1) if validations else None,
        breakdowns=tuple(step_breakdown(p) for p in storage.profiles(knee.id)),
        search_runs=tuple(storage.search_runs(name)),
        devices=_devices(storage, everything, name),
    )


def knee_exports(selection: Any) -> tuple[KneeExport, ...]:
    """Every export format's files for the one trial of `selection` (`selection.select`), as
    `archsearch export` writes them (`selection.export_plan`), or the format's refusal."""
    from archsearch.search.selection import Choice, export_plan
    from archsearch.space.export import EXPORT_FORMATS

    (trial,) = selection.members
    out = []
    for fmt, export_format in EXPORT_FORMATS.items():
        reason = export_format.refusal(trial.config)
        if reason is not None:
            out.append(KneeExport(fmt, export_format.description, None, reason, (), ()))
            continue
        plan = export_plan(selection, Choice(fmt, trial=trial.number))
        (entry,) = plan.index
        files = tuple((path, data.decode("utf-8")) for path, data in sorted(plan.tree.items()))
        notes = tuple(entry["notes"])
        out.append(KneeExport(fmt, export_format.description, entry["target"], None, notes, files))
    return tuple(out)


def rank_interval(r: float | None, n: int, kind: str) -> tuple[float, float] | None:
    """An approximate 95% interval for a rank correlation `r` over `n` pairs, by Fisher's z.

    z = atanh(r) is close to normal with variance (1 + r^2 / 2) / (n - 3) for Spearman's rho
    (Bonett & Wright 2000, Psychometrika 65(1):23-28) and 0.437 / (n - 4) for Kendall's tau
    (Fieller, Hartley & Pearson 1957, Biometrika 44:470-481); the interval is z +- 1.96 sd mapped
    back by tanh. None where the approximation says nothing: no `r`, |r| = 1 (z is infinite), or
    too few pairs (n <= 3 for Spearman, n <= 4 for Kendall).

    Raises:
        ValueError: `kind` is not "spearman" or "kendall".
    """
    if kind == "spearman":
        variance = None if n <= 3 or r is None else (1 + r * r / 2) / (n - 3)
    elif kind == "kendall":
        variance = None if n <= 4 else 0.437 / (n - 4)
    else:
        raise ValueError(f"no interval for a {kind!r} correlation")
    if r is None or variance is None or not abs(r) < 1:
        return None
    z, half = math.atanh(r), Z95 * math.sqrt(variance)
    return math.tanh(z - half), math.tanh(z + half)


# Predictors of a validation report, in the order `archsearch validate` prints them.
_PREDICTORS = {
    "proxy": "proxy loss", "params": "-params", "flops": "-FLOPs", "adjusted": "size-adjusted proxy",
}  # fmt: skip


def _stored_interval(deciding: Mapping[str, Any] | None, key: str, kind: str) -> tuple[float, float] | None:
    """The bootstrap interval `validate` stored for a predictor (its `deciding` measures), where
    both bounds are defined; None for reports stored before it (they get `rank_interval`)."""
    estimate = (deciding or {}).get(key, {}).get(kind) or {}
    low, high = estimate.get("low"), estimate.get("high")
    return (low, high) if low is not None and high is not None else None


def validation_view(record: ValidationRecord, earlier: int = 0) -> Validation:
    """A stored `validate` report's correlations with their 95% intervals: the bootstrap
    intervals over trials that `validate` stores (`deciding`), else, for reports stored before
    them, Fisher-z approximations (`rank_interval`)."""
    from archsearch.search.validate import adjusted_label

    report = record.report
    deciding = report.get("deciding")
    n = len(report.get("trials", ()))
    objective = report.get("objective", "proxy")  # reports from before size betas ranked the proxy
    rows = []
    for key, label in _PREDICTORS.items():
        c = report.get("correlations", {}).get(key)
        if c is None:  # reports stored before the size-adjusted predictor lack it
            continue
        if key == "adjusted":
            label = adjusted_label(report)
        iso = report.get("iso_pairs", {}).get(key)
        rows.append(
            Correlation(
                predictor=label,
                objective=key == objective,
                spearman=c["spearman"],
                spearman_interval=(
                    _stored_interval(deciding, key, "spearman")
                    if deciding
                    else rank_interval(c["spearman"], n, "spearman")
                ),
                kendall=c["kendall"],
                kendall_interval=(
                    _stored_interval(deciding, key, "kendall")
                    if deciding
                    else rank_interval(c["kendall"], n, "kendall")
                ),
                iso_pairs=(int(iso[0]), int(iso[1])) if iso else None,
            )
        )
    return Validation(record, earlier, n, tuple(rows))


def step_breakdown(profile: ProfileRecord) -> StepBreakdown:
    """A stored profile as the parts of its step; a profile stored without its report (`{}`) keeps
    its step time and no parts."""
    from archsearch.evaluators.step_kernels import ProfileReport

    head = dict(
        device=profile.device,
        modelled=bool(profile.modelled),
        dtype=profile.dtype,
        batch=int(profile.batch),
        step_time_s=float(profile.step_time_s),
        tokens_per_second=float(profile.tokens_per_second),
    )
    if not profile.report:
        return StepBreakdown(**head, source=None, parts=(), kernels=())
    report = ProfileReport.from_dict(profile.report)
    slowest = sorted(report.kernels, key=lambda k: k.total_s, reverse=True)[:TOP_KERNELS]
    return StepBreakdown(
        **head,
        source=report.step_source,
        parts=report.breakdown(),
        kernels=tuple((k.name, k.count, k.total_s, k.tflops) for k in slowest),
    )


def _devices(storage: Storage, table: TrialTable, study: str) -> tuple[DeviceRun, ...]:
    """The devices that trained `study`'s trials and long runs, most trials first."""
    index = table.columns.index("device_fingerprint")
    trials: dict[str, int] = {}
    for row in table.rows:
        if row[index]:
            trials[row[index]] = trials.get(row[index], 0) + 1
    long_runs: dict[str, int] = {}
    for run in storage.long_runs(study):
        if run.device_fingerprint:
            long_runs[run.device_fingerprint] = long_runs.get(run.device_fingerprint, 0) + 1
    known = {d.fingerprint: d.info for d in storage.devices()}
    return tuple(
        DeviceRun(f, known.get(f), trials.get(f, 0), long_runs.get(f, 0))
        for f in sorted({*trials, *long_runs}, key=lambda f: (-trials.get(f, 0), f))
    )


def _versions() -> tuple[tuple[str, str], ...]:
    """The versions of the process writing the report (read from package metadata: no imports)."""
    from importlib import metadata

    out = [("python", platform.python_version())]
    for dist in VERSIONED:
        try:
            out.append((dist, metadata.version(dist)))
        except metadata.PackageNotFoundError:
            out.append((dist, "not installed"))
    return tuple(out)
