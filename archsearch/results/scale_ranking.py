"""A trial's design at the size the user will train: candidates ranked by modelled step time.

`space.scale_candidates.scaled_candidates` lists the shapes near the target size that keep the trial's
choices; here each is scored with the roofline model of a catalogued GPU
(`evaluators.hardware.predict_step` over `evaluators.step_kernels.step_kernels`) and the pick is:
1. the candidates closest to the target: within `band` of it, or the nearest one's distance when
   none is that close (a smaller model is always faster, so speed only ranks equal sizes);
2. among those, the most modelled tokens/s.
Then each alignment choice of the pick is priced against naive rounding (vocab padding, d_ff
rounded up to a tile multiple, d_model a multiple of 128), one dimension at a time.

All numbers are modelled: the step is the sum of its kernels on one stream plus the framework
overhead of the kernels an eager step launches, where the device has constants fitted to real
steps (`catalogue.FITTED`: the H100, whose eager steps ran 1.4-5.6x their kernel sums).

With a serving scenario (the study's [serve] table, changed by `export`'s serving flags) the
scaled shape is priced as a search prices a trial: its exact memory (`space.serve.serve_costs`)
and its prefill and decode modelled on the scenario's catalogued GPU
(`evaluators.hardware_serving.scenario_report`). A scenario on the device at hand (`local`) is measured,
and the scaled shape is not built here, so it is modelled on the device the shape was scaled for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from archsearch.errors import ArchsearchError
from archsearch.space.config import ArchConfig
from archsearch.space.costs import (
    TRAIN_STATE_BYTES_PER_PARAM,
    flop_counts,
    param_counts,
    train_activation_bytes_per_token,
)
from archsearch.space.scale_candidates import naive_d_ff, naive_d_model, pad_vocab, scaled_candidates

if TYPE_CHECKING:
    from archsearch.evaluators.hardware import DeviceModel
    from archsearch.evaluators.hardware_serving import ServeReport
    from archsearch.search.selection import Choice, ExportPlan, Selection
    from archsearch.space.serve import ServeCosts, ServeScenario
    from archsearch.storage import StudyRecord

DTYPE = "bf16"  # what training runs in on every catalogued GPU
MICRO_BATCH_TOKENS = 16384  # batch * seq_len per micro-batch: 8 x 2048, a common 1B-class setting
DEFAULT_SEQ_LEN = 2048  # GPT-3, OPT, Pythia and TinyLlama pretrain 1B-class models at 2048
# Measured on an H100 SXM (eager PyTorch, bf16): a real step over its kernel sum, for GPT-2-sized
# and 1B shapes (docs/explanations/hardware-costs.md).
EAGER_OVER_KERNEL_SUM = (1.4, 1.9)
# The largest target scaled: 5x the largest dense models trained (~2T). Each candidate is scored
# (~1 ms); 10T has ~9,000 candidates, 1P ~200,000: minutes with no output for no real use.
MAX_TARGET_PARAMS = 10**13


@dataclass(frozen=True)
class ScaleRequest:
    """The size, device and data a scaled shape is for.

    Raises:
        ArchsearchError: a non-positive size, one past `MAX_TARGET_PARAMS`, an unknown device (the
            message lists them).
    """

    target_params: int
    device: str  # a catalogued GPU (evaluators.catalogue.ACCELERATORS)
    seq_len: int = DEFAULT_SEQ_LEN
    vocab_size: int | None = None  # a real tokenizer's vocabulary, padded; None: the trial's
    batch: int | None = None  # sequences per micro-batch; None: MICRO_BATCH_TOKENS worth
    tolerance: float = 0.1  # candidates within this fraction of the target
    band: float = 0.02  # "closest to the target": within this fraction

    def __post_init__(self) -> None:
        from archsearch.evaluators.catalogue import ACCELERATORS

        for name in ("target_params", "seq_len", "vocab_size", "batch"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ArchsearchError(f"{name} must be a positive integer, got {value!r}")
        if self.target_params > MAX_TARGET_PARAMS:
            from archsearch.units import format_si

            most = format_si(MAX_TARGET_PARAMS)
            raise ArchsearchError(
                f"--scale-to {format_si(self.target_params)} parameters is past {most}, the largest size "
                "scaled to (dense models trained so far reach about 2T)"
            )
        ACCELERATORS[self.device]  # UnknownNameError lists the catalogue

    @property
    def micro_batch(self) -> int:
        return self.batch if self.batch is not None else max(1, MICRO_BATCH_TOKENS // self.seq_len)


@dataclass(frozen=True)
class Scored:
    """One shape's modelled training step on the device."""

    config: ArchConfig
    params: int  # exact, param_counts(config).total
    step_time_s: float  # modelled kernel sum of one micro-batch step
    tokens_per_second: float
    mfu: float  # causal training FLOPs per token * tokens/s over the device's dense bf16 peak


