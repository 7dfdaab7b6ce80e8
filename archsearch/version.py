"""The installed archsearch's version, read from its package metadata: pyproject.toml is the one
place it is written. Imports nothing of archsearch's, so any module may import it."""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("archsearch")
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
