"""How long the cost model takes per config, next to building the module and counting it.

Run: python benchmarks/cost_model.py [--configs N]

Prints, for the same random configs measured in one run:
- the pure cost model (`param_counts` + `flop_counts`), per config; target < 50 us, so a search
  can cost millions of candidates;
- building `ProxyLM` on the meta device and counting `numel()` plus a `FlopCounterMode` forward;
- the same on the CPU for small shapes (real tensors);
and the ratios between them.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from archsearch.evaluators.model import ProxyLM, count_parameters
from archsearch.space import ACTIVATIONS, NORM_PLACEMENTS, PRESETS, ArchConfig, flop_counts, param_counts


def random_config(rng: random.Random, max_width: int) -> ArchConfig:
    head_dim = rng.choice([32, 64, 128])
    n_heads = rng.randint(1, max(1, max_width // head_dim))
    divisors = [k for k in range(1, n_heads + 1) if n_heads % k == 0]
    d_model = n_heads * head_dim
    return ArchConfig(
        vocab_size=rng.choice([256, 32000, 50257]), seq_len=rng.choice([256, 1024]), d_model=d_model,
        n_layers=rng.randint(1, 8), n_heads=n_heads, n_kv_heads=rng.choice(divisors), head_dim=head_dim,
        d_ff=rng.choice([2, 3, 4]) * d_model, activation=rng.choice(ACTIVATIONS.names()),
        norm_placement=rng.choice(NORM_PLACEMENTS.names()), parallel_block=rng.random() < 0.3,
        bias=rng.random() < 0.5, tie_embeddings=rng.random() < 0.5, qk_norm=rng.random() < 0.3,
    )  # fmt: skip


def per_call(fn, items, repeats: int = 5) -> float:
    """Median over `repeats` of the mean seconds per item."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for item in items:
            fn(item)
        times.append((time.perf_counter() - start) / len(items))
    return statistics.median(times)


def cost_model(cfg: ArchConfig) -> tuple[int, int]:
    return param_counts(cfg).total, flop_counts(cfg).forward


def module_count(cfg: ArchConfig, device: str) -> tuple[int, int]:
    with torch.device(device):
        model = ProxyLM(cfg)
    idx = torch.zeros(1, cfg.seq_len, dtype=torch.long, device=device)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(idx)
    return count_parameters(model), counter.get_total_flops()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=2000, help="random configs for the cost model")
    parser.add_argument("--module-configs", type=int, default=20, help="configs built as modules")
    parser.add_argument("--smoke", action="store_true", help="a tiny run that checks the script works")
    args = parser.parse_args()
    repeats = 3
    if args.smoke:
        args.configs, args.module_configs, repeats = 50, 1, 1
    torch.set_num_threads(2)
    rng = random.Random(0)
    configs = [random_config(rng, 2048) for _ in range(args.configs)]
    small = [random_config(rng, 256) for _ in range(args.module_configs)]
    if args.smoke:  # a byte vocabulary and one layer: a 50k-token embedding's forward on the CPU took seconds
        small = [dataclasses.replace(cfg, vocab_size=256, n_layers=1) for cfg in small]
    for cfg in small:  # the two must agree before their times mean anything
        params, flops = module_count(cfg, "cpu")
        assert params == param_counts(cfg).total and flops == flop_counts(cfg).forward * cfg.seq_len

    t_cost = per_call(cost_model, configs)
    t_cost_small = per_call(cost_model, small)
    t_meta = per_call(lambda c: module_count(c, "meta"), small, repeats=repeats)
    t_cpu = per_call(lambda c: module_count(c, "cpu"), small, repeats=repeats)
    presets = [p.config for _, p in PRESETS.items()][: 1 if args.smoke else None]
    t_preset_cost = per_call(cost_model, presets)
    t_preset_meta = per_call(lambda c: module_count(c, "meta"), presets, repeats=1)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"cost model, {len(configs)} random configs:        {t_cost * 1e6:10.2f} us/config (target < 50)")
    print(f"cost model, {len(small)} small configs:             {t_cost_small * 1e6:10.2f} us/config")
    print(f"build + FlopCounterMode on meta, same small:  {t_meta * 1e6:10.0f} us/config "
          f"({t_meta / t_cost_small:,.0f}x the cost model)")  # fmt: skip
    print(f"build + FlopCounterMode on cpu, same small:   {t_cpu * 1e6:10.0f} us/config "
          f"({t_cpu / t_cost_small:,.0f}x the cost model)")  # fmt: skip
    print(f"presets ({len(presets)}), cost model:                  {t_preset_cost * 1e6:10.2f} us/config")
    print(f"presets ({len(presets)}), build + count on meta:       {t_preset_meta * 1e6:10.0f} us/config "
          f"({t_preset_meta / t_preset_cost:,.0f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