@dataclass(frozen=True)
class AlignmentGain:
    """What one alignment choice gained: the chosen shape with that width naive, and aligned."""

    dimension: str  # "vocab_size", "d_ff" or "d_model"
    naive: int
    aligned: int
    naive_step_s: float
    aligned_step_s: float

    @property
    def gain_pct(self) -> float:
        """Step time saved by the aligned value, % of the naive step (positive: faster)."""
        return 100 * (self.naive_step_s - self.aligned_step_s) / self.naive_step_s


@dataclass(frozen=True)
class ScaledServe:
    """What serving the scaled shape costs under a scenario, modelled on a catalogued GPU."""

    scenario: ServeScenario  # resolved: a catalogued GPU, whose memory is the limit unless stated
    device_name: str
    costs: ServeCosts  # exact: KV bytes per token and at the context, weights, the largest batch
    report: ServeReport  # modelled: prefill, decode at the scenario's batch and the largest one
    instead_of: str | None  # the local device the scenario named, modelled on `scenario.device`

    @property
    def kv_bytes_per_sequence(self) -> int:
        """One sequence's cache at the scenario's context (prompt plus generated)."""
        return self.costs.kv_bytes // self.scenario.batch

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the scenario, its device, and the figures under their plain names
        (`kv_bytes_per_token`, `weight_bytes`, `max_batch`, `prefill_time_s`, `decode_time_s`, ...)."""
        s = self.scenario
        return {
            "scenario": s.to_dict(),
            "device": {"key": s.device, "name": self.device_name},
            "modelled_instead_of": self.instead_of,
            "context": s.context,
            "kv_bytes_per_sequence": self.kv_bytes_per_sequence,
            **self.report.to_dict(),
            **self.costs.to_dict(),
        }


def study_scenario(study: StudyRecord, changes: Mapping[str, Any], device: str) -> ServeScenario | None:
    """The scenario a scaled export is priced under: the study's [serve] table with `changes`
    (`ServeScenario` fields) over it; where the study has none, the defaults on `device` (the GPU
    the shape is scaled for); None without either.

    A study's stored scenario holds its GPU's memory as the limit when the table stated none; a
    new device without a new limit takes the new GPU's memory instead of the old one's.

    Raises:
        ServeError: a changed field breaks a rule.
    """
    from archsearch.evaluators.catalogue import ACCELERATORS
    from archsearch.space.serve import ServeScenario

    stored = study.spec.get("space", {}).get("serve")
    if stored is None and not changes:
        return None
    base = ServeScenario(**stored) if stored is not None else ServeScenario(device=device)
    changes = dict(changes)
    if "device" in changes and "memory_bytes" not in changes and base.device in ACCELERATORS:
        if base.memory_bytes == ACCELERATORS[base.device].memory_bytes:
            changes["memory_bytes"] = None
    return base.replace(**changes)


def scaled_serve(cfg: ArchConfig, scenario: ServeScenario, device: str) -> ScaledServe:
    """`cfg` served under `scenario`, on its catalogued GPU, or on `device` when the scenario's is
    the one at hand (measured, so not at a size that is not built here).

    Raises:
        ServeError: the scenario's device is not catalogued.
        UnknownNameError: the device has no peak for the weights' dtype.
    """
    from archsearch.evaluators.catalogue import ACCELERATORS
    from archsearch.evaluators.hardware_serving import resolve_scenario, scenario_report
    from archsearch.space.serve import serve_costs

    instead_of = scenario.device if scenario.local else None
    s = resolve_scenario(scenario.replace(device=device) if instead_of else scenario)
    name = ACCELERATORS[s.device].name
    return ScaledServe(s, name, serve_costs(cfg, s), scenario_report(cfg, s), instead_of)


@dataclass(frozen=True)
class ScaleResult:
    source: ArchConfig  # the trial's shape
    request: ScaleRequest
    device_name: str
    peak_flops: float  # the MFU denominator: dense bf16 peak, from the catalogue
    memory_bytes: int  # the device's memory, from the catalogue (0: not stated)
    chosen: Scored
    closest: tuple[Scored, ...]  # the candidates the pick was made among, fastest first
    considered: int  # candidates within the tolerance, all scored
    gains: tuple[AlignmentGain, ...]
    serve: ScaledServe | None = None  # the chosen shape's serving costs, with a scenario

    @property
    def eager_mfu_range(self) -> tuple[float, float]:
        """The MFU a real eager step would reach if it ran 1.9x to 1.4x its kernel sum."""
        low, high = EAGER_OVER_KERNEL_SUM
        return self.chosen.mfu / high, self.chosen.mfu / low

    @property
    def activation_bytes(self) -> int:
        """What the chosen shape's micro-batch keeps for its backward (bf16, flash attention)."""
        cfg = self.chosen.config
        return self.request.micro_batch * cfg.seq_len * train_activation_bytes_per_token(cfg, DTYPE)

    @property
    def state_bytes(self) -> int:
        """Weights, gradients and Adam moments of the chosen shape, unsharded."""
        return TRAIN_STATE_BYTES_PER_PARAM * self.chosen.params

    def memory_notes(self) -> list[str]:
        """What does not fit the device: the micro-batch's activations alone (no sharding helps:
        lower the micro-batch or recompute), or the optimizer state beside them (shard it)."""
        if not self.memory_bytes:  # a device the catalogue states no memory for
            return []
        free = self.memory_bytes - self.activation_bytes
        gb = 1e9
        if free <= 0:
            per_sequence = self.activation_bytes // self.request.micro_batch
            fits = self.memory_bytes // per_sequence
            activations = self.activation_bytes / gb
            return [
                f"micro-batch {self.request.micro_batch:,}'s activations ({activations:,.1f} GB) "
                f"are over the device's {self.memory_bytes / gb:.0f} GB: "
                + (
                    f"give --batch {fits} or less"
                    if fits
                    else "not one sequence fits; give a shorter --seq-len"
                )
                + ", or recompute activations"
            ]
        if self.state_bytes > free:
            shards = -(-self.state_bytes // free)
            return [
                f"weights, gradients and Adam state ({self.state_bytes / gb:,.1f} GB) fit beside the "
                f"activations when sharded over {shards} or more GPUs (FSDP, ZeRO)"
            ]
        return []

    def provenance(self) -> dict[str, Any]:
        """The JSON-ready record of the scaling, for export provenance."""
        return {
            "target_params": self.request.target_params,
            "device": self.request.device,
            "seq_len": self.request.seq_len,
            "vocab_size": self.chosen.config.vocab_size,
            "micro_batch": self.request.micro_batch,
            "modelled_step_time_s": self.chosen.step_time_s,
            "modelled_tokens_per_second": self.chosen.tokens_per_second,
            "modelled_mfu": self.chosen.mfu,
            "activation_bytes": self.activation_bytes,
            "optimizer_state_bytes": self.state_bytes,
            "candidates_scored": self.considered,
            "alignment_gains": [{**dataclasses.asdict(g), "gain_pct": g.gain_pct} for g in self.gains],
            **({"serve": self.serve.to_dict()} if self.serve is not None else {}),
        }


def score(model: DeviceModel, cfg: ArchConfig, batch: int) -> Scored:
    """`cfg`'s modelled training step on `batch` sequences."""
    from archsearch.evaluators.counting import eager_host_ops, eager_kernel_count, eager_memory_ops
    from archsearch.evaluators.hardware import predict_step
    from archsearch.evaluators.step_kernels import step_kernels

    inventory = step_kernels(cfg, batch, DTYPE, eager_memory_ops(cfg, batch, DTYPE))
    report = predict_step(model, inventory, DTYPE, eager_kernel_count(cfg), eager_host_ops(cfg))
    tokens_per_second = report.tokens_per_second
    mfu = flop_counts(cfg).train_causal * tokens_per_second / model.device.peak_flops(DTYPE)
    return Scored(cfg, param_counts(cfg).total, report.step_time_s, tokens_per_second, mfu)


def scale_config(cfg: ArchConfig, request: ScaleRequest) -> ScaleResult:
    """The shape that keeps `cfg`'s design at `request.target_params`, fastest on the device.

    Raises:
        ArchsearchError: no shape keeps the design within the tolerance of the target.
    """
    from archsearch.evaluators.hardware import device_model

    model = device_model(request.device)
    batch = request.micro_batch
    vocab = pad_vocab(request.vocab_size) if request.vocab_size is not None else cfg.vocab_size
    target = request.target_params
    shapes = scaled_candidates(
        cfg, target, seq_len=request.seq_len, vocab_size=vocab, tolerance=request.tolerance
    )
    if not shapes:
        raise ArchsearchError(
            f"no shape keeping the trial's design ({cfg.attention_layout}, d_ff/d_model "
            f"{cfg.d_ff_ratio:.3g}) has {target:,} parameters within {request.tolerance:.0%}"
        )
    scored = [score(model, shape, batch) for shape in shapes]
    nearest = min(abs(s.params - target) for s in scored)
    reach = max(request.band * target, nearest)
    # Ties (the attention model prices head_dim 64 and 128 alike) go to larger heads, as 1B-class
    # models use (LLaMA: 128), then to the shallower shape (less sequential).
    closest = sorted(
        (s for s in scored if abs(s.params - target) <= reach),
        key=lambda s: (-s.tokens_per_second, -s.config.head_dim, s.config.n_layers),
    )
    chosen = closest[0]
    return ScaleResult(
        source=cfg,
        request=request,
        device_name=model.device.name,
        peak_flops=model.device.peak_flops(DTYPE),
        memory_bytes=model.device.memory_bytes,
        chosen=chosen,
        closest=tuple(closest),
        considered=len(scored),
        gains=alignment_gains(model, cfg, chosen, request, batch),
    )


def alignment_gains(
    model: DeviceModel, source: ArchConfig, chosen: Scored, request: ScaleRequest, batch: int
) -> tuple[AlignmentGain, ...]:
    """Each aligned width of `chosen` against its naive value, the rest of the shape held."""
    cfg = chosen.config
    naive = {
        "vocab_size": request.vocab_size if request.vocab_size is not None else cfg.vocab_size,
        "d_ff": naive_d_ff(source, cfg.d_model),
        "d_model": naive_d_model(cfg, request.target_params),
    }
    gains = []
    for dimension, value in naive.items():
        if value == getattr(cfg, dimension):
            continue
        naive_shape = dataclasses.replace(cfg, **{dimension: value})
        gains.append(
            AlignmentGain(
                dimension, value, getattr(cfg, dimension), score(model, naive_shape, batch).step_time_s,
                chosen.step_time_s,
            )
        )  # fmt: skip
    return tuple(gains)


def scaled_export(
    selection: Selection, choice: Choice, request: ScaleRequest, serve: ServeScenario | None = None
) -> tuple[ScaleResult, ExportPlan]:
    """The one selected trial scaled by `request`, and the files that export the scaled shape.

    Provenance names the study and trial it is scaled from, the target and the device; its
    results are the scaled shape's exact counts and modelled step (and, with a `serve` scenario,
    its KV bytes per token and modelled prefill and decode, detailed under `scaled.serve`), and
    the trial's own measured results stay under `proxy_results`.

    Raises:
        ArchsearchError: not exactly one trial selected, no shape near the target, the format
            refuses the scaled shape, or the scenario's device is not catalogued.
    """
    from archsearch.search.selection import ExportPlan, trial_provenance
    from archsearch.space.export import EXPORT_FORMATS

    if len(selection.members) != 1 or choice.front:
        raise ArchsearchError("--scale-to scales one trial: give --trial N, --knee or --best-under-flops F")
    (member,) = selection.members
    result = scale_config(member.config, request)
    cfg = result.chosen.config
    if serve is not None:
        result = dataclasses.replace(result, serve=scaled_serve(cfg, serve, request.device))
    export_format = EXPORT_FORMATS[choice.fmt]
    reason = export_format.refusal(cfg)
    if reason is not None:
        raise ArchsearchError(f"trial {member.number} scaled cannot be exported as {choice.fmt}: {reason}")
    provenance = trial_provenance(
        selection.study, member, selection.devices.get(member["device_fingerprint"])
    )
    provenance["proxy_results"] = provenance.pop("results")
    provenance["scaled"] = result.provenance()
    flops = flop_counts(cfg)
    provenance["results"] = {
        "params_total": result.chosen.params,
        "params_non_embedding": param_counts(cfg).non_embedding,
        "flops_forward_per_token": flops.forward,
        "flops_train_per_token": flops.train,
        "tokens_per_second": result.chosen.tokens_per_second,
        "mfu": result.chosen.mfu,
        "step_time_s": result.chosen.step_time_s,
        "step_time_device": f"model:{result.device_name}",
    }
    if result.serve is not None:  # the trial columns' names, as an unscaled export carries them
        provenance["results"] |= {
            "kv_cache_bytes_per_token": result.serve.costs.kv_bytes_per_token,
            "prefill_time_s": result.serve.report.prefill.time_s,
            "decode_time_s": result.serve.report.decode.time_s,
        }
    index = {
        "number": member.number,
        "folder": "",
        "target": export_format.target(cfg),
        "refused": None,
        "notes": list(export_format.notes(cfg)),
    }
    return result, ExportPlan(dict(export_format.files(cfg, provenance)), (index,))
