"""How well the calibrated hardware model predicts GEMMs it never measured on this device.

Run: python benchmarks/profiler_accuracy.py [--device cpu] [--dtype fp32]
     python benchmarks/profiler_accuracy.py --device cuda [--model h100-sxm] [--dtype bf16]

1. Measure a handful of GEMMs (the fitting set) with the profiler's timer; on CUDA a few larger
   ones too, so that the fit sees compute-bound GEMMs.
2. `hardware.calibrate` fits the device model's constants to them: the local CPU model's peaks
   on CPU, a catalogued GPU's efficiencies on CUDA (`--model`, default guessed from the GPU name).
3. Measure the distinct GEMMs of real proxy training steps (three byte-level shapes, batch 16 x
   256 tokens) that are not in the fitting set, and compare the calibrated predictions.
Prints the fit's own error, the median and worst relative error on the held-out shapes
(target: median < 15%), and the seconds the profiler spends per new shape.
"""

from __future__ import annotations

import argparse
import statistics
import time

from archsearch.evaluators.device import DeviceInfo, detect_device
from archsearch.evaluators.hardware import (
    GemmMeasurement,
    calibrate,
    device_model,
    local_cpu,
    prediction_errors,
)
from archsearch.evaluators.profiler import time_gemm
from archsearch.evaluators.step_kernels import step_kernels
from archsearch.space.knobs import config_from_knobs

FIT_SHAPES = [
    (256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 512, 512), (4096, 128, 128),
    (4096, 768, 256), (128, 128, 4096), (768, 4096, 256),
]  # fmt: skip
# Added on CUDA: the small shapes above are all launch-bound on a data-centre GPU.
GPU_FIT_SHAPES = [
    (4096, 4096, 4096), (8192, 8192, 8192), (8192, 1024, 4096), (4096, 128, 4096), (1024, 1024, 8192),
]  # fmt: skip
# Catalogue keys by a substring of `torch.cuda.get_device_name` (first match wins).
GPU_MODELS = (
    ("H100", "h100-sxm"),
    ("H200", "h200"),
    ("A100", "a100-80gb"),
    ("L4", "l4"),
    ("4090", "rtx4090"),
)


def base_model(info: DeviceInfo, name: str | None):
    """The model to calibrate: `name` from the catalogue, else the local CPU or the GPU's entry."""
    if name is None and info.type == "cpu":
        return local_cpu(cores=info.threads)
    if name is None:
        name = next((key for part, key in GPU_MODELS if part in info.name), None)
        if name is None:
            raise SystemExit(
                f"no catalogued model for {info.name!r}: pass --model (see `archsearch devices`)"
            )
    return device_model(name)


# (d_model, n_layers) of the byte-level shapes whose steps' GEMMs are held out.
HELD_OUT_DESIGNS = ((128, 4), (256, 4), (512, 6))


def held_out_shapes(designs=HELD_OUT_DESIGNS) -> list[tuple[int, int, int]]:
    shapes = set()
    for d, n in designs:
        cfg = config_from_knobs(d_model=d, n_layers=n, head_dim=64, vocab_size=256, seq_len=256)
        shapes |= {g.shape for g in step_kernels(cfg, batch=16).gemms}
    return sorted(shapes - set(FIT_SHAPES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", help="default fp32 on CPU (the local model's dtype), bf16 on CUDA")
    parser.add_argument("--model", help="catalogued device model to calibrate (CUDA; default from the name)")
    parser.add_argument("--min-run-time", type=float, default=0.1)
    parser.add_argument("--smoke", action="store_true", help="a tiny run that checks the script works")
    args = parser.parse_args()
    designs = HELD_OUT_DESIGNS
    if args.smoke:  # the smallest shape's GEMMs alone: the larger two's took most of the run
        args.min_run_time, designs = 0.002, HELD_OUT_DESIGNS[:1]
    info = detect_device(args.device)
    if args.dtype is None:
        args.dtype = "fp32" if info.type == "cpu" else "bf16"
    base = base_model(info, args.model)
    fit_shapes = FIT_SHAPES + (GPU_FIT_SHAPES if info.type == "cuda" else [])

    def measure(shapes: list[tuple[int, int, int]]) -> tuple[list[GemmMeasurement], float]:
        start = time.perf_counter()
        out = [
            GemmMeasurement(m, n, k, args.dtype, time_gemm(m, n, k, info, args.dtype, args.min_run_time))
            for m, n, k in shapes
        ]
        return out, (time.perf_counter() - start) / len(shapes)

    fit_set, _ = measure(fit_shapes)
    held_out, per_shape = measure(sorted(set(held_out_shapes(designs)) - set(fit_shapes)))
    fit = calibrate(base, fit_set)
    errors = prediction_errors(fit.model, held_out)
    # Effective rates: on a catalogued GPU the fit scales the efficiencies (1 in the CPU model).
    peak = fit.model.device.peak_flops(args.dtype) * fit.model.compute_efficiency
    bandwidth = fit.model.bandwidth
    worst_error, worst = max(zip(errors, held_out, strict=True), key=lambda pair: pair[0])
    print(f"device: {info.name} ({info.type}, {info.threads} threads), dtype {args.dtype}")
    print(f"fitting set: {fit.n_measurements} GEMMs; fit error median {fit.median_error:.1%}, ", end="")
    print(f"worst {fit.worst_error:.1%}")
    print(f"fitted peak {peak / 1e9:,.1f} GFLOP/s, bandwidth {bandwidth / 1e9:,.1f} GB/s", end="")
    print(f", launch {fit.model.launch_s * 1e6:.2f} us ({fit.fitted} of {base.device.name})")
    if fit.fitted == "efficiency":
        uncalibrated = prediction_errors(base, held_out)
        median = statistics.median(uncalibrated)
        print(f"uncalibrated {base.device.name} on the held-out set: median {median:.1%}")
    print(f"held-out: {len(held_out)} GEMMs of proxy training steps")
    print(f"  median relative error {statistics.median(errors):.1%} (target < 15%), worst {worst_error:.1%}")
    print(f"  worst shape m={worst.m} n={worst.n} k={worst.k}: measured {worst.seconds * 1e3:.3f} ms")
    print(f"profiler time per new GEMM shape: {per_shape:.3f} s (min_run_time {args.min_run_time} s)")


if __name__ == "__main__":
    main()
