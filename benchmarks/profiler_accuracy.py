"""How well the calibrated hardware model predicts GEMMs it never measured on this device.

Run: python benchmarks/profiler_accuracy.py [--device cpu] [--dtype fp32]

1. Measure a handful of GEMMs (the fitting set) with the profiler's timer.
2. `hardware.calibrate` fits the local device model's constants to them.
3. Measure the distinct GEMMs of real proxy training steps (three byte-level shapes, batch 16 x
   256 tokens) that are not in the fitting set, and compare the calibrated predictions.
Prints the fit's own error, the median and worst relative error on the held-out shapes
(target: median < 15%), and the seconds the profiler spends per new shape.
"""

from __future__ import annotations

import argparse
import statistics
import time

from archsearch.evaluators.hardware import GemmMeasurement, calibrate, local_cpu, prediction_errors
from archsearch.evaluators.kernels import step_kernels
from archsearch.evaluators.profiler import detect_device, time_gemm
from archsearch.space.knobs import config_from_knobs

FIT_SHAPES = [
    (256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 512, 512), (4096, 128, 128),
    (4096, 768, 256), (128, 128, 4096), (768, 4096, 256),
]  # fmt: skip


def held_out_shapes() -> list[tuple[int, int, int]]:
    shapes = set()
    for d, n in ((128, 4), (256, 4), (512, 6)):
        cfg = config_from_knobs(d_model=d, n_layers=n, head_dim=64, vocab_size=256, seq_len=256)
        shapes |= {g.shape for g in step_kernels(cfg, batch=16).gemms}
    return sorted(shapes - set(FIT_SHAPES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", help="the local model is calibrated in fp32")
    parser.add_argument("--min-run-time", type=float, default=0.1)
    args = parser.parse_args()
    info = detect_device(args.device)

    def measure(shapes: list[tuple[int, int, int]]) -> tuple[list[GemmMeasurement], float]:
        start = time.perf_counter()
        out = [
            GemmMeasurement(m, n, k, args.dtype, time_gemm(m, n, k, info, args.dtype, args.min_run_time))
            for m, n, k in shapes
        ]
        return out, (time.perf_counter() - start) / len(shapes)

    fit_set, _ = measure(FIT_SHAPES)
    held_out, per_shape = measure(held_out_shapes())
    fit = calibrate(local_cpu(cores=info.threads), fit_set)
    errors = prediction_errors(fit.model, held_out)
    peak, bandwidth = fit.model.device.peak_flops(args.dtype), fit.model.bandwidth
    worst_error, worst = max(zip(errors, held_out, strict=True), key=lambda pair: pair[0])
    print(f"device: {info.name} ({info.type}, {info.threads} threads), dtype {args.dtype}")
    print(f"fitting set: {fit.n_measurements} GEMMs; fit error median {fit.median_error:.1%}, ", end="")
    print(f"worst {fit.worst_error:.1%}")
    print(f"fitted peak {peak / 1e9:,.1f} GFLOP/s, bandwidth {bandwidth / 1e9:,.1f} GB/s")
    print(f"held-out: {len(held_out)} GEMMs of proxy training steps")
    print(f"  median relative error {statistics.median(errors):.1%} (target < 15%), worst {worst_error:.1%}")
    print(f"  worst shape m={worst.m} n={worst.n} k={worst.k}: measured {worst.seconds * 1e3:.3f} ms")
    print(f"profiler time per new GEMM shape: {per_shape:.3f} s (min_run_time {args.min_run_time} s)")


if __name__ == "__main__":
    main()
