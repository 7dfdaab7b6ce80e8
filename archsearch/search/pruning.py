"""Multi-objective successive halving: stop a proxy run early when it is clearly dominated.

Optuna's pruners raise in multi-objective studies (`Trial.report`) and Ray's schedulers take one
metric (docs/explanations/stack-pitfalls.md), so archsearch prunes on its own. The rule, at each
rung (a fraction of the proxy budget):

- Only trials that reached the same rung are compared, on (held-out loss at the rung, forward
  FLOPs per token): both lower is better, and the FLOPs are exact, so a cheap model is never
  stopped for a loss that a model many times its cost beats.
- A running trial is stopped when at least `ceil(n / reduction_factor)` of the n earlier trials
  at that rung dominate it. In one objective this is successive halving's rule (keep the best
  1/eta); with two objectives, every trial on or near the Pareto front of the rung survives.
- Nothing is stopped until `min_trials` trials reached the rung, so early noise cannot prune.

The decision depends on which trials reached the rung first, so with parallel workers it depends
on timing; the loss a pruned trial reached and its rung are recorded with the trial.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_REDUCTION_FACTOR = 3  # Hyperband's default eta: keep about the best third at each rung


@dataclass(frozen=True)
class RungEntry:
    number: int
    loss: float
    flops: float


def dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """Whether `a` is no worse than `b` everywhere and better somewhere (all minimised)."""
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(x < y for x, y in zip(a, b, strict=True))


def rung_at(rungs: Sequence[float], fraction: float) -> int | None:
    """Index of the highest of `rungs` that a run which has done `fraction` of its budget reached."""
    reached = [i for i, r in enumerate(rungs) if fraction >= r - 1e-9]  # evaluation points are k / n
    return reached[-1] if reached else None


class MultiObjectiveHalving:
    """The pruning state of one study: which trials reached which rung with what loss.

    Args:
        rungs: increasing fractions of the proxy budget in (0, 1) at which trials are judged.
        min_trials: trials that must have reached a rung before any is pruned there.
        reduction_factor: eta; a trial survives a rung unless `ceil(n / eta)` of the n trials
            before it there dominate it.
    """

    def __init__(
        self,
        rungs: tuple[float, ...],
        min_trials: int = 4,
        reduction_factor: float = DEFAULT_REDUCTION_FACTOR,
    ) -> None:
        if any(not 0 < r < 1 for r in rungs) or list(rungs) != sorted(set(rungs)):
            raise ValueError(f"rungs must be increasing fractions in (0, 1), got {rungs}")
        if min_trials < 1 or reduction_factor <= 1:
            raise ValueError("min_trials must be >= 1 and reduction_factor > 1")
        self.rungs = tuple(rungs)
        self.min_trials = min_trials
        self.reduction_factor = reduction_factor
        self._seen: list[dict[int, RungEntry]] = [{} for _ in rungs]

    def rung_at(self, fraction: float) -> int | None:
        """The highest rung a run that has done `fraction` of its budget has reached, if any."""
        return rung_at(self.rungs, fraction)

    def record(self, number: int, rung: int, loss: float, flops: float) -> None:
        """Remember a trial's loss at a rung (also used to restore a resumed study's history)."""
        if math.isfinite(loss):
            self._seen[rung].setdefault(number, RungEntry(number, loss, flops))

    def decide(self, number: int, rung: int, loss: float, flops: float) -> str | None:
        """Judge a trial at a rung, then record it. Returns the reason to prune it, or None.

        A non-finite loss is always pruned: the run is diverging.
        """
        if not math.isfinite(loss):
            return f"loss {loss} at rung {self.rungs[rung]:g}"
        others = [e for n, e in self._seen[rung].items() if n != number]
        self.record(number, rung, loss, flops)
        if len(others) < self.min_trials:
            return None
        needed = math.ceil(len(others) / self.reduction_factor)
        better = [e for e in others if dominates((e.loss, e.flops), (loss, flops))]
        if len(better) < needed:
            return None
        best = min(better, key=lambda e: e.loss)
        return (
            f"dominated at rung {self.rungs[rung]:g} of the proxy budget by {len(better)} of "
            f"{len(others)} trials (loss {loss:.4f}; e.g. trial {best.number}: loss {best.loss:.4f} "
            f"at {best.flops / flops:.2f}x the FLOPs)"
        )

    def size(self, rung: int) -> int:
        return len(self._seen[rung])
