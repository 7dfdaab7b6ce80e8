"""`archsearch profile --serve`: what serving a shape costs, modelled on a catalogued GPU or
measured on the device at hand with the local model's prediction beside it.

`profile` (in `measure`) parses the options and hands over here, so the serving output lives in
one module of its own.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from archsearch.cli.common import print_json, si, stdout
from archsearch.space.config import ArchConfig

PARTS = (  # ServeTime fields shown in the breakdown, in order
    ("weights_read_s", "weights read"),
    ("cache_read_s", "cache read"),
    ("compute_s", "compute"),
    ("other_memory_s", "other memory"),
    ("launch_s", "launches"),
    ("floor_s", "floor"),
)


def serve_profile(
    cfg: ArchConfig, device: str, batch: int, context: int, dtype: str, as_json: bool, min_run_time: float
) -> None:
    """Print prefill of `batch` prompts of `context` tokens and one decode step over `context`
    cached tokens: modelled on a catalogued GPU, else measured here (with the prediction).

    Raises:
        ConfigError: bad device, batch or context. ServeError, UnknownNameError: bad dtype.
        DeviceError, ProfilerError: a local device or dtype this machine does not have.
    """
    from archsearch.errors import ConfigError
    from archsearch.evaluators.hardware import check_device
    from archsearch.evaluators.serving import resolve_scenario
    from archsearch.space.costs import DTYPE_BYTES
    from archsearch.space.serve import ServeScenario, serve_costs

    modelled = check_device(device)
    storage_dtype = "bf16" if dtype == "auto" and modelled else dtype
    if storage_dtype != "auto" and storage_dtype not in DTYPE_BYTES:
        raise ConfigError(f"--dtype {dtype!r} is unknown; valid: auto, {', '.join(DTYPE_BYTES.names())}")
    out: dict[str, Any] = {"config": cfg.to_dict(), "batch": batch, "context": context, "modelled": modelled}
    if modelled:
        out |= _modelled(cfg, device, batch, context, storage_dtype)
    else:
        out |= _measured(cfg, device, batch, context, dtype, min_run_time)
    scenario = ServeScenario(
        batch=batch, prompt_len=context, gen_len=1, weight_dtype=out["dtype"], cache_dtype=out["dtype"],
        device=device if modelled else "local",
    )  # fmt: skip
    costs = serve_costs(cfg, resolve_scenario(scenario))
    out["costs"] = costs.to_dict()
    if modelled and costs.max_batch:
        from archsearch.evaluators.hardware import device_model
        from archsearch.evaluators.serving import predict_decode

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
    from archsearch.evaluators.serving import predict_decode, predict_prefill

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
    costs = out["costs"]
    limit = costs["memory_limit"]
    fits = "" if limit is None else f"; largest batch in {si(limit, 'B')}: {costs['max_batch']}"
    console.print(
        f"KV cache {si(costs['kv_bytes_per_token'], 'B')}/token, {si(costs['kv_bytes'], 'B')} for the "
        f"batch; weights {si(costs['weight_bytes'], 'B')}{fits}"
    )
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
