"""The GPU campaign's part 3 (issue 25 with issue 22): prefill and decode measured on the GPU at hand
against the serving model of its catalogued twin. `gpu_campaign.py --part 3` runs it.

Each shape (LLaMA-style widths 1024-4096, 4-16 layers, MHA / GQA / MQA, head_dim 64 and 128, GPT-2
small, a byte-level shape of examples/gpu.toml) at each scenario (batch and context) is measured by
`serve_profiler.measure_serve` in bf16: the eager prefill of `batch` prompts of `context` tokens,
the eager decode step over caches of `context` tokens, and the same decode step replayed from a
CUDA graph (as serving engines run it). The model predicts each with the ops that call really
dispatched: eager calls at the device's launch overhead per op, the graph at `GRAPH_KERNEL_S`.
Nothing is fitted to these measurements. The issue's target: decode within 15% at the median.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

# (batch, context): one sequence at a short and a long context (bandwidth-bound, the cache's share
# growing), and a batch whose decode reads 16 caches.
SCENARIOS = ((1, 512), (1, 4096), (16, 1024))
SMOKE_SCENARIOS = ((1, 32), (2, 64))
TARGET_MEDIAN = 0.15


def shapes() -> list[tuple[str, Any]]:
    """(label, config): at least 10 shapes, the head layout varied at fixed widths."""
    from archsearch.space import preset
    from archsearch.space.knobs import config_from_knobs as knobs

    llama = dict(activation="swiglu", norm="rmsnorm", pos_embedding="rope", bias=False, tie_embeddings=False)
    d1024 = dict(d_model=1024, n_layers=8, head_dim=64, d_ff=2752, vocab_size=32000, seq_len=4096, **llama)
    d2048 = dict(d_model=2048, n_layers=8, head_dim=128, d_ff=5632, vocab_size=32000, seq_len=4096, **llama)
    d4096 = dict(d_model=4096, n_layers=4, head_dim=128, d_ff=11008, vocab_size=32000, seq_len=4096, **llama)
    return [
        ("s-d1024-mha", knobs(**d1024)),
        ("s-d1024-kv4", knobs(n_kv_heads=4, **d1024)),
        ("s-d1024-mqa", knobs(n_kv_heads=1, **d1024)),
        ("s-d1024-hd128", knobs(**{**d1024, "head_dim": 128})),
        ("s-d2048-mha", knobs(**d2048)),
        ("s-d2048-kv4", knobs(n_kv_heads=4, **d2048)),
        ("s-d2048-kv2", knobs(n_kv_heads=2, **d2048)),
        ("s-d2048-mqa", knobs(n_kv_heads=1, **d2048)),
        ("s-d2048-L16-kv4", knobs(n_kv_heads=4, **{**d2048, "n_layers": 16})),
        ("s-d4096-L4-mha", knobs(**d4096)),
        ("s-d4096-L4-kv8", knobs(n_kv_heads=8, **d4096)),
        ("s-gpt2-small", preset("gpt2-small")),  # learned positions: the proxy makes room for 4096
        ("s-byte-d1024-L8-kv2", knobs(d_model=1024, n_layers=8, head_dim=128, n_kv_heads=2, d_ff=2816,
                                      activation="swiglu", vocab_size=256, seq_len=4096)),
    ]  # fmt: skip


def smoke_shapes() -> list[tuple[str, Any]]:
    from archsearch.space.knobs import config_from_knobs as knobs

    tiny = dict(d_model=64, n_layers=2, head_dim=32, d_ff=256, vocab_size=256, seq_len=128)
    return [("t-d64", knobs(**tiny)), ("t-d128-mqa", knobs(**{**tiny, "d_model": 128, "n_kv_heads": 1}))]


def predict(model: Any, cfg: Any, point: dict[str, Any]) -> dict[str, float | None]:
    """The model's seconds for one measured point, with the ops its calls dispatched and the bytes
    their memory-bound ops moved: as recorded where the record has them, else counted as CUDA runs
    the calls (`serve_profiler.count_serve_calls`; records before 2026-11-28 have no bytes)."""
    from archsearch.evaluators.hardware_serving import GRAPH_KERNEL_S, predict_decode, predict_prefill
    from archsearch.evaluators.serve_profiler import count_serve_calls

    b, c, d = point["batch"], point["context"], point["dtype"]
    eager = model.launch_overhead_s if model.launch_overhead_s is not None else model.device.launch_overhead_s
    counted = count_serve_calls(cfg, b, c, d)
    prefill_bytes = point.get("prefill_memory_bytes") or counted.prefill_memory_bytes
    decode_bytes = point.get("decode_memory_bytes") or counted.decode_memory_bytes
    prefill = predict_prefill(
        model, cfg, b, c, d, d, kernel_s=eager, kernels=point["prefill_ops"], eager=True,
        memory_op_bytes=prefill_bytes,
    )  # fmt: skip
    decode = predict_decode(
        model, cfg, b, c, d, d, kernel_s=eager, kernels=point["decode_ops"], eager=True,
        memory_op_bytes=decode_bytes,
    )  # fmt: skip
    graph = predict_decode(
        model,
        cfg,
        b,
        c,
        d,
        d,
        kernel_s=GRAPH_KERNEL_S,
        kernels=point["decode_ops"],
        memory_op_bytes=decode_bytes,
    )
    engine = predict_decode(model, cfg, b, c, d, d)  # a serving engine's fused kernels: shown, not scored
    return {
        "prefill_s": prefill.time_s, "decode_s": decode.time_s, "decode_graph_s": graph.time_s,
        "decode_engine_s": engine.time_s, "floor_s": graph.floor_s,
    }  # fmt: skip


MEASURED = {  # the model's key: the measurement's
    "prefill_s": "prefill_time_s", "decode_s": "decode_time_s", "decode_graph_s": "decode_graph_time_s",
}  # fmt: skip


def run(args: Any, info: Any, files: Any, budget: Any, record: dict[str, Any] | None) -> dict[str, Any]:
    """Measure every (shape, scenario) not yet in `record` (None: a new record), writing the record
    after each; returns it. Stops before a point that would not end inside `budget`."""
    from archsearch.evaluators.serve_profiler import measure_serve

    table = smoke_shapes() if args.smoke else shapes()
    scenarios = SMOKE_SCENARIOS if args.smoke else SCENARIOS
    dtype = "fp32" if info.type == "cpu" else "bf16"
    if record is None:
        record = {"device": info.to_dict(), "dtype": dtype, "min_run_time": args.min_run_time, "points": []}
    done = {(p["label"], p["batch"], p["context"]) for p in record["points"]}
    done |= {(f["label"], f["batch"], f["context"]) for f in record.setdefault("failed", [])}
    todo = [(label, cfg, b, c) for label, cfg in table for b, c in scenarios if (label, b, c) not in done]
    print(f"part 3: {len(record['points'])} of {len(table) * len(scenarios)} points recorded, {len(todo)} to "
          "measure", flush=True)  # fmt: skip
    files.event("part 3 start", recorded=len(done), to_measure=len(todo))
    for i, (label, cfg, batch, context) in enumerate(todo):
        times = [p["measure_s"] for p in record["points"]]
        expected = 1.25 * max(times) if times else (60.0 if info.type == "cuda" else 5.0)
        if not budget.allows(expected):
            print(f"part 3: budget spent: {len(todo) - i} points left, run again to resume", flush=True)
            files.event("part 3 budget spent", left=len(todo) - i)
            break
        t0 = time.perf_counter()
        try:
            m = measure_serve(cfg, args.device, batch, context, dtype, args.min_run_time, cuda_graph=True)
        except Exception as exc:  # one point's failure (out of memory, say) is recorded; the rest go on
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            record["failed"].append({"label": label, "batch": batch, "context": context, "error": error})
            files.write_json(files.serve, record)
            print(f"part 3: {label} b{batch} ctx{context}: not measured: {error}", flush=True)
            if info.type == "cuda":
                import torch

                torch.cuda.empty_cache()
            continue
        point = {"label": label, "config": cfg.to_dict(), **m.to_dict()}
        point["measure_s"] = time.perf_counter() - t0
        del point["device"]
        record["points"].append(point)
        files.write_json(files.serve, record)
        graph = m.decode_graph_time_s
        print(f"part 3: {label} b{batch} ctx{context}: prefill {m.prefill_time_s * 1e3:.2f} ms, decode "
              f"{m.decode_time_s * 1e3:.3f} ms eager" + (f", {graph * 1e3:.3f} ms graph" if graph else "")
              + (f" ({m.graph_error})" if m.graph_error else ""), flush=True)  # fmt: skip
    else:  # every point measured once: the rounds
        serve_rounds(args, files, budget, record, dtype)
    return record


def _rounds_key(field: str) -> str:
    return field.removesuffix("_s") + "_rounds_s"  # prefill_time_s -> prefill_time_rounds_s


def serve_rounds(args: Any, files: Any, budget: Any, record: dict[str, Any], dtype: str) -> None:
    """Measure every point again, in passes over the whole table, until each has `--serve-rounds`
    timings of each call; each call's time is their median. One timing a point was the H200's
    record of 2026-11-26, whose eager calls drifted with the host: the MQA shape's prefill of 512
    tokens took 6.2 ms, of 4096 tokens 4.1 ms; the same shapes' graph replays agreed within 8%."""
    from archsearch.evaluators.serve_profiler import measure_serve
    from archsearch.space.config import ArchConfig

    for point in record["points"]:  # a point's first measurement is its first round
        point.setdefault("rounds", 1)  # passes over the point, measured or failed
        for field in MEASURED.values():
            if point.get(field) and _rounds_key(field) not in point:
                point[_rounds_key(field)] = [point[field]]
    timed = 0
    for round_ in range(2, args.serve_rounds + 1):
        for point in record["points"]:
            if point["rounds"] >= round_:
                continue
            if not budget.allows(1.25 * point["measure_s"]):
                print(f"part 3: budget spent in round {round_} ({timed} points measured again); run again "
                      "to resume", flush=True)  # fmt: skip
                files.event("part 3 rounds budget spent", timed=timed, round=round_)
                return
            cfg = ArchConfig.from_dict(point["config"])
            try:
                b, c = point["batch"], point["context"]
                m = measure_serve(cfg, args.device, b, c, dtype, args.min_run_time, cuda_graph=True).to_dict()
            except Exception as exc:  # an OOM now: the timings recorded stand
                print(f"part 3: {point['label']}: round {round_} not measured: {str(exc).splitlines()[0]}")
                m = {}
            for field in MEASURED.values():
                if m.get(field) and _rounds_key(field) in point:
                    point[_rounds_key(field)].append(m[field])
                    point[field] = statistics.median(point[_rounds_key(field)])
            point["rounds"] = round_
            files.write_json(files.serve, record)
            timed += 1
    if timed:
        files.event("part 3 rounds", timed=timed)
    for field in MEASURED.values():
        spreads = [max(p[_rounds_key(field)]) / min(p[_rounds_key(field)]) - 1
                   for p in record["points"] if len(p.get(_rounds_key(field), ())) > 1]  # fmt: skip
        if spreads:
            print(f"part 3: {field} measured in {args.serve_rounds} passes: spread (slowest over fastest) "
                  f"median {statistics.median(spreads):.1%}, worst {max(spreads):.1%} over {len(spreads)} "
                  "points; each point's is the median", flush=True)  # fmt: skip


