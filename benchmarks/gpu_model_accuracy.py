"""How well the catalogued GPU model predicts the kernels measured on the GPU at hand.

Run, on a CUDA machine:   python benchmarks/gpu_model_accuracy.py [--model h100-sxm] [--save raw.json]
Re-analyse, anywhere:     python benchmarks/gpu_model_accuracy.py --load raw.json [--model h100-sxm]
(benchmarks/gpu_model_accuracy_h100_2026-11-22.json holds one H100 SXM5 run, torch 2.11.0+cu130.)

Measures, in bf16 on `--device`:
1. every distinct GEMM and SDPA call of one training step of several shapes (GPT-2 small and
   medium, LLaMA-like ~1B shapes, a d_ff misaligned to 16 bytes next to its 8- and 64-aligned
   neighbours, a byte-level proxy) with `profiler.profile_step`;
2. a fitting set of synthetic GEMMs (squares, skinny, memory-bound, launch-bound);
3. one real training step of each shape (ProxyLM, bf16 autocast, fused AdamW; CUDA events,
   median), which the profile's serial kernel sum should approach from below.
Then compares `hardware.predict_step(device_model(--model), step_kernels(cfg, batch, "bf16"))`
kernel by kernel (relative error `predicted / measured - 1`: negative = the model is too fast),
prints per-shape step errors, median and worst errors per kernel kind, the attention and
alignment factors the measurements imply, the step model fitted to the real steps
(`step_fit.refit`, as `archsearch fit-device`: each shape also predicted by a fit on the others),
and `hardware.calibrate` fitted on (a) the synthetic set and (b) all shapes but one, each tested
on GEMMs it did not see. The kernel-by-kernel comparison uses the bare roofline (no fit).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from archsearch.evaluators import hardware
from archsearch.evaluators.step_kernels import step_kernels
from archsearch.space import ArchConfig, preset
from archsearch.space.knobs import config_from_knobs

DTYPE = "bf16"
LLAMA = dict(activation="swiglu", norm="rmsnorm", pos_embedding="rope", bias=False, tie_embeddings=False)


def shapes() -> list[tuple[str, ArchConfig, int]]:
    """(label, config, micro-batch): about 8k tokens per step for the LM-sized shapes."""
    d1024 = dict(d_model=1024, n_layers=8, head_dim=64, vocab_size=32000, seq_len=1024, **LLAMA)
    return [
        ("gpt2-small", preset("gpt2-small"), 8),
        ("gpt2-medium", preset("gpt2-medium"), 8),
        # TinyLlama-1.1B's shape: d 2048, 22 layers, 32 heads of 64, GQA 4, d_ff 5632.
        ("llama-1.1b-gqa", config_from_knobs(d_model=2048, n_layers=22, head_dim=64, n_kv_heads=4,
                                             d_ff=5632, vocab_size=32000, seq_len=2048, **LLAMA), 4),
        ("llama-1b-hd128", config_from_knobs(d_model=2048, n_layers=16, head_dim=128, vocab_size=32000,
                                             seq_len=2048, **LLAMA), 4),
        # LLaMA-7B's 11008 scaled by 1/4 is 2752 (a multiple of 64); 2750 breaks the 16-byte
        # alignment, 2760 is 8-aligned but not 64-aligned (like 11000).
        ("d1024-ff2752", config_from_knobs(d_ff=2752, **d1024), 8),
        ("d1024-ff2760", config_from_knobs(d_ff=2760, **d1024), 8),
        ("d1024-ff2750", config_from_knobs(d_ff=2750, **d1024), 8),
        ("byte-d512", config_from_knobs(d_model=512, n_layers=6, vocab_size=256, seq_len=256), 16),
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------------
# Measuring (needs torch; a GPU for numbers worth keeping): evaluators.step_record, shared with
# benchmarks/gpu_campaign.py
# ------------------------------------------------------------------------------------------------


def measure(device: str, min_run_time: float, train_steps: bool) -> dict[str, Any]:
    from archsearch.evaluators import step_record as sr
    from archsearch.evaluators.device import detect_device
    from archsearch.evaluators.profiler import InMemoryCache

    info = detect_device(device)
    cache = InMemoryCache()
    out = sr.run_header(info, min_run_time, DTYPE)
    print(out["nvidia_smi"], flush=True)
    t0 = time.perf_counter()
    out["fit_gemms"] = sr.time_fit_gemms(sr.FIT_GEMMS, info, min_run_time, DTYPE)
    print(f"fit set: {len(sr.FIT_GEMMS)} GEMMs in {time.perf_counter() - t0:.1f} s", flush=True)
    for label, cfg, batch in shapes():
        steps = sr.TRAIN_STEPS if train_steps else 0
        entry = sr.measure_shape(label, cfg, batch, device, cache, min_run_time, DTYPE, steps)
        if "error" in entry:
            print(f"{label}: {entry['error']}")
        out["shapes"].append(entry)
        print(f"{label}: profiled in {entry['measure_s']:.1f} s", flush=True)
    return out


# ------------------------------------------------------------------------------------------------
# Analysis (pure: runs anywhere on saved measurements)
# ------------------------------------------------------------------------------------------------


def _err(pred: float, meas: float) -> float:
    return pred / meas - 1


def _stats(errors: list[float]) -> str:
    if not errors:
        return "n/a"
    errs = [abs(e) for e in errors]
    return (
        f"median |err| {statistics.median(errs):6.1%}, worst {max(errs):6.1%}, "
        f"median signed {statistics.median(errors):+6.1%} (n={len(errs)})"
    )


def analyse(raw: dict[str, Any], model_name: str, calibrate: bool) -> None:
    model = hardware.device_model(model_name, fitted=False)  # the bare roofline, before any fit
    dev = raw["device"]
    print(
        f"\n=== measured on {dev['name']} ({dev['capability']}, {dev['units']} SMs), torch {raw['torch']}, "
        f"{raw['date']}; model: {model_name} ({model.device.name}) ==="
    )
    print(raw.get("nvidia_smi", ""))
    gemm_errs: dict[tuple[int, ...], float] = {}
    attn_errs: dict[str, list[float]] = {"sdpa.fwd": [], "sdpa.bwd": []}
    attn_implied: dict[str, list[float]] = {"sdpa.fwd": [], "sdpa.bwd": []}
    step_gemm_meas: dict[str, list[hardware.GemmMeasurement]] = {}
    mlp_seconds: dict[str, float] = {}
    summary_rows = []
    for entry in raw["shapes"]:
        cfg = ArchConfig.from_dict(entry["config"])
        batch, meas = entry["batch"], entry["report"]
        pred = hardware.predict_step(model, step_kernels(cfg, batch, DTYPE))
        label = entry["label"]
        print(
            f"\n--- {label}: d{cfg.d_model} L{cfg.n_layers} h{cfg.n_heads}/{cfg.n_kv_heads}x{cfg.head_dim} "
            f"ff{cfg.d_ff} {cfg.activation} V{cfg.vocab_size}, batch {batch} x {cfg.seq_len} ---"
        )
        print(f"attention kernels: {', '.join(entry.get('attention_kernels', [])) or '?'}")
        print(
            f"{'kernel':<16} {'m':>6} {'n':>6} {'k':>6} {'meas us':>9} {'pred us':>9} "
            f"{'meas TF/s':>9} {'pred TF/s':>9} {'err':>7}  plan"
        )
        totals = {"gemm": [0.0, 0.0], "attention": [0.0, 0.0]}
        step_gemm_meas[label] = []
        for mrow, prow in zip(meas["kernels"], pred.kernels, strict=True):
            assert mrow["name"] == prow.name
            e = _err(prow.time_s, mrow["time_s"])
            kind = "gemm" if mrow["kind"] == "gemm" else "attention"
            totals[kind][0] += mrow["total_s"]
            totals[kind][1] += prow.total_s
            plan = ""
            if kind == "gemm":
                shape = (mrow["m"], mrow["n"], mrow["k"])
                gemm_errs[shape] = e
                step_gemm_meas[label].append(hardware.GemmMeasurement(*shape, DTYPE, mrow["time_s"]))
                p = hardware.plan_gemm(model, *shape, DTYPE)
                plan = f"{p.tile} sk{p.split_k} w{p.waves} {p.bound[:3]} al{p.alignment_factor:g}"
                if mrow["name"].startswith(("mlp_up", "mlp_down")):
                    mlp_seconds[label] = mlp_seconds.get(label, 0.0) + mrow["total_s"]
            else:
                attn_errs[mrow["kind"]].append(e)
                # The attention_efficiency that would make this call exact, head-dim factors kept.
                attn_implied[mrow["kind"]].append(model.attention_efficiency * (1 + e))
            print(
                f"{mrow['name']:<16} {mrow['m']:>6} {mrow['n']:>6} {mrow['k']:>6} "
                f"{mrow['time_s'] * 1e6:>9.1f} {prow.time_s * 1e6:>9.1f} "
                f"{mrow['tflops']:>9.1f} {prow.tflops:>9.1f} {e:>+7.1%}  {plan}"
            )
        mem_meas = sum(r["time_s"] for r in meas["memory_ops"])
        bw = meas["bandwidth_bytes_per_s"]
        real = entry.get("train_step_s")
        row = {
            "label": label,
            "gemm": totals["gemm"],
            "attention": totals["attention"],
            "memory": (mem_meas, pred.memory_time_s),
            "step": (meas["step_time_s"], pred.step_time_s),
            "real": real,
            "bandwidth": bw,
        }
        summary_rows.append(row)
        print(
            f"step (serial kernel sum): measured {meas['step_time_s'] * 1e3:.2f} ms, predicted "
            f"{pred.step_time_s * 1e3:.2f} ms ({_err(pred.step_time_s, meas['step_time_s']):+.1%}); "
            f"GEMMs {_err(*totals['gemm'][::-1]):+.1%}, attention {_err(*totals['attention'][::-1]):+.1%}, "
            f"memory ops {_err(pred.memory_time_s, mem_meas):+.1%}"
        )
        if real:
            flops = sum(g.flops for g in step_kernels(cfg, batch).gemms)
            print(
                f"real training step {real * 1e3:.2f} ms: profile sum is "
                f"{meas['step_time_s'] / real:.0%} of it, model {pred.step_time_s / real:.0%}; "
                f"GEMM-FLOP rate {flops / real / 1e12:.0f} TFLOP/s"
            )

    print("\n=== per-step relative errors (predicted / measured - 1) ===")
    print(
        f"{'shape':<16} {'GEMMs':>8} {'attn':>8} {'mem':>8} {'step':>8} {'meas ms':>9} {'pred ms':>9} "
        f"{'real ms':>9} {'model/real':>10}"
    )
    for r in summary_rows:
        real = r["real"]
        errs = [_err(r[key][1], r[key][0]) for key in ("gemm", "attention", "memory", "step")]
        tail = f"{real * 1e3:>9.2f} {_err(r['step'][1], real):>+10.1%}" if real else f"{'-':>9} {'-':>10}"
        print(
            f"{r['label']:<16} "
            + " ".join(f"{e:>+8.1%}" for e in errs)
            + f" {r['step'][0] * 1e3:>9.2f} {r['step'][1] * 1e3:>9.2f} {tail}"
        )
    print("\n=== summary over distinct kernels ===")
    print(f"GEMMs      : {_stats(list(gemm_errs.values()))}")
    big = [e for (m, n, k), e in gemm_errs.items() if 2 * m * n * k >= 1e11]
    print(f"GEMMs >=100 GFLOP: {_stats(big)}")
    for kind, errs in attn_errs.items():
        print(
            f"{kind:<11}: {_stats(errs)}; implied attention_efficiency median "
            f"{statistics.median(attn_implied[kind]):.2f} (model {model.attention_efficiency})"
        )
    print(f"step sums  : {_stats([_err(r['step'][1], r['step'][0]) for r in summary_rows])}")
    reals = [_err(r["step"][1], r["real"]) for r in summary_rows if r["real"]]
    print(f"vs real steps: {_stats(reals)}")
    bws = [r["bandwidth"] for r in summary_rows]
    print(
        f"copy bandwidth measured {statistics.median(bws) / 1e12:.2f} TB/s (read + write) vs model "
        f"{model.bandwidth / 1e12:.2f} TB/s ({model.device.memory_bandwidth / 1e12:.2f} x "
        f"{model.bandwidth_efficiency}): implied bandwidth_efficiency "
        f"{statistics.median(bws) / model.device.memory_bandwidth:.2f}"
    )
    fit = {(m, n, k): s for m, n, k, s in raw["fit_gemms"]}
    peak = fit.get((8192, 8192, 8192))
    if peak:
        tflops = 2 * 8192**3 / peak / 1e12
        peak_flops = model.device.peak_flops(DTYPE)
        print(
            f"8192^3 bf16 GEMM: {tflops:.0f} TFLOP/s = {tflops * 1e12 / peak_flops:.1%} of the "
            f"{peak_flops / 1e12:.1f} datasheet peak (model: {model.compute_efficiency})"
        )
    print("fit-set GEMMs:")
    for (m, n, k), s in fit.items():
        p = hardware.predict_gemm(model, m, n, k, DTYPE)
        print(
            f"  {m:>6} {n:>6} {k:>6}: {s * 1e6:9.1f} us {2 * m * n * k / s / 1e12:7.1f} TF/s, "
            f"pred {p * 1e6:9.1f} us ({_err(p, s):+.1%})"
        )
    # Alignment: MLP GEMM time of the same FLOPs-ish shapes, per FLOP.
    trio = {lab: mlp_seconds.get(lab) for lab in ("d1024-ff2752", "d1024-ff2760", "d1024-ff2750")}
    if all(trio.values()):
        per = {lab: t / int(lab.split("ff")[1]) for lab, t in trio.items()}
        base = per["d1024-ff2752"]
        print(
            f"MLP GEMM time per unit d_ff relative to d_ff=2752 (64-aligned): 2760 (8-aligned) "
            f"{base / per['d1024-ff2760']:.2f}x speed, 2750 (misaligned) {base / per['d1024-ff2750']:.2f}x "
            f"speed; model factors coarse {model.coarse_aligned_factor}, misaligned {model.misaligned_factor}"
        )
    fitted_steps(raw, model_name)
    if not calibrate:
        return
    print("\n=== calibrate(): fitted on GEMMs, tested on GEMMs it did not see ===")
    fit_set = [hardware.GemmMeasurement(m, n, k, DTYPE, s) for m, n, k, s in raw["fit_gemms"]]
    held: dict[tuple[int, int, int], hardware.GemmMeasurement] = {}
    for ms in step_gemm_meas.values():
        for x in ms:
            if (x.m, x.n, x.k) not in fit:
                held[(x.m, x.n, x.k)] = x
    t0 = time.perf_counter()
    cal = hardware.calibrate(model, fit_set)
    errs = hardware.prediction_errors(cal.model, held.values())
    base_errs = hardware.prediction_errors(model, held.values())
    print(
        f"(a) synthetic set ({cal.n_measurements} GEMMs, {time.perf_counter() - t0:.1f} s): "
        f"compute_efficiency {cal.model.compute_efficiency:.3f}, bandwidth_efficiency "
        f"{cal.model.bandwidth_efficiency:.3f}, launch {cal.model.launch_s * 1e6:.2f} us; fit error median "
        f"{cal.median_error:.1%}, worst {cal.worst_error:.1%}"
    )
    print(
        f"    held-out step GEMMs (n={len(errs)}): calibrated median {statistics.median(errs):.1%}, worst "
        f"{max(errs):.1%}; uncalibrated median {statistics.median(base_errs):.1%}, worst {max(base_errs):.1%}"
    )
    loo = []
    for label, ms in step_gemm_meas.items():
        own = {(x.m, x.n, x.k) for x in ms}
        train = [x for lab, other in step_gemm_meas.items() if lab != label for x in other]
        train = list({(x.m, x.n, x.k): x for x in [*fit_set, *train] if (x.m, x.n, x.k) not in own}.values())
        c = hardware.calibrate(model, train)
        test = list({(x.m, x.n, x.k): x for x in ms}.values())
        e = hardware.prediction_errors(c.model, test)
        loo.extend(e)
        print(
            f"(b) leave out {label:<16} fit on {len(train):>3}: ce {c.model.compute_efficiency:.3f} "
            f"be {c.model.bandwidth_efficiency:.3f} launch {c.model.launch_s * 1e6:5.2f} us -> held-out "
            f"median {statistics.median(e):6.1%}, worst {max(e):6.1%} (n={len(e)})"
        )
    print(f"(b) all held-out shapes together: median {statistics.median(loo):.1%}, worst {max(loo):.1%}")


def fitted_steps(raw: dict[str, Any], model_name: str) -> None:
    """Real steps against the bare kernel sum and the step model fitted to this run
    (`archsearch fit-device`): fitted on all shapes, and on all but the one predicted."""
    from archsearch.evaluators.counting import eager_kernel_count
    from archsearch.evaluators.step_fit import refit

    if not any(entry.get("train_step_s") for entry in raw["shapes"]):
        return
    result = refit(raw, model_name, eager_kernel_count, holdout=True)
    print("\n=== step model fitted to the real steps (archsearch fit-device) ===")
    print(f"{'shape':<16} {'launches':>8} {'real ms':>9} {'kernel sum':>11} {'fitted':>8} {'held out':>9}")
    rows = zip(result.records, result.kernel_sums, result.predicted, result.holdout, strict=True)
    for record, kernel_sum, predicted, held in rows:
        real = record.real_step_s
        print(
            f"{record.label:<16} {record.launches:>8} {real * 1e3:>9.2f} {_err(kernel_sum, real):>+11.1%} "
            f"{_err(predicted, real):>+8.1%} {held.error:>+9.1%}"
        )
    for name, values in (
        (
            "kernel sum",
            [_err(k, r.real_step_s) for k, r in zip(result.kernel_sums, result.records, strict=True)],
        ),
        ("fitted", [_err(p, r.real_step_s) for p, r in zip(result.predicted, result.records, strict=True)]),
        ("held out", [h.error for h in result.holdout]),
    ):
        print(f"{name:<11}: {_stats(values)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="h100-sxm", help="catalogued device model to compare with")
    parser.add_argument("--min-run-time", type=float, default=0.1)
    parser.add_argument("--save", help="write the raw measurements to this JSON file")
    parser.add_argument("--load", help="analyse measurements saved by --save instead of measuring")
    parser.add_argument("--no-train-steps", action="store_true", help="skip timing real training steps")
    parser.add_argument("--no-calibrate", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="analyse the recorded H100 run: no GPU needed")
    args = parser.parse_args()
    if args.smoke:
        args.load = str(Path(__file__).with_name("gpu_model_accuracy_h100_2026-11-22.json"))
    if args.load:
        with open(args.load, encoding="utf-8") as f:
            raw = json.load(f)
    else:
        raw = measure(args.device, args.min_run_time, not args.no_train_steps)
        if args.save:
            with open(args.save, "w", encoding="utf-8") as f:
                json.dump(raw, f, indent=1)
    analyse(raw, args.model, not args.no_calibrate)


if __name__ == "__main__":
    main()
