"""Long runs and the `validate` reports made from them: `Storage`'s validation methods."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select

from archsearch.storage import schema
from archsearch.storage.core import StorageCore
from archsearch.storage.records import LongRunRecord, ValidationRecord
from archsearch.storage.rows import long_run_record, run_columns, validation_record


class ValidationStore(StorageCore):
    """Long runs (a trial's shape retrained at a multiple of the proxy's tokens) and the reports
    of `archsearch validate`."""

    # --- long runs and validation reports (`archsearch validate`) ---------------------------------
    def add_long_run(
        self,
        study: str,
        *,
        trial_number: int,
        multiplier: float,
        seed: int,
        tokens: int,
        val_loss: float,
        val_curve: Sequence[Sequence[float]] = (),
        settings: Mapping[str, Any] | None = None,
        device_fingerprint: str | None = None,
        corpus_fingerprint: str | None = None,
        wall_time_s: float | None = None,
    ) -> bool:
        """Record one long run, in one transaction; the first run of a (trial, multiplier, seed) wins.

        Returns:
            True when written, False when that run was already stored (it is left as it was).
        """
        key = dict(study=study, trial_number=trial_number, multiplier=float(multiplier), seed=seed)
        run = run_columns(
            tokens, val_loss, val_curve, settings, device_fingerprint, corpus_fingerprint, wall_time_s
        )
        return self._add_once(schema.LongRun, key, run)

    def long_runs(self, study: str, multiplier: float | None = None) -> list[LongRunRecord]:
        """`study`'s long runs (of one multiplier, or all), by trial number, multiplier, seed."""
        with self._session(read_only=True) as s:
            q = select(schema.LongRun).where(schema.LongRun.study == study)
            if multiplier is not None:
                q = q.where(schema.LongRun.multiplier == float(multiplier))
            q = q.order_by(schema.LongRun.trial_number, schema.LongRun.multiplier, schema.LongRun.seed)
            return [long_run_record(r) for r in s.scalars(q).all()]

    def long_run_losses(self, study: str) -> dict[int, tuple[float, float, int]]:
        """Per trial with long runs: (multiplier, mean loss over its seeds, seeds) at its largest
        multiplier; what `pareto` and `trials` show beside the proxy loss."""
        by_trial: dict[int, dict[float, list[float]]] = {}
        for run in self.long_runs(study):
            by_trial.setdefault(run.trial_number, {}).setdefault(run.multiplier, []).append(run.val_loss)
        out = {}
        for number, by_multiplier in by_trial.items():
            multiplier = max(by_multiplier)
            losses = by_multiplier[multiplier]
            out[number] = (multiplier, sum(losses) / len(losses), len(losses))
        return out

    def add_validation(self, study: str, *, multiplier: float, seeds: int, report: Mapping[str, Any]) -> int:
        """Store one `validate` report of `study`; returns its id."""
        with self._session() as s:
            row = schema.Validation(
                study=study,
                multiplier=float(multiplier),
                seeds=int(seeds),
                report_json=json.dumps(dict(report), sort_keys=True),
                created_at=time.time(),
            )
            s.add(row)
            s.flush()
            return row.id

    def validations(self, study: str) -> list[ValidationRecord]:
        """`study`'s stored `validate` reports, oldest first."""
        with self._session(read_only=True) as s:
            rows = self._oldest_first(s, schema.Validation, study, schema.Validation.created_at)
            return [validation_record(r) for r in rows]
