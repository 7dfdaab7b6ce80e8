"""The profiler's measurement cache backed by the trial database (a `MeasurementCache`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from archsearch.storage.db import Storage


class _Key(Protocol):  # `evaluators.profiler.MeasurementKey`, without importing torch here
    fingerprint: str
    dtype: str
    kind: str
    shape: tuple[int, ...]

    def to_str(self) -> str: ...


class _Device(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


def measurement_row(key: _Key, seconds: float) -> dict[str, Any]:
    """A measurement as plain data: what a worker returns and `Storage.add_measurements` takes."""
    return dict(
        key=key.to_str(),
        fingerprint=key.fingerprint,
        dtype=key.dtype,
        kind=key.kind,
        shape="x".join(map(str, key.shape)),
        seconds=float(seconds),
    )


class KernelCache:
    """A `MeasurementCache` over the kernel times already known (e.g. `Storage.measurements()`).

    New measurements are kept in `new` (a Ray worker returns them to the driver, which records
    them with the trial) and, when a `storage` is given, also written to it at once (the CLI's
    `profile` command).
    """

    def __init__(self, known: Mapping[str, float] | None = None, storage: Storage | None = None) -> None:
        self._known = dict(known or {})
        self._storage = storage
        self.new: list[dict[str, Any]] = []
        self.device: dict[str, Any] | None = None

    def get(self, key: _Key) -> float | None:
        return self._known.get(key.to_str())

    def put(self, key: _Key, seconds: float, device: _Device) -> None:
        row = measurement_row(key, seconds)
        self._known[row["key"]] = row["seconds"]
        self.new.append(row)
        self.device = device.to_dict()
        if self._storage is not None:
            self._storage.add_measurements([row], self.device)

    def __len__(self) -> int:
        return len(self._known)
