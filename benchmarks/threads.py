"""CPU training speed at 1 and 2 torch intra-op threads, side by side (issue 9).

Run: python benchmarks/threads.py [--steps 8] [--repeats 3] [--threads 1,2] [--batch 16]
                                  [--shapes N] [--json runs.jsonl]
     python benchmarks/threads.py --smoke        # the smallest shape, a few steps

The measurements behind `evaluators.settings.choose_threads`. Shapes of the tiny space
(`examples/tiny.toml`: vocab 256, seq 128, batch 16), from its smallest to its largest GEMMs,
and two past its budget; each is trained by `trainer.train` on the bundled corpus with
`TrainSettings.threads` fixed at each count in turn (the counts alternate within each repeat, so
drift on a shared machine hits them alike; median over repeats). Columns:
- GEMM: multiply-adds of the step's largest matrix product (`settings.largest_gemm`);
- tok/s @N: tokens per second of the trainer's median steady-state step (`step_time_s`: warm-up,
  evaluation and logging excluded) at N threads;
- N/1: speed at N threads over speed at 1;
- chosen: what `choose_threads` picks for the shape on all the cores this process may use (an
  idle machine's choice; on a busy one `available_cores` lowers the cap);
- others @N: cores' worth of CPU time that other processes used while the N-thread runs trained
  (/proc/stat's busy time minus this process's, per second): on a shared machine it decides
  more than the shape does; "-" where /proc/stat cannot be read;
- |dloss|: the largest difference in held-out loss between thread counts (the same seed).
`--json` appends every run (shape, threads, tok/s, others) as one JSON line, to sort runs taken
while the machine was idle from those taken while it was busy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

import torch

from archsearch.evaluators.data import load_dataset
from archsearch.evaluators.settings import (
    TrainSettings,
    available_cores,
    choose_threads,
    largest_gemm,
    usable_cores,
)
from archsearch.evaluators.trainer import STEP_WARMUP, train
from archsearch.space.config import ArchConfig
from archsearch.space.knobs import config_from_knobs

BATCH, SEQ_LEN = 16, 128  # examples/tiny.toml's proxy


def shapes(seq_len: int = SEQ_LEN) -> list[ArchConfig]:
    """Tiny-space shapes by growing largest GEMM, then two past its 2M-parameter budget."""
    knobs = [  # d_model, n_layers, d_ff, query heads per KV head (64-wide heads)
        (64, 1, 128, 1),  # the tiny space's smallest shape (aspect 64, d_ff_ratio 2)
        (64, 4, 256, 1),
        (128, 2, 512, 1),
        (128, 4, 768, 2),
        (192, 3, 768, 1),
        (256, 4, 512, 4),  # MQA: about the largest inside the budget
        (256, 4, 1024, 1),  # past the budget from here on
        (384, 4, 1536, 1),
    ]
    fixed = dict(head_dim=64, vocab_size=256, seq_len=seq_len, activation="gelu")
    return [
        config_from_knobs(d_model=d, n_layers=n, d_ff=ff, n_kv_heads=d // 64 // group, **fixed)
        for d, n, ff, group in knobs
    ]


class OtherLoad:
    """Cores' worth of CPU time other processes use, measured between `start` and `stop`."""

    def __init__(self) -> None:
        self._first: tuple[float, float, float] | None = None

    @staticmethod
    def _read() -> tuple[float, float, float] | None:
        """(wall seconds, the machine's busy CPU-seconds, this process's CPU-seconds)."""
        try:
            with open("/proc/stat", encoding="ascii") as f:
                ticks = [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        user, nice, system, _idle, _iowait, irq, softirq, _steal = ticks
        busy = (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
        own = os.times()
        return time.perf_counter(), busy, own.user + own.system

    def start(self) -> None:
        self._first = self._read()

    def stop(self) -> float | None:
        last = self._read()
        if last is None or self._first is None or last[0] <= self._first[0]:
            return None
        (t0, busy0, own0), (t1, busy1, own1) = self._first, last
        return max(0.0, (busy1 - busy0) - (own1 - own0)) / (t1 - t0)


def label(cfg: ArchConfig) -> str:
    return f"d{cfg.d_model} L{cfg.n_layers} ff{cfg.d_ff} {cfg.attention_layout}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=8, help="timed optimizer steps per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per shape and thread count")
    parser.add_argument("--threads", default="1,2", help="thread counts to compare, comma-separated")
    parser.add_argument("--shapes", type=int, default=None, help="only the first N shapes")
    parser.add_argument("--batch", type=int, default=BATCH, help="sequences per step (smaller GEMMs)")
    parser.add_argument("--seq-len", type=int, default=SEQ_LEN)
    parser.add_argument("--json", type=Path, default=None, help="append every run here, one JSON line")
    parser.add_argument("--smoke", action="store_true", help="1 shape, 2 steps, 1 repeat")
    args = parser.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    steps, repeats, todo = args.steps, args.repeats, shapes(args.seq_len)[: args.shapes]
    if args.smoke:
        steps, repeats, todo = 2, 1, todo[:1]

    data = load_dataset(None, seq_len=args.seq_len)
    cores, free = usable_cores(), available_cores()
    tokens = args.batch * args.seq_len
    print(
        f"torch {torch.__version__}, {cores} cores, {free} free; batch {args.batch} x {args.seq_len}, "
        f"{steps} timed steps after {STEP_WARMUP} warm-up, median of {repeats}"
    )
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rates_head = " ".join(f"{f'tok/s @{n}':>10}" for n in counts)
    ratio_head = " ".join(f"{f'{n}/{counts[0]}':>5}" for n in counts[1:])
    others_head = " ".join(f"{f'others @{n}':>9}" for n in counts)
    print(
        f"{'shape':<22} {'params':>9} {'GEMM':>7} {rates_head} {ratio_head} {'chosen':>6} "
        f"{others_head} {'|dloss|':>7}"
    )
    meter = OtherLoad()
    start = time.perf_counter()
    for cfg in todo:
        settings = TrainSettings(
            tokens=(STEP_WARMUP + steps) * tokens, batch_size=args.batch, evals=1, eval_batches=1,
            device="cpu", precision="fp32", warmup=0.0,
        )  # fmt: skip
        rates: dict[int, list[float]] = {n: [] for n in counts}
        others: dict[int, list[float]] = {n: [] for n in counts}
        losses: dict[int, float] = {}
        params = 0
        for _ in range(repeats):
            for n in counts:
                meter.start()
                result = train(cfg, data, dataclasses.replace(settings, threads=n))
                load = meter.stop()
                if result.status != "complete" or result.step_time_s is None or result.threads != n:
                    raise SystemExit(f"{label(cfg)} at {n} threads: {result.status} ({result.reason})")
                rates[n].append(tokens / result.step_time_s)
                if load is not None:
                    others[n].append(load)
                if args.json is not None:
                    with args.json.open("a", encoding="utf-8") as f:
                        row = dict(
                            shape=label(cfg), tokens=tokens, gemm=largest_gemm(cfg, tokens), threads=n,
                            tokens_per_second=tokens / result.step_time_s, others=load,
                        )  # fmt: skip
                        f.write(json.dumps(row) + "\n")
                losses[n], params = result.val_loss, result.params
        med = {n: statistics.median(r) for n, r in rates.items()}
        dloss = max(losses.values()) - min(losses.values())
        gemm = f"{largest_gemm(cfg, tokens) / 1e6:.0f}M"
        print(
            f"{label(cfg):<22} {params:>9,} {gemm:>7} "
            + " ".join(f"{med[n]:>10,.0f}" for n in counts)
            + " "
            + " ".join(f"{med[n] / med[counts[0]]:>5.2f}" for n in counts[1:])
            + f" {choose_threads(cfg, tokens, cores):>6} "
            + " ".join(f"{statistics.median(o):>9.2f}" if o else f"{'-':>9}" for o in others.values())
            + f" {dloss:>7.1e}"
        )
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
