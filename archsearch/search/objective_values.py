"""A trial's values for Optuna, in the spec's objective order: its measured outcome (or stored
row) with the exact costs of its shape and, under a modelled [serve] scenario, its serving times."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from archsearch.space.costs import flop_counts, kv_cache_bytes_per_token, param_counts
from archsearch.space.objectives import curve_change
from archsearch.trial import COMPLETE, TrialOutcome

if TYPE_CHECKING:
    from archsearch.search.spec import SearchSpec
    from archsearch.space.config import ArchConfig
    from archsearch.storage import TrialRecord


def unusable_objectives(outcome: TrialOutcome) -> str:
    """Why a complete outcome cannot be told to Optuna (`objective_values` gave None)."""
    loss = (outcome.train or {}).get("val_loss")
    if loss is not None and not math.isfinite(loss):
        return f"non-finite loss: the proxy loss is {loss}"
    step_time = outcome.step_time_s
    if step_time is not None and not math.isfinite(step_time):
        return f"non-finite step time: {step_time}"
    return "an objective is missing"


def with_serve_times(spec: SearchSpec, cfg: ArchConfig, outcome: TrialOutcome) -> TrialOutcome:
    """A complete outcome with its serving times, modelled under the spec's [serve] scenario when
    its device is a catalogued GPU (pure and instant: the driver computes them, no worker)."""
    serve = spec.serve
    if outcome.status != COMPLETE or serve is None or not serve.modelled:
        return outcome
    from archsearch.evaluators.hardware_serving import scenario_report

    report = scenario_report(cfg, serve)
    return replace(outcome, prefill_time_s=report.prefill.time_s, decode_time_s=report.decode.time_s)


def objective_values(
    spec: SearchSpec, record: TrialRecord | TrialOutcome, cfg: ArchConfig
) -> list[float] | None:
    """The Optuna values of a complete trial in the spec's objective order, or None if any is missing.

    The loss is the spec's loss objective (`spec.loss_rule`, `objectives.loss_objective`): the
    proxy loss, extrapolated by its curve's last change and credited for size as the spec says;
    the trial's row keeps the proxy loss as measured.
    """
    if isinstance(record, TrialOutcome):
        train = record.train or {}
        loss, change = train.get("val_loss"), curve_change(train.get("val_curve") or ())
        step_time, prefill, decode = record.step_time_s, record.prefill_time_s, record.decode_time_s
    else:
        loss, change, step_time = record["loss"], record["loss_change"], record["step_time_s"]
        prefill, decode = record["prefill_time_s"], record["decode_time_s"]
    if loss is not None:
        loss = spec.loss_rule.value(loss, change, param_counts(cfg).total)
    by_name = {
        "loss": loss,
        "flops": float(flop_counts(cfg).forward),
        "step_time": step_time,
        "kv_bytes": float(kv_cache_bytes_per_token(cfg)),
        "prefill_time": prefill,
        "decode_time": decode,
    }
    values = [by_name[name] for name in spec.objectives]
    if any(v is None or not math.isfinite(v) for v in values):
        return None
    return [float(v) for v in values]
