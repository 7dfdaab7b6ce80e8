"""What serving a shape costs, on the command line: `archsearch profile --serve` (modelled on a
catalogued GPU or measured on the device at hand with the local model's prediction beside it) and
the serving lines of `export --scale-to` (the scaled shape modelled under the study's scenario).

`profile` and `export` parse their options and hand over here, so the serving output lives in one
module of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from archsearch.cli.common import print_json, si, stdout
from archsearch.space.config import ArchConfig

if TYPE_CHECKING:
    from archsearch.results.scale_ranking import ScaledServe

PARTS = (  # ServeTime fields shown in the breakdown, in order
    ("weights_read_s", "weights read"),
    ("cache_read_s", "cache read"),
    ("compute_s", "compute"),
    ("other_memory_s", "other memory"),
    ("launch_s", "launches"),
    ("floor_s", "floor"),
)


def serve_profile(
    cfg: ArchConfig,
    device: str,
    batch: int,
    context: int,
    dtype: str,
    as_json: bool,
    min_run_time: float,
    memory_bytes: int | None = None,
) -> None:
    """Print prefill of `batch` prompts of `context` tokens and one decode step over `context`
    cached tokens: modelled on a catalogued GPU, else measured here (with the prediction); with
    `memory_bytes` (else a modelled GPU's memory), the largest batch that fits it, and on a
    modelled GPU the decode step at that batch.

    Raises:
        ConfigError: bad device, batch or context. ServeError, UnknownNameError: bad dtype.
        DeviceError, ProfilerError: a local device or dtype this machine does not have.
    """
    from archsearch.errors import ConfigError
    from archsearch.evaluators.hardware import check_device, modelled_dtype
    from archsearch.evaluators.hardware_serving import resolve_scenario
    from archsearch.space.costs import DTYPE_BYTES
    from archsearch.space.serve import ServeScenario, serve_costs

    modelled = check_device(device)
    storage_dtype = modelled_dtype(dtype) if modelled else dtype
    if storage_dtype != "auto" and storage_dtype not in DTYPE_BYTES:
        raise ConfigError(f"--dtype {dtype!r} is unknown; valid: auto, {', '.join(DTYPE_BYTES.names())}")
    out: dict[str, Any] = {"config": cfg.to_dict(), "batch": batch, "context": context, "modelled": modelled}
    if modelled:
        out |= _modelled(cfg, device, batch, context, storage_dtype)
    else:
        out |= _measured(cfg, device, batch, context, dtype, min_run_time)
    scenario = ServeScenario(
        batch=batch, prompt_len=context, gen_len=1, weight_dtype=out["dtype"], cache_dtype=out["dtype"],
        device=device if modelled else "local", memory_bytes=memory_bytes,
    )  # fmt: skip
    costs = serve_costs(cfg, resolve_scenario(scenario))
    out["costs"] = costs.to_dict()
    if modelled and costs.max_batch:
        from archsearch.evaluators.hardware import device_model
        from archsearch.evaluators.hardware_serving import predict_decode

        at_max = predict_decode(
            device_model(device), cfg, costs.max_batch, context, out["dtype"], out["dtype"]
        )
        out["decode_at_max_batch"] = at_max.to_dict()
    if as_json:
        print_json(out)
        return
    _print(cfg, out)


def _modelled(cfg: ArchConfig, device: str, batch: int, context: int, dtype: str) -> dict[str, Any]:
    from archsearch.evaluators.hardware import device_model
    from archsearch.evaluators.hardware_serving import predict_decode, predict_prefill

    model = device_model(device)
    prefill = predict_prefill(model, cfg, batch, context, dtype, dtype)
    decode = predict_decode(model, cfg, batch, context, dtype, dtype)
    return {
        "device": {"key": device, "name": model.device.name},
        "dtype": dtype,
        "prefill_time_s": prefill.time_s,
        "decode_time_s": decode.time_s,
        "decode_tokens_per_s": decode.tokens_per_second,
        "prefill": prefill.to_dict(),
        "decode": decode.to_dict(),
    }


def _measured(
    cfg: ArchConfig, device: str, batch: int, context: int, dtype: str, min_run_time: float
) -> dict[str, Any]:
    from archsearch.evaluators.serve_profiler import local_serve_model, measure_serve

    measured = measure_serve(cfg, device, batch, context, dtype, min_run_time, cuda_graph=True)
    out = {
        "device": measured.device,
        "dtype": measured.dtype,
        "prefill_time_s": measured.prefill_time_s,
        "decode_time_s": measured.decode_time_s,
        "decode_tokens_per_s": batch / measured.decode_time_s,
        "measured": measured.to_dict(),
        "predicted": None,  # a local GPU has no local model yet
    }
    if measured.device["type"] != "cpu":
        return out
    local = local_serve_model(device, measured.dtype)
    prefill, decode = local.predict(cfg, measured)
    return out | {
        "predicted": {
            "prefill_time_s": prefill.time_s,
            "decode_time_s": decode.time_s,
            "local_model": local.to_dict(),
            "prefill": prefill.to_dict(),
            "decode": decode.to_dict(),
        },
    }


def _print(cfg: ArchConfig, out: dict[str, Any]) -> None:
    console = stdout()
    how = "modelled" if out["modelled"] else "measured"
    console.print(
        f"{cfg.describe()}\nserving {how} on {out['device']['name']}, {out['dtype']}, "
        f"batch {out['batch']}, context {out['context']}"
    )
    console.print(_costs_line(out["costs"]))
    if out["costs"]["max_batch"] == 0:
        limit = si(out["costs"]["memory_limit"], "B")
        console.print(f"not one sequence of {out['context'] + 1:,} tokens fits {limit} beside the weights")
    breakdowns = out if out["modelled"] else out["predicted"]
    if breakdowns is None:  # measured on a GPU: no local model to print beside it
        graph = out["measured"]["decode_graph_time_s"]
        console.print(
            f"prefill {si(out['prefill_time_s'], 's')}, decode {si(out['decode_time_s'], 's')}/token"
            + (f" eager, {si(graph, 's')}/token from a CUDA graph" if graph else "")
        )
        return
    title = "modelled" if out["modelled"] else "predicted"
    cols = ["phase", *(["measured"] if not out["modelled"] else []), title, "tokens/s"]
    table = Table(*cols, *(name for _, name in PARTS), "x floor", "bound")
    for phase in ("prefill", "decode"):
        t = breakdowns[phase]
        seconds = out[f"{phase}_time_s"]  # measured here, else the model's
        measured = [] if out["modelled"] else [si(seconds, "s")]
        table.add_row(
            phase, *measured, si(t["time_s"], "s"), f"{t['batch'] * t['tokens'] / seconds:,.0f}",
            *(si(t[key], "s") for key, _ in PARTS), f"{t['floor_ratio']:.2f}", t["bound"],
        )  # fmt: skip
    console.print(table)
    at_max = out.get("decode_at_max_batch")
    if at_max is not None:
        console.print(
            f"decode at the largest batch, {at_max['batch']}: {si(at_max['time_s'], 's')} per step, "
            f"{at_max['tokens_per_second']:,.0f} tokens/s"
        )


def _costs_line(costs: dict[str, Any], sequence: tuple[int, int] | None = None) -> str:
    """The exact memory figures (`ServeCosts.to_dict()`) as one line; with `sequence`, (bytes,
    tokens), one sequence's cache at the scenario's context too."""
    limit = costs["memory_limit"]
    fits = "" if limit is None else f"; largest batch in {si(limit, 'B')}: {costs['max_batch']}"
    one = "" if sequence is None else f" {si(sequence[0], 'B')} per sequence at {sequence[1]:,} tokens,"
    return (
        f"KV cache {si(costs['kv_bytes_per_token'], 'B')}/token,{one} {si(costs['kv_bytes'], 'B')} for the "
        f"batch; weights {si(costs['weight_bytes'], 'B')}{fits}"
    )


# --- `export --scale-to`: the scaled shape under a serving scenario ------------------------------
# The flags change the study's [serve] table field by field (`results.scale_ranking.study_scenario`);
# export's own --batch and --device are the training micro-batch and GPU the shape is scaled for.


def _help(what: str, default: str) -> str:
    return f"With --scale-to: {what} (default: the study's \\[serve] value, else {default})."


ServeBatchOpt = Annotated[
    int | None, typer.Option("--serve-batch", help=_help("sequences decoded together", "1"), min=1)
]
PromptLenOpt = Annotated[int | None, typer.Option(help=_help("tokens prefilled per sequence", "512"), min=1)]
GenLenOpt = Annotated[int | None, typer.Option(help=_help("tokens generated per sequence", "128"), min=1)]
WeightDtypeOpt = Annotated[
    str | None, typer.Option(help=_help("weights in serving: fp32, bf16, fp16 or fp8", "bf16"))
]
CacheDtypeOpt = Annotated[str | None, typer.Option(help=_help("the KV cache's dtype", "bf16"))]
ServeDeviceOpt = Annotated[
    str | None,
    typer.Option(
        "--serve-device",
        help=_help(
            "the catalogued GPU serving is modelled on; local is measured, so --device stands in", "--device"
        ),
    ),
]
MemoryOpt = Annotated[
    str | None,
    typer.Option(help=_help('the server\'s memory limit, e.g. "40GB"', "the serving GPU's memory")),
]
SERVE_FLAGS = {  # ServeScenario field -> the export flag that sets it
    "batch": "--serve-batch", "prompt_len": "--prompt-len", "gen_len": "--gen-len",
    "weight_dtype": "--weight-dtype", "cache_dtype": "--cache-dtype", "device": "--serve-device",
    "memory_bytes": "--memory",
}  # fmt: skip


def serve_changes(scaling: bool, values: dict[str, Any]) -> dict[str, Any]:
    """The serving flags given (`values` by `ServeScenario` field, None when absent), each checked
    before the database is opened.

    Raises:
        ConfigError: a flag without --scale-to, or a bad value (one line naming the flag).
    """
    from archsearch.errors import ConfigError
    from archsearch.evaluators.hardware_serving import resolve_scenario
    from archsearch.space.serve import ServeError, ServeScenario
    from archsearch.units import parse_bytes

    changes = {field: value for field, value in values.items() if value is not None}
    if changes and not scaling:
        raise ConfigError(f"{', '.join(SERVE_FLAGS[f] for f in changes)} only go with --scale-to")
    if "memory_bytes" in changes:
        changes["memory_bytes"] = parse_bytes(changes["memory_bytes"], "--memory")
    for field, value in changes.items():
        try:
            resolve_scenario(ServeScenario(**{field: value}))  # the device: at hand or catalogued
        except ServeError as exc:
            raise ServeError(f"{SERVE_FLAGS[field]}: {exc}") from None
    return changes


def print_scaled_serve(serve: ScaledServe, target: str) -> None:
    """The scaled shape's serving figures on stdout (a local scenario's stand-in GPU on stderr)."""
    s, costs, report = serve.scenario, serve.costs, serve.report
    if serve.instead_of is not None:
        typer.echo(
            f"note: serving on {serve.instead_of!r} is measured, and the {target} shape is not built here: "
            f"modelled on {s.device} (--device) instead; --serve-device names another catalogued GPU",
            err=True,
        )
    working = f", {si(s.working_bytes, 'B')} working memory" if s.working_bytes else ""
    prefill, decode, at_max = report.prefill, report.decode, report.decode_at_max_batch
    lines = [
        f"serving modelled on {serve.device_name}: batch {s.batch}, prompt {s.prompt_len:,} + "
        f"{s.gen_len:,} generated, {s.weight_dtype} weights, {s.cache_dtype} cache{working}",
        "  " + _costs_line(costs.to_dict(), (serve.kv_bytes_per_sequence, s.context)),
        f"  prefill {si(prefill.time_s, 's')} ({prefill.tokens_per_second:,.0f} tokens/s); decode "
        f"{si(decode.time_s, 's')}/token mid-generation ({decode.tokens_per_second:,.0f} tokens/s for the "
        f"batch, {decode.floor_ratio:.2f}x its floor, {decode.bound}-bound)",
    ]
    limit = si(s.memory_limit or 0, "B")
    if at_max is not None:
        lines.append(
            f"  at the largest batch, {at_max.batch}: decode {si(at_max.time_s, 's')}/step, "
            f"{at_max.tokens_per_second:,.0f} tokens/s"
        )
    elif costs.max_batch == 0:
        beside = "the weights" + (" and working memory" if s.working_bytes else "")
        lines.append(f"  not one sequence of {s.context:,} tokens fits {limit} beside {beside}")
    if costs.max_batch and not costs.fits:
        lines.append(f"  the scenario's batch of {s.batch} does not fit {limit}")
    typer.echo("\n".join(lines))
