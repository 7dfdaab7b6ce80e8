"""archsearch: hardware-aware architecture search for transformer language models."""

from __future__ import annotations

from typing import Any

from archsearch.errors import ArchsearchError, ConfigError, UnknownNameError
from archsearch.version import __version__

__all__ = ["ArchConfig", "ArchsearchError", "ConfigError", "UnknownNameError", "__version__"]


def __getattr__(name: str) -> Any:
    """`ArchConfig`, imported when first asked for: importing the package stays cheap, so the
    command line's entry (`__main__`) has its signal handlers in place almost at once."""
    if name == "ArchConfig":
        from archsearch.space import ArchConfig

        return ArchConfig
    raise AttributeError(f"module 'archsearch' has no attribute {name!r}")
