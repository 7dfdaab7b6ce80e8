"""The trial contract every room shares: the states a trial passes through, and what one
evaluation produced (`TrialOutcome`).

A state is stored as one of these words, told to Optuna by the driver, counted by the CLI and
returned by the trainer and the worker, so the words are defined here once: storage refuses to
write a state not in `STATES`, and `TrialOutcome` an outcome not in `OUTCOMES`. The request a
worker receives is `search.worker.TrialRequest` (it carries the search's own settings, which live
above storage; this module sits beside `errors` and `units`, below every room).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

RUNNING, COMPLETE, PRUNED, FAILED, REJECTED, DUPLICATE, INTERRUPTED = (
    "running",
    "complete",
    "pruned",
    "failed",
    "rejected",
    "duplicate",
    "interrupted",
)

# Each state and what it means, in the order tables list them.
STATES: Mapping[str, str] = {
    RUNNING: "a worker holds its lease and is evaluating it",
    COMPLETE: "trained and profiled; its objectives were told to Optuna",
    PRUNED: "stopped at a rung by the pruner (its reason names the rung)",
    FAILED: "the evaluation failed (NaN loss, out of memory, a crash past its retries); reason recorded",
    REJECTED: "sampled, but not a valid or in-budget shape: nothing was computed",
    DUPLICATE: "a shape the study had evaluated: its result was told to Optuna again, nothing computed",
    INTERRUPTED: "stopped by Ctrl-C, SIGTERM or a dead driver, and re-queued",
}
FINISHED = (COMPLETE, PRUNED, FAILED)  # the states that count towards a search's --trials
OUTCOMES = FINISHED  # what one evaluation ends in (the trainer's run, the worker's trial)
# How a complete trial's (or seed repeat's) reason starts where its run stalled on the unigram
# plateau and was trained again with a longer warm-up (`search.worker.stall_note`).
STALLED = "stalled at the unigram loss"


def retried_for_stalling(reason: str | None) -> bool:
    """Whether a run's stored reason says it stalled and was trained again (`STALLED`): its result
    is the retry's, at the retry's settings."""
    return (reason or "").startswith(STALLED)


def check_state(state: str, allowed: Mapping[str, Any] | tuple[str, ...] = tuple(STATES)) -> str:
    """`state`, if `allowed` holds it.

    Raises:
        ValueError: a state this module does not define (or not one `allowed` here).
    """
    if state not in allowed:
        raise ValueError(f"unknown trial state {state!r}; expected one of {', '.join(allowed)}")
    return state


@dataclass(frozen=True)
class TrialOutcome:
    """What one evaluation produced, in plain data: the worker's result, as the driver records it.

    Attributes:
        status: one of `OUTCOMES` (complete, pruned or failed).
        reason: why it failed or was pruned.
        train: `TrainResult.to_dict()` (None when the worker died before training ended).
        profiles: one dict per device: device ("local" or a catalogue name), modelled, dtype,
            batch, step_time_s, tokens_per_second, report (`ProfileReport.to_dict()`).
        measurements: kernel times measured for this trial: key, fingerprint, dtype, kind, shape,
            seconds (new entries for the shared kernel cache).
        device: `DeviceInfo.to_dict()` of the worker's device.
        step_time_s / step_time_device: the step-time objective and where it comes from.
        pruned_rung: the fraction of the proxy budget at which it was pruned.
        prefill_time_s / decode_time_s: the serving objectives, modelled under the space's
            [serve] scenario (`evaluators.hardware_serving`); None without one.
    """

    status: str
    reason: str | None = None
    train: dict[str, Any] | None = None
    profiles: tuple[dict[str, Any], ...] = ()
    measurements: tuple[dict[str, Any], ...] = ()
    device: dict[str, Any] | None = None
    step_time_s: float | None = None
    step_time_device: str | None = None
    pruned_rung: float | None = None
    prefill_time_s: float | None = None
    decode_time_s: float | None = None

    def __post_init__(self) -> None:
        check_state(self.status, OUTCOMES)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialOutcome:
        values = dict(data)
        for name in ("profiles", "measurements"):
            values[name] = tuple(values.get(name) or ())
        return cls(**values)
