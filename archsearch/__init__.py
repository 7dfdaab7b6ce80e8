"""archsearch: hardware-aware architecture search for transformer language models."""

from archsearch.errors import ArchsearchError, ConfigError, UnknownNameError
from archsearch.space import ArchConfig

__version__ = "0.1.0"

__all__ = ["ArchConfig", "ArchsearchError", "ConfigError", "UnknownNameError", "__version__"]
