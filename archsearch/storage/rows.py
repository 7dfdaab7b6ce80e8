"""Rows in and out: the columns a record is written as, and a stored row read back as a record,
checked on the way, since SQLite keeps whatever a column is given and a damaged or hand-edited
file must end in one line, not in a reader's traceback.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Float, Integer

from archsearch.errors import ArchsearchError, quoted
from archsearch.space.config import ArchConfig
from archsearch.space.costs import flop_counts, kv_cache_bytes_per_token, param_counts
from archsearch.space.objectives import OBJECTIVES
from archsearch.storage import schema
from archsearch.storage.records import (
    DeviceRecord,
    LadderFitRecord,
    LadderRungRecord,
    LongRunRecord,
    ProfileRecord,
    SearchRunRecord,
    StudyRecord,
    TrialRecord,
    ValidationRecord,
)
from archsearch.units import short_number

# Trial order: by number, unnumbered (claimed, not yet asked) rows last on every backend, the row
# id breaking ties.
BY_NUMBER = (schema.Trial.number.is_(None), schema.Trial.number, schema.Trial.id)


def config_columns(cfg: ArchConfig) -> dict[str, Any]:
    counts, flops = param_counts(cfg), flop_counts(cfg)
    return dict(
        config_json=cfg.to_json(indent=None),
        **cfg.to_dict(),
        aspect_ratio=cfg.aspect_ratio,
        d_ff_ratio=cfg.d_ff_ratio,
        attention_layout=cfg.attention_layout,
        params_total=counts.total,
        params_non_embedding=counts.non_embedding,
        flops_forward_per_token=float(flops.forward),
        flops_train_per_token=float(flops.train),
        kv_cache_bytes_per_token=float(kv_cache_bytes_per_token(cfg)),
    )


class DamagedValue(ValueError):
    """A stored value that is not what its column holds: text in a number column (SQLite keeps
    what it is given), a spec or config of another shape. `Storage._session` turns it, like JSON
    that does not parse, into the damaged-database line, so a reader never ends in a traceback."""


# Sizes every trial's shape has, positive: a report takes their logarithm.
_POSITIVE_COLUMNS = frozenset({"params_total", "flops_forward_per_token", "flops_train_per_token"})


def check_numbers(rows: Sequence[Sequence[Any]], columns: Sequence[Any], owner: str = "a trial") -> None:
    """Raises `DamagedValue` for a value in a number column of `rows` that is not a number, or a
    size (`_POSITIVE_COLUMNS`) that is not positive; `owner` names the row in the message."""
    numeric = [i for i, c in enumerate(columns) if isinstance(c.type, (Integer, Float, schema.Real))]
    for row in rows:
        for i in numeric:
            value, name = row[i], columns[i].key
            if not (value is None or isinstance(value, (int, float))):
                raise DamagedValue(f"the {name} of {owner} is {quoted(str(value))}, not a number")
            if value is not None and name in _POSITIVE_COLUMNS and not value > 0:
                raise DamagedValue(f"the {name} of {owner} is {value!r}, not a positive number")


def checked(row: Any, owner: str) -> Any:
    """An ORM row whose number columns hold numbers (`check_numbers`), returned as it is.

    Every reader of a stored row goes through it (or `check_numbers`), as through `json_of` for
    its JSON: SQLite keeps whatever a column is given, so text in a number column, or JSON of
    another shape, would otherwise reach the readers' arithmetic and end in a traceback.
    """
    columns = list(type(row).__table__.columns)
    check_numbers([tuple(getattr(row, c.key) for c in columns)], columns, owner)
    return row


def json_of(text: Any, kind: type, what: str) -> Any:
    """A stored JSON column parsed, which must be a JSON object (`kind` dict) or list (list)."""
    if not isinstance(text, str):
        raise DamagedValue(f"{what} is not JSON text")
    value = json.loads(text)  # JSONDecodeError: `Storage._session` says the database is damaged
    if not isinstance(value, kind):
        raise DamagedValue(f"{what} is not a JSON {'object' if kind is dict else 'list'}")
    return value


def _loss_of(value: float, what: str) -> float:
    """A stored run's final loss: finite and >= 0 (a cross-entropy), as every run that is stored
    ended; any other was written by hand or by a damaged copy, and reached a fit's logarithm."""
    if not (math.isfinite(value) and value >= 0):
        raise DamagedValue(f"the val_loss of {what} is {short_number(value)}, not a loss a finished run has")
    return value


def _curve_of(text: Any, what: str) -> tuple[tuple[int, float], ...]:
    """A stored curve: a JSON list of (tokens, loss) points."""
    try:
        return tuple((int(t), float(v)) for t, v in json_of(text, list, what))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, DamagedValue):
            raise
        raise DamagedValue(f"{what} is not a list of (tokens, loss) points") from None


