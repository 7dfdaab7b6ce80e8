"""The proxy trainer's speed next to the device's GEMM peak and a plain reference loop.

Run: python benchmarks/trainer_throughput.py [--device cpu] [--steps 30] [--batch 16]

For each shape, in one run and on the same batches' sizes:
- the device's measured GEMM peak in the trainer's precision (1024^3 on CPU, 8192^3 on CUDA);
- `archsearch.evaluators.trainer.train` on the bundled corpus: tokens/s and MFU
  (cost-model training FLOPs / time, over that peak);
- a minimal nanoGPT-style loop over the same `ProxyLM`, AdamW with the same groups (fused on
  CUDA only, as nanoGPT does; the trainer fuses it on CPU too) and the same autocast, on
  pre-made batches: forward, loss, backward, clip, step. No schedule, evaluation or logging.
Targets (issue 3): the trainer reaches >= 50% of the GEMM peak on the largest shape and is never
slower than the reference loop.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from archsearch.evaluators.data import load_dataset
from archsearch.evaluators.device import resolve_device
from archsearch.evaluators.model import ProxyLM
from archsearch.evaluators.trainer import (
    TrainSettings,
    choose_precision,
    param_groups,
    peak_matmul_flops,
    train,
)
from archsearch.space import ArchConfig, flop_counts
from archsearch.space.knobs import config_from_knobs

BATCH = 16
SEQ_LEN = 256


def shapes() -> list[ArchConfig]:
    """Byte-level LLaMA-style shapes of ~1M, ~3M and ~20M parameters, aspect ratio 32-85."""
    return [
        config_from_knobs(d_model=d, n_layers=n, head_dim=64, vocab_size=256, seq_len=SEQ_LEN)
        for d, n in ((128, 4), (256, 4), (512, 6))
    ]


def reference_loop(
    cfg: ArchConfig, device: torch.device, precision: str, steps: int, batch_size: int = BATCH
) -> float:
    """tokens/s of a plain loop (nanoGPT's train.py without its extras) on random batches.

    Timed from the first step, as the trainer times itself, so both pay the same warm-up.
    """
    torch.manual_seed(0)
    model = ProxyLM(cfg).to(device)
    opt = torch.optim.AdamW(
        param_groups(model, 3e-3, 128, 0.1), betas=(0.9, 0.95), fused=device.type == "cuda"
    )
    batches = [torch.randint(0, 256, (batch_size, SEQ_LEN + 1), device=device) for _ in range(4)]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")

    def step(i: int) -> None:
        batch = batches[i % len(batches)]
        with autocast:
            logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    start = time.perf_counter()
    for i in range(steps):
        step(i)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return steps * batch_size * SEQ_LEN / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--steps", type=int, default=12, help="timed steps per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each loop per shape (median)")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--batch", type=int, default=BATCH, help="sequences of 256 tokens per step")
    parser.add_argument("--smoke", action="store_true", help="a tiny run that checks the script works")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.repeats, args.batch = 1, 1, 1
    info = resolve_device(args.device)
    device = info.torch_device
    precision = choose_precision(info, args.precision)
    # The smoke run checks the script, not the figures: a 256^3 GEMM timed once stands in for the
    # peak (a 1024^3 bf16 GEMM on a CPU without native bf16 takes seconds a call).
    smoke_peak = {"size": 256, "repeats": 1, "min_run_time": 0.01} if args.smoke else {}
    peak = peak_matmul_flops(info, precision, **smoke_peak)
    data = load_dataset(None)
    print(f"device: {info.name} ({info.type}, {info.threads} threads), precision {precision}", end="")
    print(f", batch {args.batch} x {SEQ_LEN}")
    print(f"torch {torch.__version__}")
    print(f"GEMM peak ({precision}): {peak / 1e9:,.1f} GFLOP/s")
    print(
        f"{'shape':<34} {'params':>10} {'trainer tok/s':>14} {'MFU':>6} {'reference tok/s':>16} {'ratio':>6}"
    )
    for cfg in shapes()[:1] if args.smoke else shapes():
        settings = TrainSettings(
            tokens=args.steps * args.batch * SEQ_LEN, batch_size=args.batch, precision=precision,
            device=str(device), evals=1, eval_batches=1,
        )  # fmt: skip
        # Alternate the two loops and keep each one's median, so drift on a noisy machine hits both.
        trainer_rates, reference_rates = [], []
        for _ in range(args.repeats):
            result = train(cfg, data, settings)
            trainer_rates.append(result.tokens_per_second)
            reference_rates.append(reference_loop(cfg, device, precision, args.steps, args.batch))
        rate, ref = statistics.median(trainer_rates), statistics.median(reference_rates)
        mfu = flop_counts(cfg).train * rate / peak
        name = f"d{cfg.d_model} L{cfg.n_layers} h{cfg.n_heads}x{cfg.head_dim} ff{cfg.d_ff}"
        print(f"{name:<34} {result.params:>10,} {rate:>14,.0f} {mfu:>6.1%} {ref:>16,.0f} {rate / ref:>6.2f}")


if __name__ == "__main__":
    main()
