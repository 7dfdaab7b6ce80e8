"""Devices and the kernel times measured on them (the profiler's shared cache): `Storage`'s device
methods, and the writes `finish_trial` shares.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from archsearch.errors import quoted
from archsearch.storage import schema
from archsearch.storage.core import StorageCore
from archsearch.storage.records import DeviceRecord
from archsearch.storage.rows import device_record


def add_measurements(s: Session, measurements: Sequence[Mapping[str, Any]]) -> None:
    """Record kernel times in `s`'s transaction; the first measurement of a key is kept."""
    if not measurements:
        return
    keys = [m["key"] for m in measurements]
    known = set(s.scalars(select(schema.Kernel.key).where(schema.Kernel.key.in_(keys))))
    now = time.time()
    for m in measurements:
        if m["key"] in known:
            continue  # first measurement wins: every trial on the device then reads the same time
        known.add(m["key"])
        s.add(
            schema.Kernel(
                key=m["key"],
                device_fingerprint=m["fingerprint"],
                dtype=m["dtype"],
                kind=m["kind"],
                shape=m["shape"],
                seconds=float(m["seconds"]),
                measured_at=now,
            )
        )


def add_device(s: Session, device: Mapping[str, Any]) -> None:
    """Record a device once: an insert that does nothing where its fingerprint is stored, so
    drivers finishing trials on one device at once never collide (a read-then-insert lost a
    trial's result to a duplicate key on PostgreSQL under load)."""
    from sqlalchemy.dialects import postgresql, sqlite

    fingerprint = device.get("fingerprint")
    if not fingerprint:
        return
    values = dict(
        fingerprint=fingerprint,
        name=str(device.get("name", "")),
        type=str(device.get("type", "")),
        info_json=json.dumps(dict(device), sort_keys=True),
        first_seen=time.time(),
    )
    insert = postgresql.insert if s.get_bind().dialect.name == "postgresql" else sqlite.insert
    s.execute(insert(schema.Device).values(**values).on_conflict_do_nothing(index_elements=["fingerprint"]))


class DeviceStore(StorageCore):
    """The devices trials ran on, and the kernel times measured on each."""

    # --- kernel measurements (the profiler's shared cache) ----------------------------------------
    def measurements(self, fingerprint: str | None = None) -> dict[str, float]:
        """Measured kernel seconds by `MeasurementKey.to_str()`, for one device or all."""
        with self._session(read_only=True) as s:
            q = select(schema.Kernel.key, schema.Kernel.seconds)
            if fingerprint is not None:
                q = q.where(schema.Kernel.device_fingerprint == fingerprint)
            measured = dict(s.execute(q).all())
        for key, seconds in measured.items():  # a profile divides by them
            if isinstance(seconds, bool) or not (
                isinstance(seconds, (int, float)) and 0 < seconds < math.inf
            ):
                raise self._damaged(
                    f"a stored value is damaged: kernel {quoted(str(key))} took {quoted(str(seconds))} s, "
                    "not a positive number"
                )
        return measured

    def add_measurements(
        self, measurements: Sequence[Mapping[str, Any]], device: Mapping[str, Any] | None
    ) -> None:
        with self._session() as s:
            if device:
                add_device(s, device)
            add_measurements(s, measurements)

    def devices(self) -> list[DeviceRecord]:
        """Every device recorded, whichever study's trials or runs it trained."""
        with self._session(read_only=True) as s:
            return [device_record(r) for r in s.scalars(select(schema.Device)).all()]
