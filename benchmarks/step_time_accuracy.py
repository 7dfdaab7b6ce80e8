"""Is the stored local step time a real training step? (issue 12, section 1)

Run: python benchmarks/step_time_accuracy.py [--shapes 10] [--steps 16] [--seed 0] [--rerun]
     python benchmarks/step_time_accuracy.py --smoke        # one shape, a few steps

For shapes of the tiny space (`examples/tiny.toml`: vocab 256, seq 128, d_model 64..256, batch
16), drawn at random within its budget, one trial each through the search's own worker
(`search.worker.run_trial`: train, then profile, as `archsearch search` does), side by side:
- trainer: the trainer's measured step, its own clock (`TrainResult.step_time_s`): median of the
  steady-state optimizer steps (forward, backward, clip, optimizer step, zero_grad);
- kernel sum: what archsearch stored as the local step before issue 12, the step's kernels timed
  one by one plus the memory-bound ops at the copy bandwidth (the profile's `kernel_sum_s`), in
  the trainer's precision (the old default, emulated bf16 on a CPU without it, was further off);
- stored: the `step_time_s` the search stores for `local`;
- with --rerun, a second, independent `trainer.train` of the same shape: how much the measured
  step itself moves between runs on this (shared) machine.
Ratios are against the trainer column. Target: stored within 10% of the trainer for every shape.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time
from pathlib import Path

from archsearch.evaluators.data import load_dataset
from archsearch.evaluators.trainer import STEP_WARMUP, train
from archsearch.search.spec import load_spec
from archsearch.search.worker import TrialRequest, run_trial
from archsearch.space.config import ArchConfig
from archsearch.space.search_space import Rejected

SPEC = Path(__file__).resolve().parent.parent / "examples" / "tiny.toml"
TARGET = 0.10  # stored step within 10% of the trainer's measured step


def label(cfg: ArchConfig) -> str:
    return (
        f"d{cfg.d_model} L{cfg.n_layers} ff{cfg.d_ff} {cfg.activation} {cfg.attention_layout} "
        f"hd{cfg.head_dim} {cfg.norm_placement}"
    )


def draw_shapes(space, count: int, seed: int) -> list[ArchConfig]:
    """`count` distinct valid in-budget configs of `space`, drawn at random, smallest first."""
    rng, shapes = random.Random(seed), {}
    for _ in range(10_000):
        try:
            cfg = space.config_from_params({d.name: d.draw(rng) for d in space.domains})
        except Rejected:
            continue
        shapes[cfg.to_json(indent=None)] = cfg
        if len(shapes) == count:
            break
    return sorted(shapes.values(), key=lambda c: (c.d_model, c.n_layers, c.d_ff))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", type=int, default=10)
    parser.add_argument("--steps", type=int, default=16, help="optimizer steps per training run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rerun", action="store_true", help="also train each shape again, independently")
    parser.add_argument("--smoke", action="store_true", help="1 shape, 5 steps: checks the script runs")
    args = parser.parse_args()
    shapes, steps = (1, 5) if args.smoke else (args.shapes, args.steps)

    spec = load_spec(SPEC)
    batch, seq_len = spec.proxy.batch_size, spec.space.knob_values()["seq_len"]
    # One evaluation of one batch: evaluation is outside the timed steps, so it only costs time.
    proxy = dataclasses.replace(spec.proxy, tokens=steps * batch * seq_len, evals=1, eval_batches=1)
    corpus = load_dataset(None, seq_len=seq_len) if args.rerun else None
    print(f"{SPEC.name}: batch {batch} x {seq_len}, {steps} steps per run ({STEP_WARMUP} warm-up)")
    print(
        f"{'shape':<40} {'prec':>4} {'trainer':>9} {'kernel sum':>10} {'stored':>9} {'sum/trainer':>11} "
        f"{'stored/trainer':>14} {'residual':>8}" + (f" {'rerun/trainer':>13}" if args.rerun else "")
    )
    ratios, old_ratios, started = [], [], time.perf_counter()
    for i, cfg in enumerate(draw_shapes(spec.space, shapes, args.seed)):
        profile = dataclasses.replace(spec.profile, devices=())
        request = TrialRequest(i, cfg, proxy, profile, step_time_device="local")
        out = run_trial(request)
        if out.status != "complete":
            print(f"{label(cfg):<40} {out.status}: {out.reason}")
            continue
        report = out.profiles[0]["report"]
        trainer_s, stored_s, sum_s = out.train["step_time_s"], out.step_time_s, report["kernel_sum_s"]
        ratio, old = stored_s / trainer_s, sum_s / trainer_s
        ratios.append(ratio)
        old_ratios.append(old)
        line = (
            f"{label(cfg):<40} {report['dtype']:>4} {trainer_s * 1e3:>7.1f}ms {sum_s * 1e3:>8.1f}ms "
            f"{stored_s * 1e3:>7.1f}ms {old:>11.3f} {ratio:>14.3f} {report['residual_s'] / stored_s:>8.0%}"
        )
        if args.rerun:
            again = train(cfg, corpus, proxy)
            line += f" {again.step_time_s / trainer_s:>13.3f}"
        print(line, flush=True)
    if not ratios:
        raise SystemExit("no shape completed")
    within = sum(abs(r - 1) <= TARGET for r in ratios)
    print(
        f"\nstored/trainer: median {statistics.median(ratios):.3f}, "
        f"range {min(ratios):.3f}-{max(ratios):.3f}, {within}/{len(ratios)} within {TARGET:.0%}"
    )
    print(
        f"kernel sum/trainer (the old local step): median {statistics.median(old_ratios):.3f}, "
        f"range {min(old_ratios):.3f}-{max(old_ratios):.3f}"
    )
    print(f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
