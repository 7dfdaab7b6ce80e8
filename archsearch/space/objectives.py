"""The objectives a search minimises, defined once: name, trial column, unit, scale, meaning.

Used by the space file (`search.spec`), the driver (what Optuna is told), Pareto fronts and the
export selectors (`search.pareto`, `search.selection`) and trial queries (`storage.query`'s
aliases). Every objective is minimised.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from archsearch.errors import ArchsearchError
from archsearch.registry import Registry


@dataclass(frozen=True)
class Objective:
    """A quantity a search minimises.

    Attributes:
        column: the trial column that stores it.
        unit: what its numbers count.
        log_scale: fronts see it as log10 (the knee, the hypervolume): it spans orders of magnitude.
        meaning: what exactly is measured.
    """

    column: str
    unit: str
    log_scale: bool
    meaning: str


OBJECTIVES: Registry[Objective] = Registry("objective")
OBJECTIVES.register(
    "loss", Objective("loss", "nats/token", False, "proxy held-out loss at the end of its budget")
)
OBJECTIVES.register(
    "flops", Objective("flops_forward_per_token", "FLOP/token", True, "forward FLOPs per token (space.costs)")
)
OBJECTIVES.register(
    "step_time",
    Objective(
        "step_time_s", "s", True,
        "one training step of the profiled batch, measured locally or modelled on a catalogued GPU",
    ),
)  # fmt: skip
# Serving (BRIEF.md section 11; the [serve] table of a space file, `space.serve.ServeScenario`).
OBJECTIVES.register(
    "kv_bytes",
    Objective(
        "kv_cache_bytes_per_token", "B/token", True,
        "KV-cache bytes per token in bf16 (space.costs): shapes rank the same at any context and cache dtype",
    ),
)  # fmt: skip
OBJECTIVES.register(
    "prefill_time",
    Objective(
        "prefill_time_s", "s", True,
        "prefill of the [serve] scenario's prompts, modelled on its catalogued GPU (evaluators.serving)",
    ),
)  # fmt: skip
OBJECTIVES.register(
    "decode_time",
    Objective(
        "decode_time_s", "s", True,
        "one decode step of the [serve] scenario (seconds per generated token, mid-generation), "
        "modelled on its catalogued GPU (evaluators.serving)",
    ),
)  # fmt: skip
SERVE_TIME_OBJECTIVES = ("prefill_time", "decode_time")  # need a [serve] scenario on a catalogued GPU
DEFAULT_OBJECTIVES = ("loss", "flops")
OBJECTIVE_COLUMNS = {name: o.column for name, o in OBJECTIVES.items()}
LOG_OBJECTIVES = frozenset(name for name, o in OBJECTIVES.items() if o.log_scale)


PARAMS_UNIT = 1e6  # size enters as ln(params / 1M): a 1M-parameter shape keeps its loss


def size_adjusted_loss(loss: float, params: float, beta: float | None) -> float:
    """The loss objective of a study with a size beta: `loss - beta * ln(params / 1M)`.

    A short proxy run under-credits capacity, which longer training rewards; crediting the proxy
    loss with `beta` nats per e-fold of parameters ranks shapes like 10x-longer training on the
    tiny space (docs/accuracy.md, "The loss objective"; `search.fidelity.size_adjusted_losses` holds the
    measurements). With `beta` None (a study without one) the loss is returned as it is.

    Raises:
        ValueError: `params` is not positive, or `beta` is negative or not finite.
    """
    if beta is None:
        return loss
    if not (math.isfinite(beta) and beta >= 0):
        raise ValueError(f"beta must be a finite number >= 0, got {beta}")
    if not params > 0:
        raise ValueError(f"the parameter count must be > 0, got {params}")
    return loss - beta * math.log(params / PARAMS_UNIT)


def parse_objectives(text: str | Sequence[str]) -> tuple[str, ...]:
    """ "loss,flops" -> ("loss", "flops"), validated: loss first, then one or two other known
    objectives, each once. The one rule for space files, `pareto --objectives` and stored studies.

    Raises:
        ArchsearchError: the names break the rule (the message lists what is valid).
    """
    names = tuple(n.strip() for n in (text.split(",") if isinstance(text, str) else text) if n.strip())
    others = [n for n in OBJECTIVES if n != "loss"]
    valid = [n for n in names if n in OBJECTIVES]
    if (
        valid != list(names)
        or len(set(names)) != len(names)
        or not 2 <= len(names) <= 3
        or names[0] != "loss"
    ):
        unknown = [n for n in names if n not in OBJECTIVES]
        why = f"unknown objective {unknown[0]!r}; " if unknown else ""
        raise ArchsearchError(
            f"{why}objectives {','.join(names) or repr(text)} must be loss then one or two of "
            f"{', '.join(others)}, each once (e.g. loss,flops or loss,flops,step_time)"
        )
    return names