def score(record: dict[str, Any], model_name: str) -> dict[str, Any] | None:
    """Each point's measured and modelled seconds, and the median and worst |error| of each call."""
    from archsearch.evaluators.hardware import device_model
    from archsearch.space.config import ArchConfig

    for f in record.get("failed", []):
        print(f"part 3: {f['label']} b{f['batch']} ctx{f['context']} was not measured: {f['error']}")
    if not record["points"]:
        return None
    model = device_model(model_name)
    errors: dict[str, list[float]] = {k: [] for k in MEASURED}
    print(f"  {'shape':<22} {'b':>3} {'ctx':>5}  {'prefill ms':>18}  {'decode ms (eager)':>18}  "
          f"{'decode ms (graph)':>18}  {'engine':>7} {'floor':>7}")  # fmt: skip
    for p in record["points"]:
        predicted = predict(model, ArchConfig.from_dict(p["config"]), p)
        cells = []
        for key, field in MEASURED.items():
            real = p.get(field)
            if real:
                error = predicted[key] / real - 1
                errors[key].append(error)
                cells.append(f"{real * 1e3:7.3f} {predicted[key] * 1e3:7.3f} {error:+5.0%}")
            else:
                cells.append(f"{'-':>18}")
        print(f"  {p['label']:<22} {p['batch']:>3} {p['context']:>5}  {'  '.join(cells)}  "
              f"{predicted['decode_engine_s'] * 1e3:7.3f} {predicted['floor_s'] * 1e3:7.3f}")  # fmt: skip
    summary: dict[str, Any] = {"model": model_name, "points": len(record["points"])}
    for key, values in errors.items():
        if values:
            summary[f"{key}_median"] = statistics.median(abs(e) for e in values)
            summary[f"{key}_worst"] = max(abs(e) for e in values)
            print(f"part 3: {key[:-2]} against {model_name}: median |error| {summary[f'{key}_median']:.1%}, "
                  f"worst {summary[f'{key}_worst']:.1%} over {len(values)} points")  # fmt: skip
    decode = summary.get("decode_graph_s_median", summary.get("decode_s_median"))
    if decode is not None:
        verdict = "meets" if decode <= TARGET_MEDIAN else "misses"
        print(f"part 3: decode {verdict} the issue's target (median <= {TARGET_MEDIAN:.0%})")
    return summary