def _non_negative(value: Any) -> bool:
    """A finite real number >= 0 (not a bool): a loss rule's size_beta or extrapolate."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def trial_record(row: schema.Trial) -> TrialRecord:
    values = {c.key: getattr(row, c.key) for c in schema.Trial.__table__.columns}
    check_numbers([tuple(values.values())], list(schema.Trial.__table__.columns))
    try:
        config = ArchConfig.from_json(row.config_json) if row.config_json else None
    except ArchsearchError as exc:
        raise DamagedValue(f"trial {row.number}'s {exc}") from None
    return TrialRecord(
        id=row.id,
        study=row.study,
        number=row.number,
        status=row.status,
        reason=row.reason,
        attempts=row.attempts,
        params=json_of(row.params_json, dict, f"trial {row.number}'s params") if row.params_json else {},
        config=config,
        values=values,
    )


def run_columns(
    tokens: int,
    val_loss: float,
    val_curve: Sequence[Sequence[float]],
    settings: Mapping[str, Any] | None,
    device_fingerprint: str | None,
    corpus_fingerprint: str | None,
    wall_time_s: float | None,
) -> dict[str, Any]:
    """The columns a long run and a ladder rung share: what one training run measured."""
    return dict(
        tokens=int(tokens),
        val_loss=float(val_loss),
        val_curve_json=json.dumps([[int(t), float(v)] for t, v in val_curve]),
        settings_json=json.dumps(dict(settings or {}), sort_keys=True),
        device_fingerprint=device_fingerprint,
        corpus_fingerprint=corpus_fingerprint,
        wall_time_s=wall_time_s,
    )


def ladder_rung_record(row: schema.LadderRung) -> LadderRungRecord:
    what = f"ladder rung {row.id} of {row.study!r}"
    checked(row, what)
    try:
        config = ArchConfig.from_json(row.config_json)
    except ArchsearchError as exc:
        raise DamagedValue(f"the config of {what}: {exc}") from None
    return LadderRungRecord(
        study=row.study,
        trial_number=row.trial_number,
        tokens_per_param=row.tokens_per_param,
        batch_size=row.batch_size,
        target_params=row.target_params,
        shape_key=row.shape_key,
        config=config,
        params_total=row.params_total,
        params_non_embedding=row.params_non_embedding,
        seed=row.seed,
        tokens=row.tokens,
        val_loss=_loss_of(row.val_loss, what),
        val_curve=_curve_of(row.val_curve_json, f"the curve of {what}"),
        settings=json_of(row.settings_json, dict, f"the settings of {what}"),
        device_fingerprint=row.device_fingerprint,
        corpus_fingerprint=row.corpus_fingerprint,
        wall_time_s=row.wall_time_s,
        created_at=row.created_at,
    )


def long_run_record(row: schema.LongRun) -> LongRunRecord:
    what = f"long run {row.id} of {row.study!r}"
    checked(row, what)
    return LongRunRecord(
        study=row.study,
        trial_number=row.trial_number,
        multiplier=row.multiplier,
        seed=row.seed,
        tokens=row.tokens,
        val_loss=_loss_of(row.val_loss, what),
        val_curve=_curve_of(row.val_curve_json, f"the curve of {what}"),
        settings=json_of(row.settings_json, dict, f"the settings of {what}"),
        device_fingerprint=row.device_fingerprint,
        corpus_fingerprint=row.corpus_fingerprint,
        wall_time_s=row.wall_time_s,
        created_at=row.created_at,
    )


def study_record(row: schema.Study, counts: dict[str, int] | None) -> StudyRecord:
    spec = json_of(row.spec_json, dict, f"the spec of study {row.name!r}")
    checked(row, f"study {row.name!r}")
    if not (isinstance(row.created_at, (int, float)) and math.isfinite(row.created_at)):
        raise DamagedValue(f"the created_at of study {row.name!r} is {row.created_at!r}, not a time")
    if not isinstance(row.objectives, str):
        raise DamagedValue(f"the objectives of study {row.name!r} are {row.objectives!r}, not text")
    unknown = [n for n in row.objectives.split(",") if n and n not in OBJECTIVES]
    if unknown:  # no study was created with an objective the registry does not know
        raise DamagedValue(
            f"the stored objectives of study {row.name!r} name {quoted(unknown[0])}, which is no objective"
        )
    for key in ("size_beta", "extrapolate"):  # its loss rule, which every reader of its fronts applies
        if spec.get(key) is not None and not _non_negative(spec[key]):
            raise DamagedValue(
                f"the spec of study {row.name!r} gives {key} {quoted(str(spec[key]))}, "
                "not a finite number >= 0"
            )
    return StudyRecord(
        name=row.name,
        spec_fingerprint=row.spec_fingerprint,
        spec_source=row.spec_source,
        spec=spec,
        objectives=tuple(row.objectives.split(",")) if row.objectives else (),
        created_at=row.created_at,
        counts=counts,
    )


def search_run_record(row: schema.SearchRun) -> SearchRunRecord:
    what = f"search run {row.id} of {row.study!r}"
    checked(row, what)
    return SearchRunRecord(
        host=row.host, started_at=row.started_at, settings=json_of(row.settings_json, dict, what)
    )


def validation_record(row: schema.Validation) -> ValidationRecord:
    what = f"validation {row.id} of {row.study!r}"
    checked(row, what)
    return ValidationRecord(
        id=row.id,
        study=row.study,
        multiplier=row.multiplier,
        seeds=row.seeds,
        report=json_of(row.report_json, dict, what),
        created_at=row.created_at,
    )


def ladder_fit_record(row: schema.LadderFitRow) -> LadderFitRecord:
    what = f"ladder fit {row.id} of {row.study!r}"
    checked(row, what)
    return LadderFitRecord(
        tokens_per_param=row.tokens_per_param,
        batch_size=row.batch_size,
        fit=json_of(row.fit_json, dict, what),
        created_at=row.created_at,
    )


def profile_record(row: schema.Profile, what: str) -> ProfileRecord:
    """A stored profile whose number columns were checked (`checked`); `what` names it."""
    return ProfileRecord(
        device=row.device,
        modelled=row.modelled,
        dtype=row.dtype,
        batch=row.batch,
        step_time_s=row.step_time_s,
        tokens_per_second=row.tokens_per_second,
        report=json_of(row.report_json, dict, what),
    )


def device_record(row: schema.Device) -> DeviceRecord:
    return DeviceRecord(
        fingerprint=row.fingerprint,
        name=row.name,
        type=row.type,
        info=json_of(row.info_json, dict, f"device {row.fingerprint!r}"),
    )
