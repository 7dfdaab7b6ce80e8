"""Trials: claimed, assigned, leased, finished and read back; `Storage`'s trial methods."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, func, insert, select, update

from archsearch.space.config import ArchConfig
from archsearch.space.objectives import curve_change
from archsearch.storage import schema
from archsearch.storage.core import StorageCore
from archsearch.storage.devices import add_device, add_measurements
from archsearch.storage.errors import StorageError
from archsearch.storage.records import ProfileRecord, TrialRecord
from archsearch.storage.rows import (
    BY_NUMBER,
    check_numbers,
    checked,
    config_columns,
    profile_record,
    trial_record,
)
from archsearch.trial import COMPLETE, FINISHED, PRUNED, RUNNING, TrialOutcome, check_state


class TrialStore(StorageCore):
    """A study's trials: slots claimed under a lease, results written in one transaction."""

    # --- trial life cycle ------------------------------------------------------------------------
    def claim_trial(self, study: str, limit: int, lease_s: float) -> int | None:
        """Reserve one of `limit` trial slots: a running row, or None when the study is full.

        Finished and running trials fill slots. The count and the insert are one transaction
        (the write lock on SQLite, a row lock on the study in PostgreSQL), so several drivers on
        one study never run more than `limit` trials between them.
        """
        now = time.time()
        with self._session() as s:
            s.execute(select(schema.Study.name).where(schema.Study.name == study).with_for_update())
            taken = s.scalar(
                select(func.count())
                .select_from(schema.Trial)
                .where(schema.Trial.study == study, schema.Trial.status.in_((*FINISHED, RUNNING)))
            )
            if taken >= limit:
                return None
            row = schema.Trial(
                study=study,
                status=RUNNING,
                attempts=0,
                host=self.host,
                started_at=now,
                lease_expires_at=now + lease_s,
            )
            s.add(row)
            s.flush()
            return row.id

    def assign_trial(
        self,
        trial_id: int,
        *,
        number: int,
        optuna_trial_id: int,
        params: Mapping[str, Any],
        config: ArchConfig | None,
    ) -> int | None:
        """Attach Optuna's trial and the sampled shape (with its exact costs) to a claimed row.

        Returns:
            The number of another trial of the study with the same shape that is running or was
            trained (complete or pruned), else None: checked in the same transaction, under the
            study's lock, so two drivers sampling one shape at once cannot both miss the other.
        """
        values: dict[str, Any] = dict(
            number=number,
            optuna_trial_id=optuna_trial_id,
            params_json=json.dumps(dict(params), sort_keys=True),
        )
        if config is not None:
            values.update(config_columns(config))
        with self._session() as s:
            row = s.get(schema.Trial, trial_id)
            if row is None:
                raise StorageError(f"no trial row {trial_id}")
            same = None
            if config is not None:
                s.execute(select(schema.Study.name).where(schema.Study.name == row.study).with_for_update())
                same = s.scalar(
                    select(schema.Trial.number)
                    .where(
                        schema.Trial.study == row.study,
                        schema.Trial.id != trial_id,
                        schema.Trial.config_json == values["config_json"],
                        schema.Trial.status.in_((RUNNING, COMPLETE, PRUNED)),
                    )
                    .order_by(schema.Trial.id)
                    .limit(1)
                )
            s.execute(update(schema.Trial).where(schema.Trial.id == trial_id).values(**values))
            return same

    def start_attempt(self, trial_id: int, lease_s: float, note: str | None = None) -> int:
        """Count one more worker run of a trial, renew its lease; `note` keeps a retry's cause."""
        with self._session() as s:
            row = s.get(schema.Trial, trial_id)
            if row is None:
                raise StorageError(f"no trial row {trial_id}")
            row.attempts += 1
            row.lease_expires_at = time.time() + lease_s
            if note:
                row.reason = f"{row.reason}; {note}" if row.reason else note
            return row.attempts

    def renew_leases(self, trial_ids: Sequence[int], lease_s: float) -> None:
        if not trial_ids:
            return
        with self._session() as s:
            s.execute(
                update(schema.Trial)
                .where(schema.Trial.id.in_(list(trial_ids)), schema.Trial.status == RUNNING)
                .values(lease_expires_at=time.time() + lease_s)
            )

    def expire_leases(self, host: str) -> int:
        """End now the leases of the running trials of the driver `host` (its `Storage.host`), which
        died without settling them: the next driver's sweep re-queues them at once instead of
        after the lease. Returns how many there were."""
        with self._session() as s:
            done = s.execute(
                update(schema.Trial)
                .where(schema.Trial.host == host, schema.Trial.status == RUNNING)
                .values(lease_expires_at=time.time())
            )
            return int(done.rowcount or 0)

    def end_trial(self, trial_id: int, status: str, reason: str) -> None:
        """Close a trial that produced no results: rejected, interrupted, or failed before running."""
        check_state(status)
        with self._session() as s:
            s.execute(
                update(schema.Trial)
                .where(schema.Trial.id == trial_id)
                .values(status=status, reason=reason, lease_expires_at=None, finished_at=time.time())
            )

    def finish_trial(self, trial_id: int, outcome: TrialOutcome) -> None:
        """Write everything a trial produced, in one transaction: all of it or none of it.

        Raises:
            ValueRefusedError: the database refused one of its values (nothing is written; the
                driver then fails the trial with that reason, `end_trial`).
            StorageUnavailableError: the database failed (nothing is written).
        """
        now = time.time()
        train = outcome.train or {}
        with self._session() as s:
            row = s.get(schema.Trial, trial_id)
            if row is None:
                raise StorageError(f"no trial row {trial_id}")
            row.status = outcome.status
            if outcome.reason:
                row.reason = f"{row.reason}; {outcome.reason}" if row.reason else outcome.reason
            row.lease_expires_at = None
            row.finished_at = now
            row.pruned_rung = outcome.pruned_rung
            row.step_time_s = outcome.step_time_s
            row.step_time_device = outcome.step_time_device
            row.prefill_time_s = outcome.prefill_time_s
            row.decode_time_s = outcome.decode_time_s
            if train:
                row.loss = train.get("val_loss")
                row.bits_per_byte = train.get("bits_per_byte")
                row.tokens_trained = train.get("tokens")
                row.steps = train.get("steps")
                row.train_seconds = train.get("wall_time_s")
                row.tokens_per_second = train.get("tokens_per_second")
                row.mfu = train.get("mfu")
                row.precision = train.get("precision")
                row.corpus_fingerprint = train.get("corpus_fingerprint")
                # The curve of the run whose loss is kept: a stalled run's retry's (search.worker).
                row.loss_change = curve_change(train.get("val_curve") or ())
                for kind, curve in (
                    ("train", train.get("loss_curve") or ()),
                    ("val", train.get("val_curve") or ()),
                ):
                    # One point per token count; finite points only, on every backend: a run
                    # stops at its first non-finite loss, which its reason records.
                    points = {int(t): float(v) for t, v in curve if math.isfinite(float(v))}
                    s.add_all(
                        schema.Curve(trial_id=trial_id, kind=kind, tokens=t, loss=v)
                        for t, v in points.items()
                    )
            if outcome.device:
                row.device_fingerprint = outcome.device.get("fingerprint")
                add_device(s, outcome.device)
            for p in outcome.profiles:
                s.add(
                    schema.Profile(
                        trial_id=trial_id,
                        device=p["device"],
                        modelled=bool(p["modelled"]),
                        dtype=p["dtype"],
                        batch=int(p["batch"]),
                        step_time_s=float(p["step_time_s"]),
                        tokens_per_second=float(p["tokens_per_second"]),
                        report_json=json.dumps(p.get("report", {}), sort_keys=True),
                    )
                )
            add_measurements(s, outcome.measurements)

    def stale_trials(self, study: str, now: float | None = None) -> list[TrialRecord]:
        """Running trials whose lease expired: their driver died without closing them."""
        now = time.time() if now is None else now
        with self._session(read_only=True) as s:
            rows = s.scalars(
                select(schema.Trial).where(
                    schema.Trial.study == study,
                    schema.Trial.status == RUNNING,
                    schema.Trial.lease_expires_at < now,
                )
            ).all()
            return [trial_record(r) for r in rows]

    def trials(self, study: str, status: str | None = None) -> list[TrialRecord]:
        """The trials of `study` (optionally of one state), by trial number."""
        with self._session(read_only=True) as s:
            q = select(schema.Trial).where(schema.Trial.study == study)
            if status is not None:
                q = q.where(schema.Trial.status == status)
            rows = s.scalars(q.order_by(*BY_NUMBER)).all()
            return [trial_record(r) for r in rows]

    def complete_values(self, study: str, columns: Sequence[str]) -> tuple[list[int], list[tuple[Any, ...]]]:
        """Trial numbers and the given columns of `study`'s complete trials, in one lean query.

        For fronts over many trials: no records or configs are built.

        Raises:
            DamagedStorageError: a complete trial stores an infinite number, which no complete
                trial has (a non-finite loss fails the trial; NaN is stored as NULL, read as None).
        """
        rows = self.trial_rows(study, ["number", *columns], where=schema.Trial.status == COMPLETE)
        for row in rows:
            for column, value in zip(columns, row[1:], strict=True):
                if isinstance(value, float) and math.isinf(value):
                    raise self._damaged(
                        f"complete trial {row[0]} of {study!r} stores {column} = {value}, which no complete "
                        "trial has"
                    )
        return [r[0] for r in rows], [r[1:] for r in rows]

    def wall_times(self, study: str) -> list[float]:
        """Seconds from claim to result of each of `study`'s finished trials (complete, pruned or
        failed; retries included), by trial number: what a search's ETA is estimated from."""
        rows = self.trial_rows(study, ["started_at", "finished_at"], where=schema.Trial.status.in_(FINISHED))
        return [end - start for start, end in rows if start is not None and end is not None]

    def trials_by_number(self, study: str, numbers: Sequence[int]) -> list[TrialRecord]:
        """The records of `study`'s trials `numbers`, in that order (missing ones left out)."""
        # A number beyond a signed 64-bit integer names no row, and SQLite's driver cannot bind it.
        storable = [n for n in numbers if -(2**63) <= n < 2**63]
        with self._session(read_only=True) as s:
            wanted = schema.Trial.number.in_(storable)
            rows = s.scalars(select(schema.Trial).where(schema.Trial.study == study, wanted)).all()
            by_number = {r.number: trial_record(r) for r in rows}
        return [by_number[n] for n in numbers if n in by_number]

    def trial_rows(
        self,
        study: str,
        columns: Sequence[str],
        *,
        where: ColumnElement[bool] | None = None,
        order_by: Sequence[ColumnElement[Any]] = (),
        limit: int | None = None,
    ) -> list[tuple[Any, ...]]:
        """Chosen columns of `study`'s trials in one SELECT: filter, order and limit run in SQL.

        Args:
            columns: `archsearch_trials` column names, in the order wanted.
            where: a boolean expression over that table (`storage.query.compile_filter` builds
                one from user text, with bound parameters).
            order_by: ORDER BY clauses; without any, by trial number, unnumbered rows last.
            limit: at most this many rows.
        """
        table = schema.Trial.__table__
        q = select(*(table.c[name] for name in columns)).where(table.c.study == study)
        if where is not None:
            q = q.where(where)
        q = q.order_by(*order_by, *BY_NUMBER)
        if limit is not None:
            q = q.limit(limit)
        with self._session(read_only=True) as s:
            # A Core query on the session's connection: the ORM's result processing would
            # cost more than the query itself on a large study.
            rows = [tuple(row) for row in s.connection().execute(q)]
            check_numbers(rows, [table.c[name] for name in columns])
            return rows

    def add_trials(self, study: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Insert trial rows in bulk, in one transaction.

        For synthetic databases (benchmarks, tests): a search records trials through
        `claim_trial`, `assign_trial` and `finish_trial` instead.

        Args:
            rows: `archsearch_trials` columns by name; a "config" entry (an `ArchConfig`) fills
                the shape and cost columns as `assign_trial` does.
        """
        columns: dict[ArchConfig, dict[str, Any]] = {}  # the cost model once per distinct shape
        values = []
        for row in rows:
            row = dict(row)
            cfg = row.pop("config", None)
            if cfg is not None:
                if cfg not in columns:
                    columns[cfg] = config_columns(cfg)
                row = {**columns[cfg], **row}
            values.append({**row, "study": study})
        if values:
            with self._session() as s:
                s.execute(insert(schema.Trial), values)

    def trial(self, trial_id: int) -> TrialRecord | None:
        with self._session(read_only=True) as s:
            row = s.get(schema.Trial, trial_id)
            return None if row is None else trial_record(row)

    def curves(self, trial_id: int) -> dict[str, list[tuple[int, float]]]:
        """A trial's loss curves: {"train": [(tokens, loss), ...], "val": [...]}."""
        with self._session(read_only=True) as s:
            rows = s.execute(
                select(schema.Curve.kind, schema.Curve.tokens, schema.Curve.loss)
                .where(schema.Curve.trial_id == trial_id)
                .order_by(schema.Curve.kind, schema.Curve.tokens)
            ).all()
            check_numbers(rows, [schema.Curve.kind, schema.Curve.tokens, schema.Curve.loss], "a curve point")
        out: dict[str, list[tuple[int, float]]] = {"train": [], "val": []}
        for kind, tokens, loss in rows:
            out.setdefault(kind, []).append((tokens, loss))
        return out

    def profiles(self, trial_id: int) -> list[ProfileRecord]:
        """A trial's stored step profiles, one per device it was measured or modelled on."""
        with self._session(read_only=True) as s:
            rows = s.scalars(select(schema.Profile).where(schema.Profile.trial_id == trial_id)).all()
            rows = [checked(r, f"trial {trial_id}'s profile on {r.device!r}") for r in rows]
            return [profile_record(r, f"trial {trial_id}'s profile on {r.device!r}") for r in rows]
