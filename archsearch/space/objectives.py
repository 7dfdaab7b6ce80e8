"""The objectives a search minimises, defined once: name, trial column, unit, scale, meaning.

Used by the space file (`search.spec`), the driver (what Optuna is told), Pareto fronts and the
export selectors (`search.pareto`, `search.selection`) and trial queries (`storage.query`'s
aliases). Every objective is minimised.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from archsearch.errors import ArchsearchError, quoted
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
# Serving (docs/explanations/serving-costs.md; the [serve] table of a space file,
# `space.serve.ServeScenario`).
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
        "prefill of the [serve] scenario's prompts, "
        "modelled on its catalogued GPU (evaluators.hardware_serving)",
    ),
)  # fmt: skip
OBJECTIVES.register(
    "decode_time",
    Objective(
        "decode_time_s", "s", True,
        "one decode step of the [serve] scenario (seconds per generated token, mid-generation), "
        "modelled on its catalogued GPU (evaluators.hardware_serving)",
    ),
)  # fmt: skip
SERVE_TIME_OBJECTIVES = ("prefill_time", "decode_time")  # need a [serve] scenario on a catalogued GPU
DEFAULT_OBJECTIVES = ("loss", "flops")
OBJECTIVE_COLUMNS = {name: o.column for name, o in OBJECTIVES.items()}
LOG_OBJECTIVES = frozenset(name for name, o in OBJECTIVES.items() if o.log_scale)


PARAMS_UNIT = 1e6  # size enters as ln(params / 1M): a 1M-parameter shape keeps its loss


def loss_objective(
    loss: float, change: float, params: float, size_beta: float | None, extrapolate: float = 0.0
) -> float:
    """The loss objective: `loss + extrapolate * change - size_beta * ln(params / 1M)`.

    The one rule every reader of a study's loss objective applies (the driver, the pruning rungs,
    fronts, selection, reports). A short proxy run under-credits capacity, which longer training
    rewards: crediting the loss with `size_beta` nats per e-fold of parameters ranks shapes more
    like 10x-longer training. And a curve still falling steeply at its end has further to fall:
    carrying the end loss on by its last evaluation interval's change (`curve_change`, negative
    while it falls) `extrapolate` more times ranked 10x training better again on the development
    calibration sets (docs/accuracy.md, "The loss objective"; `benchmarks/calibration.py` holds the
    measurement). `size_beta` None and `extrapolate` 0 (a study without them): the loss as it is.

    Args:
        loss: the proxy's held-out loss at the end of its run, nats per token.
        change: its last evaluation interval's change (`curve_change`), nats per token.
        params: the shape's total parameters.
        size_beta: nats credited per e-fold of parameters, >= 0; None: size is not credited.
        extrapolate: how many more last intervals the loss is carried on by, >= 0.

    Raises:
        ValueError: `params` is not positive (with a size beta), or `size_beta` or `extrapolate`
            is negative or not finite.
    """
    value = loss
    if extrapolate:
        if not (math.isfinite(extrapolate) and extrapolate >= 0):
            raise ValueError(f"extrapolate must be a finite number >= 0, got {extrapolate}")
        value += extrapolate * change
    if size_beta is None:
        return value
    if not (math.isfinite(size_beta) and size_beta >= 0):
        raise ValueError(f"beta must be a finite number >= 0, got {size_beta}")
    if not params > 0:
        raise ValueError(f"the parameter count must be > 0, got {params}")
    return value - size_beta * math.log(params / PARAMS_UNIT)


def curve_change(curve: Sequence[Sequence[float]]) -> float:
    """The last evaluation interval's change of a held-out curve of (tokens, loss) points: the loss
    at the last evaluation minus the one before it (negative while the loss falls); 0 with fewer
    than 2 points. Non-finite points are left out, as storage leaves them out of stored curves,
    so a curve and its stored copy have one change."""
    losses = [float(loss) for _, loss in curve if math.isfinite(float(loss))]
    return losses[-1] - losses[-2] if len(losses) >= 2 else 0.0


@dataclass(frozen=True)
class LossRule:
    """A study's loss objective (`loss_objective`): its `[objectives]` size_beta and extrapolate.

    The default rule is the proxy loss as it is (`plain`).
    """

    size_beta: float | None = None
    extrapolate: float = 0.0

    def __post_init__(self) -> None:
        loss_objective(0.0, 0.0, PARAMS_UNIT, self.size_beta, self.extrapolate)  # raises ValueError

    @property
    def plain(self) -> bool:
        """Whether the objective is the proxy loss as it is."""
        return self.size_beta is None and not self.extrapolate

    def value(self, loss: float, change: float | None, params: float) -> float:
        """The objective of one trial; a `change` None (a row from before the change was stored,
        without a stored curve) counts as 0."""
        return loss_objective(loss, change or 0.0, params, self.size_beta, self.extrapolate)

    def formula(self) -> str:
        """The rule as a reader sees it: "loss + 2 x change - 0.1500 ln(params / 1M)"."""
        terms = ["loss"]
        if self.extrapolate:
            terms.append(f"+ {self.extrapolate:g} x change")
        if self.size_beta is not None:
            terms.append(f"- {self.size_beta:.4f} ln(params / 1M)")
        return " ".join(terms)


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
        why = f"unknown objective {quoted(unknown[0])}; " if unknown else ""
        given = ",".join(names) if names else text if isinstance(text, str) else ""
        raise ArchsearchError(
            f"{why}objectives {quoted(given, 80)} must be loss then one or two of "
            f"{', '.join(others)}, each once (e.g. loss,flops or loss,flops,step_time)"
        )
    return names
