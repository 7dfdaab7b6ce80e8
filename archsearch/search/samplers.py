"""Optuna samplers by name: `SAMPLERS[name](seed, n_objectives)` builds one.

Names only here (optuna is imported when a sampler is built), so a space file's `sampler` is
validated without importing optuna.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from archsearch.errors import ArchsearchError
from archsearch.registry import Registry

if TYPE_CHECKING:
    import optuna


def _tpe(seed: int, _n: int) -> optuna.samplers.BaseSampler:
    import optuna

    # constant_liar keeps parallel workers from all sampling the same promising point.
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)


def _nsga2(seed: int, _n: int) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.NSGAIISampler(seed=seed)


def _random(seed: int, _n: int) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.RandomSampler(seed=seed)


def _gp(seed: int, _n: int) -> optuna.samplers.BaseSampler:
    import optuna

    try:
        import scipy  # noqa: F401  (GPSampler's optimiser)
    except ImportError:
        raise ArchsearchError("the gp sampler needs scipy: pip install scipy") from None
    return optuna.samplers.GPSampler(seed=seed)


SAMPLERS: Registry[Callable[[int, int], Any]] = Registry("sampler")
SAMPLERS.register("tpe", _tpe)
SAMPLERS.register("nsga2", _nsga2)
SAMPLERS.register("random", _random)
SAMPLERS.register("gp", _gp)
