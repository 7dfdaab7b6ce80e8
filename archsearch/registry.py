"""A small name -> value registry that rejects duplicates and lists valid names on a miss."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from archsearch.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """Variants keyed by name (activations, norms, presets, ...), in registration order.

    Args:
        kind: what the entries are, used in error messages ("activation", "preset").
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, value: T) -> T:
        """Add `value` under `name`.

        Raises:
            ValueError: `name` is already registered (a programming error, not user input).
        """
        if name in self._entries:
            raise ValueError(f"duplicate {self.kind} {name!r}")
        self._entries[name] = value
        return value

    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            valid = ", ".join(self._entries)
            raise UnknownNameError(f"unknown {self.kind} {name!r}; valid: {valid}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(self._entries.items())
