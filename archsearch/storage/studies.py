"""Studies and the driver runs on them: `Storage`'s study methods."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import delete, func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from archsearch.errors import UnknownNameError, quoted
from archsearch.storage import schema
from archsearch.storage.core import StorageCore
from archsearch.storage.errors import StudyExistsError
from archsearch.storage.records import SearchRunRecord, StudyRecord
from archsearch.storage.rows import search_run_record, study_record


class StudyStore(StorageCore):
    """Studies: created once, read with their trial counts, and the drivers that ran on them."""

    def create_study(
        self,
        name: str,
        *,
        spec_fingerprint: str,
        spec_source: str,
        spec: Mapping[str, Any],
        objectives: Sequence[str],
        exist_ok: bool = True,
    ) -> StudyRecord:
        """Record a new study, or return the existing one of that name unchanged.

        Atomic: drivers creating one study at the same moment get one row, and each the same
        record (compare its `spec_fingerprint` with yours). SQLite serialises the writers
        (`BEGIN IMMEDIATE`); on PostgreSQL the loser's insert meets the primary key inside a
        savepoint and reads the winner's row.

        Raises:
            StudyExistsError: with `exist_ok=False`, the study existed or another driver created it.
        """
        created = False
        with self._session() as s:
            if s.get(schema.Study, name) is None:
                try:
                    with s.begin_nested():
                        s.add(
                            schema.Study(
                                name=name, spec_fingerprint=spec_fingerprint, spec_source=spec_source,
                                spec_json=json.dumps(spec, sort_keys=True), objectives=",".join(objectives),
                                created_at=time.time(),
                            )
                        )  # fmt: skip
                    created = True
                except IntegrityError:  # another driver inserted it since our read
                    pass
        record = self.study(name)
        if not created and not exist_ok:
            finished = record.finished if record is not None else 0
            raise StudyExistsError(f"study {name!r} already exists ({finished} finished trials)")
        return record  # type: ignore[return-value]

    def study(self, name: str, *, counts: bool = True) -> StudyRecord | None:
        """The study called `name`, None when there is none.

        Args:
            counts: count its trials by state (one GROUP BY over its trials: a noticeable part of
                a query on a 100,000-trial study); False leaves `counts` None.
        """
        with self._session(read_only=True) as s:
            row = s.get(schema.Study, name)
            if row is None:
                return None
            return study_record(row, self._counts(s, name) if counts else None)

    def require_study(self, name: str, *, counts: bool = False) -> StudyRecord:
        """The study called `name`, by default without its trial counts (`study`).

        Raises:
            UnknownNameError: there is none; the message lists the database's studies.
        """
        record = self.study(name, counts=counts)
        if record is None:
            names = self.study_names()
            shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
            raise UnknownNameError(
                f"unknown study {quoted(name)} in {self.display_url}; "
                + (f"studies: {shown}" if names else "it holds no studies")
            )
        return record

    def optuna_objectives(self, name: str) -> int | None:
        """How many objectives Optuna's study `name` has in this database; None when it has no
        such study (or no Optuna tables yet). Read with SQL: Optuna is not imported."""
        with self._session(read_only=True) as s:
            conn = s.connection()
            if not {"studies", "study_directions"} <= set(self._engine.dialect.get_table_names(conn)):
                return None
            study_id = conn.execute(text("SELECT study_id FROM studies WHERE study_name = :n"), {"n": name})
            found = study_id.scalar()
            if found is None:
                return None
            q = text("SELECT count(*) FROM study_directions WHERE study_id = :i")
            return int(conn.execute(q, {"i": found}).scalar_one())

    def discard_empty_study(self, name: str) -> bool:
        """Delete archsearch's study `name` (and its search runs) if it holds no trials, in one
        transaction under the study's lock: what a search start that failed after creating it
        leaves. Returns whether it was deleted."""
        with self._session() as s:
            s.execute(select(schema.Study.name).where(schema.Study.name == name).with_for_update())
            row = s.get(schema.Study, name)
            trials = select(func.count()).select_from(schema.Trial).where(schema.Trial.study == name)
            if row is None or s.scalar(trials):
                return False
            s.execute(delete(schema.SearchRun).where(schema.SearchRun.study == name))
            s.delete(row)
            return True

    def study_names(self) -> list[str]:
        """The names of every study, oldest first (no trial counts: cheap)."""
        with self._session(read_only=True) as s:
            return list(s.scalars(select(schema.Study.name).order_by(schema.Study.created_at)))

    def studies(self) -> list[StudyRecord]:
        """Every study, oldest first, with its trial counts by state."""
        with self._session(read_only=True) as s:
            rows = s.scalars(select(schema.Study).order_by(schema.Study.created_at)).all()
            counts: dict[str, dict[str, int]] = {}
            for study, status, n in s.execute(
                select(schema.Trial.study, schema.Trial.status, func.count()).group_by(
                    schema.Trial.study, schema.Trial.status
                )
            ):
                counts.setdefault(study, {})[status] = n
            return [study_record(row, counts.get(row.name, {})) for row in rows]

    @staticmethod
    def _counts(s: Session, study: str) -> dict[str, int]:
        q = (
            select(schema.Trial.status, func.count())
            .where(schema.Trial.study == study)
            .group_by(schema.Trial.status)
        )
        return {status: n for status, n in s.execute(q)}

    def counts(self, study: str) -> dict[str, int]:
        """Trials of `study` by state."""
        with self._session(read_only=True) as s:
            return self._counts(s, study)

    # --- the drivers that ran on a study ----------------------------------------------------------
    def add_search_run(self, study: str, settings: Mapping[str, Any]) -> int:
        """Record that a driver started on `study` with `settings` (what ran); returns its id."""
        with self._session() as s:
            row = schema.SearchRun(
                study=study,
                host=self.host[:256],
                settings_json=json.dumps(dict(settings), sort_keys=True),
                started_at=time.time(),
            )
            s.add(row)
            s.flush()
            return row.id

    def search_runs(self, study: str) -> list[SearchRunRecord]:
        """`study`'s driver runs, oldest first."""
        with self._session(read_only=True) as s:
            rows = self._oldest_first(s, schema.SearchRun, study, schema.SearchRun.started_at)
            return [search_run_record(r) for r in rows]
