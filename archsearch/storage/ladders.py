"""Size ladders: rungs claimed and trained, and the fits made of them; `Storage`'s ladder methods."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import delete, select, update

from archsearch.space.config import ArchConfig
from archsearch.space.costs import param_counts
from archsearch.storage import schema
from archsearch.storage.core import StorageCore
from archsearch.storage.records import LadderFitRecord, LadderRungRecord, shape_key
from archsearch.storage.rows import ladder_fit_record, ladder_rung_record, run_columns


class LadderStore(StorageCore):
    """The rungs of `archsearch ladder` (a trial's design at several sizes), the claims that keep
    two ladders from training one rung, and the fits of their losses."""

    # --- size ladders (`archsearch ladder`) ---------------------------------------------------------
    def add_ladder_rung(
        self,
        study: str,
        *,
        trial_number: int,
        tokens_per_param: float,
        batch_size: int,
        target_params: int,
        config: ArchConfig,
        seed: int,
        tokens: int,
        val_loss: float,
        val_curve: Sequence[Sequence[float]] = (),
        settings: Mapping[str, Any] | None = None,
        device_fingerprint: str | None = None,
        corpus_fingerprint: str | None = None,
        wall_time_s: float | None = None,
    ) -> bool:
        """Record one trained rung, in one transaction that also drops its claim (whoever holds it);
        the first of a (trial, tokens per parameter, batch size, shape, seed) wins.

        Returns:
            True when written, False when that rung was already stored (it is left as it was).
        """
        key = dict(
            study=study, trial_number=trial_number, tokens_per_param=float(tokens_per_param),
            batch_size=int(batch_size), shape_key=shape_key(config), seed=seed,
        )  # fmt: skip
        counts = param_counts(config)
        rung = dict(
            target_params=int(target_params), config_json=config.to_json(indent=None),
            params_total=counts.total, params_non_embedding=counts.non_embedding,
            **run_columns(
                tokens, val_loss, val_curve, settings, device_fingerprint, corpus_fingerprint, wall_time_s
            ),
        )  # fmt: skip
        return self._add_once(schema.LadderRung, key, rung, settles=schema.LadderClaim)

    def claim_ladder_rung(
        self,
        study: str,
        *,
        trial_number: int,
        tokens_per_param: float,
        batch_size: int,
        config: ArchConfig,
        seed: int,
        owner: str,
        lease_s: float,
    ) -> str | None:
        """Claim one rung for `owner` to train, for `lease_s` seconds, in one transaction holding
        the study's row locked (of two ladders racing for it, the first wins).

        Returns:
            None when claimed (a lapsed claim of another ladder is taken over); else why not:
            "stored" (the rung is stored already) or "claimed" (another ladder holds it).
        """
        key = dict(
            study=study, trial_number=trial_number, tokens_per_param=float(tokens_per_param),
            batch_size=int(batch_size), shape_key=shape_key(config), seed=seed,
        )  # fmt: skip
        now = time.time()
        with self._session() as s:
            s.execute(select(schema.Study.name).where(schema.Study.name == study).with_for_update())
            rung = [schema.LadderRung.__table__.c[c] == v for c, v in key.items()]
            if s.scalar(select(schema.LadderRung.id).where(*rung)) is not None:
                return "stored"
            same = [schema.LadderClaim.__table__.c[c] == v for c, v in key.items()]
            held = s.scalar(select(schema.LadderClaim).where(*same))
            if held is not None and held.owner != owner and held.expires_at > now:
                return "claimed"
            if held is not None:
                s.delete(held)
                s.flush()
            s.add(schema.LadderClaim(**key, owner=owner[:128], expires_at=now + lease_s))
            return None

    def renew_ladder_claims(self, owner: str, lease_s: float) -> None:
        """Extend every claim `owner` holds to `lease_s` seconds from now."""
        with self._session() as s:
            s.execute(
                update(schema.LadderClaim)
                .where(schema.LadderClaim.owner == owner[:128])
                .values(expires_at=time.time() + lease_s)
            )

    def release_ladder_claims(self, owner: str) -> None:
        """Drop every claim `owner` holds (its rungs stored, failed or given up)."""
        with self._session() as s:
            s.execute(delete(schema.LadderClaim).where(schema.LadderClaim.owner == owner[:128]))

    def ladder_rungs(
        self, study: str, tokens_per_param: float | None = None, batch_size: int | None = None
    ) -> list[LadderRungRecord]:
        """`study`'s stored rungs (of one tokens-per-parameter and batch size, or all), by trial,
        ratio, batch, size, seed."""
        with self._session(read_only=True) as s:
            table = schema.LadderRung
            q = select(table).where(table.study == study)
            if tokens_per_param is not None:
                q = q.where(table.tokens_per_param == float(tokens_per_param))
            if batch_size is not None:
                q = q.where(table.batch_size == int(batch_size))
            q = q.order_by(
                table.trial_number, table.tokens_per_param, table.batch_size, table.params_total, table.seed,
                table.id,
            )  # fmt: skip
            return [ladder_rung_record(r) for r in s.scalars(q).all()]

    def add_ladder_fit(
        self, study: str, *, tokens_per_param: float, batch_size: int, fit: Mapping[str, Any]
    ) -> int:
        """Store one fit of `study`'s ladders (`LadderFit.to_dict()`); returns its id."""
        with self._session() as s:
            row = schema.LadderFitRow(
                study=study,
                tokens_per_param=float(tokens_per_param),
                batch_size=int(batch_size),
                fit_json=json.dumps(dict(fit), sort_keys=True),
                created_at=time.time(),
            )
            s.add(row)
            s.flush()
            return row.id

    def ladder_fits(self, study: str) -> list[LadderFitRecord]:
        """`study`'s stored ladder fits, oldest first."""
        with self._session(read_only=True) as s:
            rows = self._oldest_first(s, schema.LadderFitRow, study, schema.LadderFitRow.created_at)
            return [ladder_fit_record(r) for r in rows]
