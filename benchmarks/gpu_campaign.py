"""The GPU campaign (issue 25): every GPU claim archsearch makes, measured in one sitting on a lent
CUDA device, in commands of at most 10 minutes that each resume what the last one recorded.

Parts (`--parts 1,2,3,4`, the default; `--part N` for one):
1. steps: real eager training steps (bf16 autocast on a GPU, fp32 loss, fused AdamW: the step
   `counting.eager_kernel_count` counts) of 77 shapes that vary d_model and d_ff alignment, head_dim,
   GQA groups, seq_len, vocab 50257 against 50304, batch, and the byte-level shapes the GPU search
   trains (36 of them, labelled "fresh-", "fresh2-" and "fresh3-", added after changes to the step model to
   judge the next change on shapes it was not made for), each with every distinct GEMM and SDPA
   call of its step timed and the synthetic GEMM set that `archsearch fit-device` reads
   (`evaluators.step_record`, shared with benchmarks/gpu_model_accuracy.py); once every shape is
   recorded, each real step is timed again in passes over the table until it has `--step-rounds`
   timings (3), its step their median. Then the step model is fitted as `fit-device` fits it
   (`step_fit.refit`) on a part of the shapes fixed here in advance (`HELD_OUT` and the fresh ones
   are the rest) and scored on the shapes it never saw: median and worst held-out error, each
   fresh group apart.
2. search: `archsearch search` on examples/gpu.toml end to end (Ray, the SQLite database, the
   measured and modelled step times, pruning), as a real process (a smoke run's without a budget:
   in this process), for a handful of trials at a shortened proxy: the generated space file (the
   example with `[proxy] tokens` and `[search] prune_min_trials` cut, this GPU's catalogued model
   added to `[profile] devices`; the trial count is the command's) is kept beside the database so
   every resume runs the same study.
3. serve: prefill and decode of 13 shapes at 3 scenarios measured in bf16 (eager, and the decode
   step replayed from a CUDA graph) against the serving model of the catalogued GPU, nothing
   fitted (benchmarks/gpu_campaign_serve.py); once every point is measured, each is measured again
   in passes until it has `--serve-rounds` timings (3), each call's time their median.
4. trace: where the time of 6 real steps goes (`step_record.trace_train_step`, torch.profiler):
   the shapes the step model missed most on the H200 (the byte-level sandwich shape, d1024 at
   batch 32, GPT-2 small at batch 2, the byte-level 16-layer shape) and two it predicts well; per
   step the wall time, the kernels' device time, the launches (beside the count the model uses) and
   the 30 kernels that took longest, to tell the host's share from missing kernels.

5. fidelity: the search's own proxy ranked against 10x its tokens at GPU scale, 20 shapes of
   5-50M parameters from examples/gpu.toml's knobs on a BPE corpus (benchmarks/gpu_corpus.py,
   built where it runs), 5 runs sharing the GPU as Ray tasks of a fifth of it, scored with
   `search.fidelity_stats` (benchmarks/gpu_campaign_fidelity.py).

Parts run in the order 1, 2, 5, 3, 4 whatever order `--parts` names them. `--sitting` is one
sitting's command: part 1 for the fresh3- shapes alone (`--only fresh3-`: the others' records are
kept and fitted on), then part 5, then part 3 with what remains of `--budget-s`. `--dry-run`
prints its planned device seconds and the bytes a call carries (benchmarks/gpu_campaign_plan.py).

Records go to `--out` (default benchmarks/data/), named by the device (`gpu_campaign_<device>_*`),
each written atomically as each measurement finishes: part 1's run as one JSON in the format
`archsearch fit-device` and `gpu_model_accuracy.py --load` read, rewritten after every shape; part
2's database as a self-contained SQLite snapshot, copied every 30 s while the search runs and at
its end, with a JSON of its trials; a JSONL log of what each invocation did. A run cut off keeps
what it measured; the next one resumes (a recorded shape is not measured again unless the step
the trainer runs for it changed, which its recorded launches tell; the study is resumed with
`--resume`), as long as it runs on the same device and torch (checked; a different one is refused
in one line). `--budget-s` bounds one invocation: no new shape starts that would
not end inside it, and the search is stopped (SIGTERM: its running trial is re-queued) when it
runs out. `--mirror DIR` writes every record to DIR too: on the lent machine, $OUT, whose files
come back even when the command is killed.

On a lent CUDA machine (measured on an H200 on 2026-11-26 at `--min-run-time 0.05`: part 1 207 s
for the 41 shapes, part 2 114 s for 6 trials at `--search-tokens 1000000`, part 3 297 s for the 39
points; about 12 minutes of device time with the machine's start; the rounds, 2026-11-27: part 1's
two more passes 120 s, part 3's 566 s), from the repository root, each command under its 10 minutes;
copy the files that come back in $OUT into benchmarks/data/ before the next call, which may get a
fresh machine (a second command of a part measures only what the first did not):

    PYTHONUNBUFFERED=1 python benchmarks/gpu_campaign.py --part 1 --budget-s 540 --mirror "$OUT"
    PYTHONUNBUFFERED=1 python benchmarks/gpu_campaign.py --part 1 --budget-s 540 --mirror "$OUT"  # if cut
    PYTHONUNBUFFERED=1 python benchmarks/gpu_campaign.py --part 2 --budget-s 540 --mirror "$OUT"
    PYTHONUNBUFFERED=1 python benchmarks/gpu_campaign.py --part 3 --budget-s 540 --mirror "$OUT"
    PYTHONUNBUFFERED=1 python benchmarks/gpu_campaign.py --part 4 --budget-s 300 --mirror "$OUT"
    python benchmarks/gpu_campaign.py --report       # anywhere: what is recorded, scored again

    python benchmarks/gpu_campaign.py --smoke        # CPU, tiny shapes and budgets, a temporary folder

One sitting (docs/how-to/gpu-search.md, "One sitting"): `python benchmarks/gpu_campaign.py
--sitting --dry-run` here first; on the lent machine, carrying `.whl`, a warm-up call (timeout_s
150), then at once, while the machine is warm, the campaign call (timeout_s 600):

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site:$PWD || exit; nvidia-smi -L; PYTHONUNBUFFERED=1 python3 \
      benchmarks/gpu_corpus.py && PYTHONUNBUFFERED=1 python3 benchmarks/gpu_campaign.py --smoke --part 5
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site:$PWD || exit; PYTHONUNBUFFERED=1 python3 benchmarks/gpu_campaign.py \
      --sitting --budget-s 540 --mirror "$OUT"
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gpu_campaign_fidelity  # benchmarks/ is this script's folder
import gpu_campaign_serve

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
GPU_SPACE = ROOT / "examples" / "gpu.toml"
STUDY = "gpu-campaign"
PARTS = {1: "steps", 2: "search", 3: "serve", 4: "trace", 5: "fidelity"}
DEFAULT_PARTS = (1, 2, 3, 4)
# Parts run in this order whatever order they are named in: the fidelity set before serving, so
# that in one sitting a budget cut falls on serving, which resumes from what it measured.
RUN_ORDER = (1, 2, 5, 3, 4)
# One sitting's command (`--sitting`): the step model's untouched shapes, the fidelity set, serving.
SITTING = {"parts": (1, 5, 3), "only": "fresh3-", "smoke_only": "fresh-"}
CORPUS = ROOT / ".corpus" / "bpe8k"  # benchmarks/gpu_corpus.py's default folder
SNAPSHOT_EVERY_S = 30.0  # how often the search's database is copied out while it runs
STOP_GRACE_S = 60.0  # after SIGTERM, time for the search to record its interrupted trial and stop
SEARCH_START_S = 60.0  # Ray's start and the first trial's imports: a search needs this much budget
FIRST_TRIAL_S = 300.0  # the first trial ends well inside this (a 500M shape: about 1 min on an H100)
# Per kernel 0.1 s of repeats and 10 real steps, as the recorded H100 run; part 2's proxy: 3M
# tokens (6% of the example's 50M: about 730 steps of 4 x 1024, under a minute a trial on an H100)
# for 8 trials, a handful that still lets pruning act after 2.
# Each real step is timed `step_rounds` times, in passes over the table (`step_rounds`).
DEFAULTS = {
    "min_run_time": 0.1, "train_steps": 10, "search_tokens": 3_000_000, "search_trials": 8, "step_rounds": 3,
    "serve_rounds": 3,
}  # fmt: skip
SMOKE_DEFAULTS = {
    "min_run_time": 0.01, "train_steps": 3, "search_tokens": 4096, "search_trials": 3, "step_rounds": 2,
    "serve_rounds": 2,
}  # fmt: skip

# ------------------------------------------------------------------------------------------------
# Part 1's shapes
# ------------------------------------------------------------------------------------------------

LLAMA = dict(activation="swiglu", norm="rmsnorm", pos_embedding="rope", bias=False, tie_embeddings=False)
# LLaMA-style 1024-wide base: 16 heads of 64, d_ff 2752 (LLaMA-7B's 11008 / 4), 8k tokens a step.
D1024 = dict(d_model=1024, n_layers=8, head_dim=64, d_ff=2752, vocab_size=32000, seq_len=1024, **LLAMA)
BYTES = dict(vocab_size=256, seq_len=1024)  # examples/gpu.toml's data and context


def shapes() -> list[tuple[str, Any, int]]:
    """(label, config, micro-batch): the 8 shapes of the 2026-11-22 H100 run first, then 33 more,
    one knob moved at a time from a base where one can be."""
    import dataclasses as dc

    from gpu_model_accuracy import shapes as first_run  # benchmarks/ is this script's folder

    from archsearch.space import preset
    from archsearch.space.knobs import config_from_knobs as knobs

    d1024 = {k: v for k, v in D1024.items() if k != "head_dim"}
    gpt2 = preset("gpt2-small")
    d2048 = dict(d_model=2048, n_layers=8, head_dim=128, d_ff=5632, vocab_size=32000, seq_len=2048, **LLAMA)
    return [
        *first_run(),
        # d_model: 8-aligned but not 64 (1032), off the 16 bytes (1020), wider (1536); 16 heads
        # of 64 each time, so the attention does not move with it.
        ("d1032-8al", knobs(n_heads=16, head_dim=64, **{**d1024, "d_model": 1032}), 8),
        ("d1020-misal", knobs(n_heads=16, head_dim=64, **{**d1024, "d_model": 1020}), 8),
        ("d1536", knobs(head_dim=64, **{**d1024, "d_model": 1536, "d_ff": 4096}), 8),
        # d_ff around 4x: 64-aligned, 8-aligned, off the 16 bytes.
        ("d1024-ff4096", knobs(**{**D1024, "d_ff": 4096}), 8),
        ("d1024-ff4104", knobs(**{**D1024, "d_ff": 4104}), 8),
        ("d1024-ff4100", knobs(**{**D1024, "d_ff": 4100}), 8),
        # head_dim: flash attention's favourites (64, 128) against 32, 80, 96 and 256.
        ("d1024-hd32", knobs(**{**D1024, "head_dim": 32}), 8),
        ("d1024-hd128", knobs(**{**D1024, "head_dim": 128}), 8),
        ("d1024-hd256", knobs(**{**D1024, "head_dim": 256}), 8),
        ("d960-hd80", knobs(head_dim=80, **{**d1024, "d_model": 960, "d_ff": 2560}), 8),
        ("d1152-hd96", knobs(head_dim=96, **{**d1024, "d_model": 1152, "d_ff": 3072}), 8),
        # GQA groups at 2048 x 2048 tokens, 16 heads of 128: MHA, 4 and 8 query heads per KV head, MQA.
        ("d2048-kv16", knobs(**d2048), 4),
        ("d2048-kv4", knobs(n_kv_heads=4, **d2048), 4),
        ("d2048-kv2", knobs(n_kv_heads=2, **d2048), 4),
        ("d2048-kv1", knobs(n_kv_heads=1, **d2048), 4),
        # seq_len at the same 8k tokens a step: attention's share grows with it.
        ("d1024-s256-b32", knobs(**{**D1024, "seq_len": 256}), 32),
        ("d1024-s512-b16", knobs(**{**D1024, "seq_len": 512}), 16),
        ("d1024-s2048-b4", knobs(**{**D1024, "seq_len": 2048}), 4),
        ("d1024-s4096-b2", knobs(**{**D1024, "seq_len": 4096}), 2),
        ("d1024-s8192-b1", knobs(**{**D1024, "seq_len": 8192}), 1),
        # vocab: GPT-2's 50257 (the recorded gpt2-small) against nanoGPT's padded 50304.
        ("gpt2-small-v50304", dc.replace(gpt2, vocab_size=50304), 8),
        ("d1024-v50257", knobs(**{**D1024, "vocab_size": 50257}), 8),
        ("d1024-v50304", knobs(**{**D1024, "vocab_size": 50304}), 8),
        # batch: from launch-bound (1 x 1024) to 32k tokens a step.
        ("gpt2-small-b1", gpt2, 1),
        ("gpt2-small-b2", gpt2, 2),
        ("gpt2-small-b4", gpt2, 4),
        ("gpt2-small-b16", gpt2, 16),
        ("d1024-b1", knobs(**D1024), 1),
        ("d1024-b32", knobs(**D1024), 32),
        # what examples/gpu.toml trains: bytes, 1024 tokens, batch 4, its activations, placements
        # and layouts; and a tiny host-bound one.
        ("byte-d512-L4-b4", knobs(d_model=512, n_layers=4, head_dim=64, d_ff=2048, **BYTES), 4),
        ("byte-d1024-L8-sandwich", knobs(d_model=1024, n_layers=8, head_dim=128, n_kv_heads=2, d_ff=2816,
                                         activation="swiglu", norm_placement="sandwich", qk_norm=True,
                                         **BYTES), 4),
        ("byte-d2048-L16-reglu", knobs(d_model=2048, n_layers=16, head_dim=128, n_kv_heads=2, d_ff=5376,
                                       activation="reglu", **BYTES), 4),
        ("byte-d256-L2-b16", knobs(d_model=256, n_layers=2, head_dim=64, d_ff=1024, vocab_size=256,
                                   seq_len=256), 16),
        # FRESH: added 2026-11-27 after the H200 refit, measured before any change to the model it
        # tests. The search's own shapes (bytes, batch 4, its activations, placements and layouts)
        # around the worst misses: the sandwich shape's pre-norm twin, other sandwich widths, ...
        ("fresh-byte-d1024-L8-pre", knobs(d_model=1024, n_layers=8, head_dim=128, n_kv_heads=2, d_ff=2816,
                                          activation="swiglu", **BYTES), 4),
        ("fresh-byte-d768-L6-sandwich", knobs(d_model=768, n_layers=6, head_dim=64, n_kv_heads=3, d_ff=3072,
                                              activation="gelu", norm_placement="sandwich", qk_norm=True,
                                              **BYTES), 4),
        ("fresh-byte-d1280-L10-sandwich", knobs(d_model=1280, n_layers=10, head_dim=64, n_kv_heads=5,
                                                d_ff=3456, activation="swiglu", norm_placement="sandwich",
                                                **BYTES), 4),
        ("fresh-byte-d1536-L12-reglu", knobs(d_model=1536, n_layers=12, head_dim=128, n_kv_heads=3, d_ff=4096,
                                             activation="reglu", qk_norm=True, **BYTES), 4),
        ("fresh-byte-d640-L4-gelu", knobs(d_model=640, n_layers=4, head_dim=128, d_ff=2560, activation="gelu",
                                          **BYTES), 4),
        ("fresh-byte-d1792-L14-sandwich", knobs(d_model=1792, n_layers=14, head_dim=128, n_kv_heads=7,
                                                d_ff=4864, activation="swiglu", norm_placement="sandwich",
                                                qk_norm=True, **BYTES), 4),
        # ... and the batch extremes the step model missed most (d1024 at 32, GPT-2 small at 2).
        ("fresh-d1024-b16", knobs(**D1024), 16),
        ("fresh-d1536-b24", knobs(head_dim=64, **{**d1024, "d_model": 1536, "d_ff": 4096}), 24),
        ("fresh-d2048-L4-b8", knobs(**{**d2048, "n_layers": 4}), 8),
        ("fresh-gpt2-small-b3", gpt2, 3),
        ("fresh-gpt2-medium-b2", preset("gpt2-medium"), 2),
        ("fresh-d512-L8-b2", knobs(head_dim=64, **{**d1024, "d_model": 512, "d_ff": 1408}), 2),
        # FRESH2: added 2026-11-28 after the eager step's bytes and the RMSNorm fusion, measured
        # before any change to how the host's time is charged (a launch's cost is not alike: GPT-2
        # small at batch 2-3 and the fused-norm shapes missed most). GPT-2 small taken apart one
        # of its choices at a time (vocab, norm, bias, positions, tying); the norms' placements
        # one at a time; depth, the parallel block, and mixed host/GPU-bound steps.
        ("fresh2-gpt2-small-v50304-b2", dc.replace(gpt2, vocab_size=50304), 2),
        ("fresh2-gpt2-small-rms-nobias-b2", dc.replace(gpt2, norm="rmsnorm", bias=False), 2),
        ("fresh2-gpt2-small-rope-untied-b2", dc.replace(gpt2, pos_embedding="rope", tie_embeddings=False), 2),
        ("fresh2-gpt2-medium-b1", preset("gpt2-medium"), 1),
        ("fresh2-byte-d1024-L8-qk", knobs(d_model=1024, n_layers=8, head_dim=128, n_kv_heads=2,
                                          d_ff=2816, activation="swiglu", qk_norm=True, **BYTES), 4),
        ("fresh2-byte-d1024-L8-sandwich-noqk", knobs(d_model=1024, n_layers=8, head_dim=128, n_kv_heads=2,
                                                     d_ff=2816, activation="swiglu",
                                                     norm_placement="sandwich", **BYTES), 4),
        ("fresh2-byte-d1024-L16", knobs(d_model=1024, n_layers=16, head_dim=128, n_kv_heads=2, d_ff=2816,
                                        activation="swiglu", **BYTES), 4),
        ("fresh2-byte-d1024-L8-parallel", knobs(d_model=1024, n_layers=8, head_dim=128, n_kv_heads=2,
                                                d_ff=2816, activation="swiglu", parallel_block=True,
                                                **BYTES), 4),
        ("fresh2-byte-d512-L8-gelu-gqa", knobs(d_model=512, n_layers=8, head_dim=64, n_kv_heads=2, d_ff=2048,
                                               activation="gelu", **BYTES), 4),
        ("fresh2-d1024-b2", knobs(**D1024), 2),
        ("fresh2-byte-d2048-L8-sandwich", knobs(d_model=2048, n_layers=8, head_dim=128, n_kv_heads=4,
                                                d_ff=5632, activation="swiglu", norm_placement="sandwich",
                                                qk_norm=True, **BYTES), 4),
        ("fresh2-byte-d1536-L6-reglu-b8", knobs(d_model=1536, n_layers=6, head_dim=128, n_kv_heads=3,
                                                d_ff=4096, activation="reglu", **BYTES), 8),
        # FRESH3: added 2026-11-28 with the host charged per launch and autograd node
        # (`counting.eager_host_ops`), to be measured before any change to it: steps the host bounds,
        # with launches and nodes in other proportions than any recorded (deep and narrow,
        # post-norm, LayerNorm with biases and a learned table, no positions, MQA at batch 1), and a
        # few the GPU bounds or shares.
        ("fresh3-byte-d256-L12-b2", knobs(d_model=256, n_layers=12, head_dim=64, d_ff=1024, **BYTES), 2),
        ("fresh3-byte-d384-L6-gpt-b2", knobs(d_model=384, n_layers=6, head_dim=64, d_ff=1536,
                                             activation="gelu", norm="layernorm", bias=True,
                                             pos_embedding="learned", tie_embeddings=True, **BYTES), 2),
        ("fresh3-byte-d768-L12-mqa-b1", knobs(d_model=768, n_layers=12, head_dim=64, n_kv_heads=1,
                                              d_ff=2048, activation="swiglu", **BYTES), 1),
        ("fresh3-byte-d512-L8-post-b4", knobs(d_model=512, n_layers=8, head_dim=64, d_ff=1408,
                                              activation="geglu", norm_placement="post", **BYTES), 4),
        ("fresh3-byte-d640-L10-nope-b2", knobs(d_model=640, n_layers=10, head_dim=64, d_ff=1792,
                                               activation="reglu", pos_embedding="none", **BYTES), 2),
        ("fresh3-byte-d1024-L4-parallel-sandwich-b2", knobs(d_model=1024, n_layers=4, head_dim=128,
                                                            n_kv_heads=2, d_ff=2816, activation="swiglu",
                                                            parallel_block=True, norm_placement="sandwich",
                                                            **BYTES), 2),
        ("fresh3-gpt2-small-rms-b4", dc.replace(gpt2, norm="rmsnorm"), 4),
        ("fresh3-gpt2-medium-b4", preset("gpt2-medium"), 4),
        ("fresh3-d2048-L2-b1", knobs(**{**d2048, "n_layers": 2}), 1),
        ("fresh3-d1024-L24-b1", knobs(**{**D1024, "n_layers": 24}), 1),
        ("fresh3-d1536-L8-b2", knobs(head_dim=64, **{**d1024, "d_model": 1536, "d_ff": 4096}), 2),
        ("fresh3-byte-d1024-L8-qk-b8", knobs(d_model=1024, n_layers=8, head_dim=128, n_kv_heads=2, d_ff=2816,
                                             activation="swiglu", qk_norm=True, **BYTES), 8),
    ]  # fmt: skip


# Scored on, never fitted to: fixed before any shape was measured, about a third of each group
# (the first run's 8 are all fitted, as the catalogued fit was).
HELD_OUT = frozenset({
    "d1032-8al", "d1024-ff4100", "d1024-hd128", "d960-hd80", "d2048-kv4", "d1024-s512-b16",
    "d1024-s4096-b2", "d1024-v50304", "gpt2-small-b2", "d1024-b32", "byte-d1024-L8-sandwich",
    "byte-d256-L2-b16",
})  # fmt: skip
# Scored on, never fitted to either, each a group of its own: shapes added after a change to the
# step model was made and measured before the next, to judge that next change on shapes it was not
# made to fit. "fresh-": after the H200 refit of 2026-11-27, before the eager step's bytes;
# "fresh2-": after the RMSNorm fusion and the bytes, before any change to the host's cost;
# "fresh3-": after the host was charged per launch and autograd node (not measured yet).
FRESH_GROUPS = {
    "fresh-": "fresh (measured after the refit)",
    "fresh2-": "fresh2 (measured after the bytes)",
    "fresh3-": "fresh3 (measured after the host's autograd nodes)",
}


def smoke_shapes() -> list[tuple[str, Any, int]]:
    """Tiny shapes that run the same path on a CPU in seconds."""
    from archsearch.space.knobs import config_from_knobs as knobs

    tiny = dict(d_model=64, n_layers=2, head_dim=32, d_ff=256, vocab_size=256, seq_len=64)
    return [
        ("t-d64", knobs(**tiny), 4),
        ("t-d64-ff196", knobs(**{**tiny, "d_ff": 196}), 4),
        ("t-d128-mqa", knobs(**{**tiny, "d_model": 128, "n_kv_heads": 1, "d_ff": 384}, activation="swiglu"),
         2),
        ("t-d64-b8", knobs(**tiny), 8),
        ("t-d64-s128", knobs(**{**tiny, "seq_len": 128}), 2),
        ("t-v250", knobs(**{**tiny, "vocab_size": 250}), 4),
        ("fresh-t-d128", knobs(**{**tiny, "d_model": 128, "d_ff": 512}), 2),
    ]  # fmt: skip


SMOKE_HELD_OUT = frozenset({"t-d64-s128", "t-v250"})
# Part 4's shapes: the fit's worst held-out and fitted shapes on the H200, and two it predicts well.
TRACED = (
    "byte-d1024-L8-sandwich",
    "d1024-b32",
    "gpt2-small-b2",
    "byte-d2048-L16-reglu",
    "d1024-ff2752",
    "d1024-b1",
)
SMOKE_TRACED = ("t-d64", "t-d128-mqa")
SMOKE_FIT_GEMMS = ((64, 64, 64), (128, 128, 128), (256, 256, 256), (256, 64, 256), (512, 128, 64))


# ------------------------------------------------------------------------------------------------
# Plumbing: one-line errors, the budget, the record files
# ------------------------------------------------------------------------------------------------


class CampaignError(Exception):
    """Bad input or a record that cannot be resumed here: one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]  # one line, not the usage
        raise CampaignError(message)


class Budget:
    """Seconds this invocation may spend, from its start; None: no limit."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - self.elapsed()

    def allows(self, seconds: float) -> bool:
        return seconds <= self.left()


@dataclass(frozen=True)
class Files:
    """The campaign's records for one device, and where copies go (`--mirror`)."""

    folder: Path
    device: str  # slug of the device's name
    mirror: Path | None = None

    def path(self, suffix: str) -> Path:
        return self.folder / f"gpu_campaign_{self.device}{suffix}"

    @property
    def steps(self) -> Path:
        return self.path("_steps.json")

    @property
    def space(self) -> Path:
        return self.path("_search.toml")

    @property
    def database(self) -> Path:
        return self.path("_search.sqlite")

    @property
    def search(self) -> Path:
        return self.path("_search.json")

    @property
    def serve(self) -> Path:
        return self.path("_serve.json")

    @property
    def trace(self) -> Path:
        return self.path("_trace.json")

    @property
    def log(self) -> Path:
        return self.path(".jsonl")

    def write(self, path: Path, data: bytes) -> None:
        """`path` whole or not at all, and its copy in the mirror."""
        from archsearch.fileio import write_atomic

        write_atomic(path, data)
        if self.mirror is not None:
            write_atomic(self.mirror / path.name, data)

    def write_json(self, path: Path, data: Any) -> None:
        self.write(path, (json.dumps(data, indent=1) + "\n").encode())

    def event(self, event: str, **fields: Any) -> None:
        """One line of the log (the file is rewritten whole, so a kill never leaves half a line)."""
        line = json.dumps({"time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "event": event,
                           **fields})  # fmt: skip
        old = self.log.read_bytes() if self.log.exists() else b""
        self.write(self.log, old + line.encode() + b"\n")


def device_slug(info: Any) -> str:
    """ "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"; any CPU -> "cpu"."""
    return "cpu" if info.type == "cpu" else re.sub(r"[^a-z0-9]+", "-", info.name.lower()).strip("-")


# The catalogued model a GPU's fit starts from, by a word of its name (a CPU: the H100's, which
# exercises the fit without meaning anything).
CATALOGUE_BY_NAME = (
    (r"\bH200\b", "h200"), (r"\bH100\b", "h100-sxm"), (r"\bA100\b", "a100-80gb"), (r"\bL4\b", "l4"),
    (r"\b4090\b", "rtx4090"),
)  # fmt: skip


def catalogue_model(device: dict[str, Any], asked: str) -> str:
    """The catalogue key for `device` (`DeviceInfo.to_dict()`): `asked`, or by its name ("auto")."""
    from archsearch.evaluators.catalogue import ACCELERATORS

    if asked != "auto":
        if asked not in ACCELERATORS:
            raise CampaignError(
                f"--model {asked!r} is not catalogued; valid: auto, {', '.join(ACCELERATORS)}"
            )
        return asked
    if device["type"] == "cpu":
        return "h100-sxm"
    for pattern, key in CATALOGUE_BY_NAME:
        if re.search(pattern, device["name"]):
            return key
    raise CampaignError(f"no catalogued model for {device['name']!r}; name one with --model")


# ------------------------------------------------------------------------------------------------
# Part 1: real steps, fitted on a fixed part and scored on the rest
# ------------------------------------------------------------------------------------------------


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CampaignError(f"cannot resume from {path}: {exc}") from None


def _same_device(raw: dict[str, Any], info: Any, path: Path) -> None:
    recorded = raw.get("device", {})
    if recorded.get("fingerprint") != info.fingerprint:
        raise CampaignError(
            f"{path} was recorded on {recorded.get('name')} with torch {recorded.get('torch_version')} "
            f"(fingerprint {recorded.get('fingerprint')}), this is {info.name} with torch "
            f"{info.torch_version} ({info.fingerprint}); record into another --out"
        )


def part_steps(args: argparse.Namespace, info: Any, files: Files, budget: Budget) -> None:
    from archsearch.evaluators import step_record
    from archsearch.evaluators.counting import eager_kernel_count
    from archsearch.evaluators.profiler import InMemoryCache, ProfilerError, resolve_precision

    every = smoke_shapes() if args.smoke else shapes()
    # --only: the shapes measured; every other shape's record is kept, fitted on and scored.
    table = [row for row in every if row[0].startswith(args.only or "")]
    raw = _load(files.steps)
    if raw is None:
        # What training runs here: bf16 on a GPU (what the catalogued models model), fp32 on a CPU
        # without native bf16, whose emulated bf16 would time nothing a run ever does.
        raw = step_record.run_header(info, args.min_run_time, resolve_precision(info, "auto"))
    else:
        _same_device(raw, info, files.steps)
    dtype = raw["dtype"]
    # A record is kept while its shape and the step the trainer runs for it (its launches) are
    # today's: a label whose config changed, or whose step now launches other kernels (the
    # trainer's code changed), is measured again.
    wanted = {label: (cfg.to_dict(), batch, eager_kernel_count(cfg)) for label, cfg, batch in every}
    if args.retry_failed:
        raw["failed"] = []
    failed = {f["label"] for f in raw.setdefault("failed", [])}
    kept = [
        e for e in raw["shapes"] if wanted.get(e["label"]) == (e["config"], e["batch"], e.get("launches"))
    ]
    if len(kept) < len(raw["shapes"]):
        dropped = sorted({e["label"] for e in raw["shapes"]} - {e["label"] for e in kept})
        print(f"part 1: dropped {len(dropped)} record(s) whose shape or step changed: {', '.join(dropped)}")
        raw["shapes"] = kept
    done = {e["label"] for e in kept} | failed
    todo = [(label, cfg, batch) for label, cfg, batch in table if label not in done]
    if done or raw["fit_gemms"]:
        note = f" ({len(failed)} failed: --retry-failed measures them again)" if failed else ""
        print(f"part 1: resumed {files.steps.name}: {len(kept)} of {len(every)} shapes recorded{note}, "
              f"{len(todo)} to measure", flush=True)  # fmt: skip
    files.event("part 1 start", recorded=len(done), to_measure=len(todo))
    if not raw["fit_gemms"]:
        gemms = SMOKE_FIT_GEMMS if args.smoke else step_record.FIT_GEMMS
        t0 = time.perf_counter()
        raw["fit_gemms"] = step_record.time_fit_gemms(gemms, info, args.min_run_time, dtype)
        files.write_json(files.steps, raw)
        print(f"part 1: fit set: {len(gemms)} GEMMs in {time.perf_counter() - t0:.1f} s", flush=True)
    cache = InMemoryCache()  # a kernel shared by two shapes is timed once per invocation
    measured = 0
    for label, cfg, batch in todo:
        expected = _expected_seconds(raw, info)
        if not budget.allows(expected):
            print(f"part 1: budget spent ({budget.elapsed():.0f} of {budget.seconds:g} s; the next shape "
                  f"takes about {expected:.0f} s): {len(todo) - measured} shapes left, run again to resume",
                  flush=True)  # fmt: skip
            files.event("part 1 budget spent", measured=measured, left=len(todo) - measured)
            break
        try:
            entry = step_record.measure_shape(
                label, cfg, batch, args.device, cache, args.min_run_time, dtype, args.train_steps
            )
        except Exception as exc:  # one shape's failure is recorded; the others are still measured
            error = str(exc) if isinstance(exc, ProfilerError) else f"{type(exc).__name__}: {exc}"
            raw["failed"].append({"label": label, "config": cfg.to_dict(), "batch": batch, "error": error})
            files.write_json(files.steps, raw)
            print(f"part 1: {label}: not measured: {error}", flush=True)
            _check_device(info)  # a lost CUDA context fails every later shape: stop here instead
            continue
        raw["shapes"].append({**entry, "launches": wanted[label][2]})
        files.write_json(files.steps, raw)
        measured += 1
        real = entry["train_step_s"]
        step = f"real step {real * 1e3:.2f} ms" if real else entry.get("error", "no real step")
        print(f"part 1: {label} ({len(raw['shapes'])}/{len(every)}): {step}, measured in "
              f"{entry['measure_s']:.1f} s", flush=True)  # fmt: skip
    else:
        files.event("part 1 measured", measured=measured, recorded=len(raw["shapes"]))
        step_rounds(args, info, raw, files, budget)
    score_steps(raw, args.model, SMOKE_HELD_OUT if args.smoke else HELD_OUT, files)


def step_rounds(
    args: argparse.Namespace, info: Any, raw: dict[str, Any], files: Files, budget: Budget
) -> None:
    """Time every recorded shape's real step again, in passes over the whole table, until each has
    `--step-rounds` timings; its step is their median. One timing per shape left the fit chasing the
    host's drift: on the H200 (2026-11-26) shapes with the same launches and almost the same
    kernels, timed minutes apart, took 28.4 to 38.6 ms. Passes spread a shape's timings over the
    campaign, and the first shape's (timed on a cold process) is outvoted."""
    from archsearch.evaluators.step_record import time_train_step
    from archsearch.space.config import ArchConfig

    # A shape's first timing (measure_shape's, or a record's from before the rounds) is its first round.
    for entry in raw["shapes"]:
        if entry.get("train_step_s") and "train_step_rounds_s" not in entry:
            entry["train_step_rounds_s"] = [entry["train_step_s"]]
    slowest = 30.0 if info.type == "cuda" else 2.0  # seconds one timing takes, until one is seen
    timed = 0
    for round_ in range(2, args.step_rounds + 1):
        for entry in raw["shapes"]:
            rounds = entry.get("train_step_rounds_s")
            if not rounds or len(rounds) >= round_:
                continue
            if not budget.allows(1.25 * slowest):
                print(f"part 1: budget spent in round {round_} of the real steps ({timed} timed); run again "
                      "to resume", flush=True)  # fmt: skip
                files.event("part 1 rounds budget spent", timed=timed, round=round_)
                return
            t0 = time.perf_counter()
            try:
                cfg = ArchConfig.from_dict(entry["config"])
                seconds = time_train_step(cfg, entry["batch"], info, raw["dtype"], args.train_steps)
                # Beside it, the same steps back to back, as the trainer (and so a search's
                # measured step) runs them: what a modelled device should be compared with.
                unsynced = time_train_step(
                    cfg, entry["batch"], info, raw["dtype"], args.train_steps, synchronize_each=False
                )
            except (RuntimeError, MemoryError) as exc:  # an OOM now: the timings recorded stand
                print(f"part 1: {entry['label']}: round {round_} not timed: {str(exc).splitlines()[0]}")
                _check_device(info)
                continue
            slowest = max(slowest if timed else 0.0, time.perf_counter() - t0)
            rounds.append(seconds)
            entry.setdefault("train_step_back_to_back_s", []).append(unsynced)
            entry["train_step_s"] = statistics.median(rounds)
            files.write_json(files.steps, raw)
            timed += 1
    spreads = [max(e["train_step_rounds_s"]) / min(e["train_step_rounds_s"]) - 1
               for e in raw["shapes"] if len(e.get("train_step_rounds_s", ())) > 1]  # fmt: skip
    if timed:
        files.event("part 1 rounds", timed=timed)
    if spreads:
        print(f"part 1: real steps timed {args.step_rounds} times each, in separate passes: spread (slowest "
              f"over fastest) median {statistics.median(spreads):.1%}, worst {max(spreads):.1%} over "
              f"{len(spreads)} shapes; each shape's step is its median", flush=True)  # fmt: skip
    ratios = [statistics.median(e["train_step_back_to_back_s"]) / e["train_step_s"]
              for e in raw["shapes"] if e.get("train_step_back_to_back_s")]  # fmt: skip
    if ratios:
        print(f"part 1: back to back, as the trainer runs them, a step takes "
              f"{statistics.median(ratios):.2f}x the synchronised one at the median "
              f"({min(ratios):.2f}-{max(ratios):.2f}x over {len(ratios)} shapes)", flush=True)  # fmt: skip


def _check_device(info: Any) -> None:
    """Raise if the CUDA device no longer runs work (a sticky error poisons the context)."""
    if info.type == "cuda":
        import torch

        torch.cuda.synchronize(info.torch_device)


def _expected_seconds(raw: dict[str, Any], info: Any) -> float:
    """What the next shape will probably take: the slowest recorded so far, with a margin."""
    times = [e["measure_s"] for e in raw["shapes"] if "measure_s" in e]
    if not times:
        return 60.0 if info.type == "cuda" else 5.0
    return 1.25 * max(times)


def _fresh_group(label: str) -> str | None:
    """The `FRESH_GROUPS` prefix `label` starts with, if any."""
    return next((prefix for prefix in FRESH_GROUPS if label.startswith(prefix)), None)


def score_steps(
    raw: dict[str, Any], model: str, held_out: frozenset[str], files: Files | None
) -> dict | None:
    """Fit on the recorded shapes not held out (as `fit-device`), predict the held-out ones."""
    from archsearch.errors import ConfigError
    from archsearch.evaluators.counting import eager_kernel_count
    from archsearch.evaluators.step_fit import held_out_fit

    for f in raw.get("failed", []):
        print(f"part 1: {f['label']} was not measured: {f['error']}")
    timed = [e for e in raw["shapes"] if e.get("train_step_s")]
    held = {e["label"] for e in timed if e["label"] in held_out or _fresh_group(e["label"])}
    fitted = [e for e in timed if e["label"] not in held]
    if len(fitted) < 2:  # a partial record between parts: nothing to fit yet
        print(f"part 1: {len(raw['shapes'])} shapes recorded, {len(timed)} with a real step: too few to fit")
        return None
    print(f"part 1: {len(raw['shapes'])} shapes recorded, {len(timed)} with a real step: fitting {model} on "
          f"{len(fitted)} as `archsearch fit-device` does, scoring it on {len(held)} held out")  # fmt: skip
    try:
        fit, holdouts = held_out_fit(raw, model, eager_kernel_count, held)
    except ConfigError as exc:  # too few shapes yet: a partial record is normal between parts
        print(f"part 1: no fit yet: {exc}")
        return None
    print(f"  {'shape':<30} {'batch':>5} {'real ms':>9} {'model ms':>9} {'error':>7}")
    for record, predicted in zip(fit.records, fit.predicted, strict=True):
        real = record.real_step_s
        print(f"  {record.label:<30} {record.batch:>5} {real * 1e3:>9.2f} {predicted * 1e3:>9.2f} "
              f"{predicted / real - 1:>+7.1%}  fitted")  # fmt: skip
    for h in holdouts:
        batch = next(e["batch"] for e in timed if e["label"] == h.label)
        print(f"  {h.label:<30} {batch:>5} {h.real_step_s * 1e3:>9.2f} {h.predicted_s * 1e3:>9.2f} "
              f"{h.error:>+7.1%}  held out")  # fmt: skip
    in_fit = [abs(p / r.real_step_s - 1) for p, r in zip(fit.predicted, fit.records, strict=True)]
    summary: dict[str, Any] = {
        "model": model, "fitted_shapes": len(fit.records),
        "fitted_median": statistics.median(in_fit), "fitted_worst": max(in_fit),
    }  # fmt: skip
    print(f"part 1: fitted shapes: median |error| {summary['fitted_median']:.1%}, worst "
          f"{summary['fitted_worst']:.1%}")  # fmt: skip
    groups = {"held_out": ("held out in advance", [h for h in holdouts if not _fresh_group(h.label)])}
    for prefix, name in FRESH_GROUPS.items():
        groups[prefix.rstrip("-")] = (name, [h for h in holdouts if _fresh_group(h.label) == prefix])
    for key, (name, group) in groups.items():
        if not group:
            continue
        worst = max(group, key=lambda h: abs(h.error))
        summary |= {
            f"{key}_shapes": len(group), f"{key}_median": statistics.median(abs(h.error) for h in group),
            f"{key}_worst": abs(worst.error), f"{key}_worst_shape": worst.label,
        }  # fmt: skip
        print(f"part 1: {name}: median |error| {summary[f'{key}_median']:.1%}, worst "
              f"{summary[f'{key}_worst']:.1%} ({worst.label}) over {len(group)} shapes")  # fmt: skip
    if files is not None:
        files.event("part 1 scored", **summary)
        shown = files.steps.relative_to(ROOT) if files.steps.is_relative_to(ROOT) else files.steps
        print(f"part 1: the fit on every shape: archsearch fit-device {shown} --device {model}")
    return summary


# ------------------------------------------------------------------------------------------------
# Part 2: the GPU example searched end to end
# ------------------------------------------------------------------------------------------------


def search_space(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """examples/gpu.toml with the proxy cut to a campaign's and pruning allowed after 2 trials (the
    example's 8 would never prune a handful). The trial count is the command's (`--trials`): a
    study resumes with another, and the file stays the same."""
    spec = tomllib.loads(GPU_SPACE.read_text())
    spec["proxy"] |= {"tokens": args.search_tokens, "device": args.device}
    spec["search"]["prune_min_trials"] = 2
    if model not in spec["profile"]["devices"]:
        spec["profile"]["devices"].append(model)  # this GPU, modelled beside its measurement
    if args.smoke:
        shrink_for_smoke(spec)
        spec["profile"]["min_run_time"] = 0.01
        spec["search"]["prune_min_trials"] = 1
        # Promotion exercised on the fewest shapes and one step up: the example's 8 to 4x took 7x
        # the first pass's tokens, most of the smoke's search.
        spec["search"]["promote"] = {"cap": 2, "max_contenders": 2}
    return spec


def shrink_for_smoke(spec: dict[str, Any]) -> None:
    """Tiny shapes on a CPU: the same tables, small enough for seconds a trial (parts 2 and 5)."""
    spec["model"] |= {
        "seq_len": 64, "d_model": {"min": 64, "max": 128, "step": 64},
        "aspect_ratio": {"min": 32, "max": 64, "step": 32}, "head_dim": [32],
        "attention_layout": ["mha", "gqa:2"],
    }  # fmt: skip
    spec["rules"]["multiple_of"] = 64
    spec["budget"]["params"] = {"min": 1e4, "max": 2e6}
    spec["proxy"] |= {"precision": "auto", "threads": 1}


def to_toml(spec: dict[str, Any]) -> str:
    """A spec of tables of scalars, lists and inline tables as TOML text (no writer in the stdlib)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        raise TypeError(f"cannot write {v!r} as TOML")

    tables = [
        f"[{name}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in table.items())
        for name, table in spec.items()
    ]
    return "# Generated by benchmarks/gpu_campaign.py from examples/gpu.toml: do not edit.\n\n" + "\n".join(
        tables
    )


def part_search(args: argparse.Namespace, model: str, files: Files, budget: Budget) -> None:
    text = to_toml(search_space(args, model))
    if files.space.exists() and files.space.read_text() != text:
        raise CampaignError(
            f"{files.space} holds the recorded study's space, with other settings than these "
            "(--search-tokens, the device or the example changed); record into another --out"
        )
    files.write(files.space, text.encode())
    work = Path(tempfile.mkdtemp(prefix="gpu_campaign."))
    try:
        db = work / "search.db"
        if files.database.exists():
            shutil.copyfile(files.database, db)
        before = _study_counts(db)
        if before:
            from archsearch.trial import FINISHED

            finished = sum(before.get(state, 0) for state in FINISHED)
            print(f"part 2: resumed {files.database.name}: study {STUDY} has {finished} of "
                  f"{args.search_trials} trials finished", flush=True)  # fmt: skip
            if finished >= args.search_trials:
                print("part 2: nothing to run")
                _record_search(db, files, model)
                return
        files.event("part 2 start", counts=before)
        status = _run_search(args, db, files, budget)
        if status is None:
            return
        snapshot(db, files)
        files.event("part 2 search exited", status=status, counts=_study_counts(db))
        _record_search(db, files, model)
        if status != 0:
            print(f"part 2: the search exited {status}; run again to resume", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _study_counts(db: Path) -> dict[str, int]:
    if not db.exists():
        return {}
    from archsearch.storage import Storage

    with Storage.open(f"sqlite:///{db}", create=False) as storage:
        record = storage.study(STUDY)
        return dict(record.counts or {}) if record is not None else {}


def _run_search(args: argparse.Namespace, db: Path, files: Files, budget: Budget) -> int | None:
    """`archsearch search` as a real process, its output streamed; stopped with SIGTERM when the
    budget runs out (it re-queues the running trial), or when no trial has finished `FIRST_TRIAL_S`
    after it started (a GPU trial Ray cannot place waits forever); a smoke run's without a budget
    runs in this process. Returns its exit status (None: not run)."""
    from archsearch.trial import FINISHED

    if not budget.allows(SEARCH_START_S + STOP_GRACE_S):
        print(f"part 2: budget spent ({budget.left():.0f} s left, a search needs "
              f"{SEARCH_START_S + STOP_GRACE_S:.0f}); run again to resume", flush=True)  # fmt: skip
        return None

    def finished() -> int:
        counts = _study_counts(db)
        return sum(counts.get(state, 0) for state in FINISHED)

    argv = [
        sys.executable, "-m", "archsearch", "search", "--space", str(files.space), "--study", STUDY,
        "--storage", f"sqlite:///{db}", "--trials", str(args.search_trials), "--workers", "1", "--resume",
    ]  # fmt: skip
    if _is_cuda(args.device):
        argv += ["--gpus-per-trial", f"{args.gpus_per_trial:g}"]
    print("+ " + " ".join(["archsearch", *argv[3:]]), flush=True)
    if args.address:  # not in the command shown: the study's record is the same either way
        argv += ["--address", args.address]
    if args.smoke and budget.seconds is None:
        # The same command in this process: without a budget there is nothing to stop it for, and a
        # process of its own imported torch again (seconds of CPU on the shared host a smoke runs on).
        from archsearch.cli import app

        return int(app(argv[3:], prog_name="archsearch", standalone_mode=False) or 0)
    finished_before = finished()
    proc = subprocess.Popen(argv, cwd=ROOT)
    next_copy = time.monotonic() + SNAPSHOT_EVERY_S
    stop_at = budget.left() - STOP_GRACE_S if budget.seconds is not None else float("inf")
    started, watching = time.monotonic(), True
    try:
        while proc.poll() is None:
            time.sleep(1.0)
            now = time.monotonic()
            if now >= next_copy and db.exists():
                snapshot(db, files)
                next_copy = now + SNAPSHOT_EVERY_S
            stuck = False
            if watching and now - started >= FIRST_TRIAL_S:  # checked once
                watching, stuck = False, finished() == finished_before
            if stuck or now - started >= stop_at:
                why = "budget spent"
                if stuck:
                    why = (f"no trial finished in {FIRST_TRIAL_S:.0f} s (does Ray see the GPU? try "
                           "--gpus-per-trial 0)")  # fmt: skip
                print(f"part 2: {why}: stopping the search (SIGTERM); run again to resume", flush=True)
                files.event("part 2 stopped", why=why)
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                break
        return proc.wait()
    except BaseException:
        if proc.poll() is None:  # our own interruption: the search stops its trial and exits
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=STOP_GRACE_S)
        raise


def _is_cuda(device: str) -> bool:
    return device.split(":")[0] == "cuda"


def snapshot(db: Path, files: Files) -> None:
    """A consistent, self-contained copy of the live database (SQLite's backup API) as the record."""
    import sqlite3

    tmp = db.with_name(db.name + ".snapshot")
    tmp.unlink(missing_ok=True)
    src, dst = sqlite3.connect(db), sqlite3.connect(tmp)
    try:
        src.backup(dst)
        dst.execute("PRAGMA journal_mode = DELETE")  # one file, no -wal beside it
    finally:
        src.close()
        dst.close()
    files.write(files.database, tmp.read_bytes())
    tmp.unlink()


def _record_search(db: Path, files: Files, model: str) -> dict[str, Any] | None:
    """The study's trials as JSON beside the database, and a summary on stdout."""
    from archsearch.evaluators.counting import eager_kernel_count
    from archsearch.storage import Storage
    from archsearch.trial import FINISHED

    if not db.exists():
        return None
    with Storage.open(f"sqlite:///{db}", create=False) as storage:
        study = storage.study(STUDY)
        if study is None:
            print("part 2: no study recorded yet")
            return None
        # The kernels each trial's step launched, as counted when it was first recorded: a later
        # change to the trainer must not re-price steps measured before it (`score_search`).
        before = {t["number"]: t.get("launches") for t in (_load(files.search) or {}).get("trials", [])}
        trials = []
        for t in storage.trials(STUDY):
            profiles = {p.device: p.step_time_s for p in storage.profiles(t.id)}
            launches = before.get(t.number) or (eager_kernel_count(t.config) if t.config else None)
            trials.append({
                "number": t.number, "status": t.status, "reason": t.reason,
                "config": t.config.to_dict() if t.config else None, "launches": launches,
                **{k: t.values.get(k) for k in ("params_total", "loss", "flops_forward_per_token", "steps",
                                                "train_seconds", "tokens_per_second", "mfu", "precision",
                                                "pruned_rung", "step_time_s", "step_time_device")},
                "profiles": profiles,
            })  # fmt: skip
        counts = dict(study.counts or {})
    data = {"study": STUDY, "space": files.space.name, "model": model, "counts": counts, "trials": trials}
    files.write_json(files.search, data)
    print(f"part 2: study {STUDY}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    for t in trials:
        if t["status"] not in FINISHED:
            continue
        cfg = t["config"] or {}
        local, modelled = t["profiles"].get("local"), t["profiles"].get(model)
        vs = (
            f", {model} model {modelled * 1e3:.2f} ms ({modelled / local - 1:+.1%})"
            if local and modelled
            else ""
        )
        step = f"step {local * 1e3:.2f} ms{vs}" if local else ""
        loss = f"loss {t['loss']:.4f}" if t["loss"] is not None else ""
        print(f"  trial {t['number']}: {t['status']:<8} d{cfg.get('d_model')} L{cfg.get('n_layers')} "
              f"{cfg.get('activation')} {loss} {step} {t['reason'] or ''}".rstrip())  # fmt: skip
    errors = [
        abs(t["profiles"][model] / t["profiles"]["local"] - 1)
        for t in trials if t["profiles"].get("local") and t["profiles"].get(model)
    ]  # fmt: skip
    if errors:
        print(f"part 2: {model} model against the measured step of {len(errors)} trials: median |error| "
              f"{statistics.median(errors):.1%}, worst {max(errors):.1%}")  # fmt: skip
    return data


# ------------------------------------------------------------------------------------------------
# Part 3: prefill and decode against the serving model
# ------------------------------------------------------------------------------------------------


def fidelity_space(args: argparse.Namespace, corpus: dict[str, Any]) -> str:
    """Part 5's space as TOML: examples/gpu.toml at 5-50M parameters on the BPE corpus, its path
    relative to the repository when inside it (so a resume elsewhere reads the same plan)."""
    path = Path(corpus["path"])
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    example = tomllib.loads(GPU_SPACE.read_text())
    spec = gpu_campaign_fidelity.space_dict(example, corpus["vocab_size"], shown)
    if args.smoke:
        shrink_for_smoke(spec)
        gpu_campaign_fidelity.shrink_for_smoke(spec)
    return to_toml(spec)


def build_corpus(args: argparse.Namespace) -> dict[str, Any]:
    """The BPE corpus part 5 trains on (built once, benchmarks/gpu_corpus.py), with its data
    fingerprint; the smoke's is a tiny one beside its records."""
    import gpu_corpus

    from archsearch.evaluators.data import load_dataset

    folder = (args.out / "smoke-corpus" if args.smoke else args.corpus or CORPUS).absolute()
    t0 = time.perf_counter()
    if args.smoke:
        meta = gpu_corpus.build(folder, gpu_corpus.SMOKE["vocab"], gpu_corpus.SMOKE["max_bytes"], "uint32")
    else:
        meta = gpu_corpus.build(folder)
    data = load_dataset(folder, meta["vocab_size"], meta["dtype"])
    print(f"part 5: corpus {gpu_corpus.describe(meta, folder)} (ready in {time.perf_counter() - t0:.1f} s)",
          flush=True)  # fmt: skip
    return {**meta, "path": str(folder), "fingerprint": data.fingerprint}


def part_fidelity(args: argparse.Namespace, info: Any, files: Files, budget: Budget) -> None:
    """Part 5 (benchmarks/gpu_campaign_fidelity.py): the fidelity set, trained and scored."""
    corpus = build_corpus(args)
    record = gpu_campaign_fidelity.Record(files.path("_fidelity.jsonl"), files.write, args.model)
    if (recorded := record.plan()) is not None:
        _same_device(recorded, info, record.path)
    files.event("part 5 start", recorded=len(record.runs()))
    try:
        runs = gpu_campaign_fidelity.run(
            info, record, fidelity_space(args, corpus), corpus, budget, args.smoke, args.address
        )
    except ValueError as exc:  # another plan recorded in these records
        raise CampaignError(str(exc)) from None
    summary = gpu_campaign_fidelity.score(record.plan() or {}, runs)
    if summary is not None:
        files.event(
            "part 5 scored", **{k: summary[k] for k in ("shapes", "spearman", "params_spearman", "pairs")}
        )


def part_serve(args: argparse.Namespace, info: Any, files: Files, budget: Budget) -> None:
    record = _load(files.serve)
    if record is not None:
        _same_device(record, info, files.serve)
    record = gpu_campaign_serve.run(args, info, files, budget, record)
    summary = gpu_campaign_serve.score(record, args.model)
    if summary is not None:
        files.event("part 3 scored", **summary)


def part_trace(args: argparse.Namespace, info: Any, files: Files, budget: Budget) -> None:
    """Part 4: each of `TRACED` (the smoke's `SMOKE_TRACED`) profiled once, recorded as it ends."""
    from archsearch.evaluators.profiler import resolve_precision
    from archsearch.evaluators.step_record import trace_train_step

    table = {label: (cfg, batch) for label, cfg, batch in (smoke_shapes() if args.smoke else shapes())}
    record = _load(files.trace)
    if record is None:
        record = {"device": info.to_dict(), "dtype": resolve_precision(info, "auto"), "shapes": {}}
    else:
        _same_device(record, info, files.trace)
    todo = [label for label in (SMOKE_TRACED if args.smoke else TRACED) if label not in record["shapes"]]
    print(f"part 4: {len(record['shapes'])} shapes traced, {len(todo)} to trace", flush=True)
    files.event("part 4 start", recorded=len(record["shapes"]), to_trace=len(todo))
    for i, label in enumerate(todo):
        if not budget.allows(60.0 if info.type == "cuda" else 10.0):
            print(f"part 4: budget spent: {len(todo) - i} shapes left, run again to resume", flush=True)
            files.event("part 4 budget spent", left=len(todo) - i)
            break
        cfg, batch = table[label]
        try:
            entry = trace_train_step(cfg, batch, info, record["dtype"])
        except (RuntimeError, MemoryError) as exc:  # an OOM: the others are still traced
            print(f"part 4: {label}: not traced: {str(exc).splitlines()[0]}", flush=True)
            _check_device(info)
            continue
        record["shapes"][label] = {"config": cfg.to_dict(), "batch": batch, **entry}
        files.write_json(files.trace, record)
        print_trace(label, record["shapes"][label])
    else:
        files.event("part 4 traced", shapes=len(record["shapes"]))


def print_trace(label: str, entry: dict[str, Any], top: int = 5) -> None:
    """One traced step: wall and device time, launches against the model's count, its top kernels."""
    from archsearch.evaluators.counting import eager_kernel_count
    from archsearch.space.config import ArchConfig

    counted = eager_kernel_count(ArchConfig.from_dict(entry["config"]))
    busy = entry["device_s"] / entry["wall_s"]
    print(f"part 4: {label} (batch {entry['batch']}): {entry['wall_s'] * 1e3:.2f} ms a step under the "
          f"profiler, kernels {entry['device_s'] * 1e3:.2f} ms ({busy:.0%}), {entry['calls']:.0f} launches "
          f"(the model counts {counted})", flush=True)  # fmt: skip
    for k in entry["top"][:top]:
        print(f"    {k['seconds'] * 1e3:8.3f} ms  {k['calls']:6.0f}x  {k['name'][:90]}")


# ------------------------------------------------------------------------------------------------


def report(args: argparse.Namespace) -> None:
    """Score what `--out` holds, on any machine: every device's records of each part."""
    kinds = ("steps", "search", "serve", "trace")
    found = [p for kind in kinds for p in sorted(args.out.glob(f"gpu_campaign_*_{kind}.json"))]
    fidelity = sorted(args.out.glob("gpu_campaign_*_fidelity.jsonl"))
    for path in fidelity:
        print(f"== {path.name}")
        record = gpu_campaign_fidelity.Record(path, None, "")
        gpu_campaign_fidelity.score(record.plan() or {}, record.runs())
    if not found and not fidelity:
        raise CampaignError(f"no campaign records in {args.out}")
    for path in found:
        print(f"== {path.name}")
        raw = _load(path)
        if path.name.endswith("_steps.json"):
            held = SMOKE_HELD_OUT if raw["device"]["type"] == "cpu" else HELD_OUT
            model = catalogue_model(raw["device"], args.model)
            score_steps(raw, model, held, None)
        elif path.name.endswith("_serve.json"):
            gpu_campaign_serve.score(raw, catalogue_model(raw["device"], args.model))
        elif path.name.endswith("_trace.json"):
            for label, entry in raw["shapes"].items():
                print_trace(label, entry)
        else:
            print(f"study {raw['study']}: " + ", ".join(f"{n} {s}" for s, n in sorted(raw["counts"].items())))
            model = raw["model"] if args.model == "auto" else catalogue_model({}, args.model)
            score_search(raw, model, path.parent / raw["space"])


def score_search(raw: dict[str, Any], model: str, space: Path) -> dict[str, float] | None:
    """Each finished trial's measured step (its local profile) against `model` as it models it now
    (the stored modelled profiles are the catalogue's at search time); `space`: the search's file."""
    from archsearch.evaluators.counting import eager_host_ops, eager_kernel_count, eager_memory_ops
    from archsearch.evaluators.hardware import modelled_profile
    from archsearch.space.config import ArchConfig

    batch = tomllib.loads(space.read_text())["proxy"]["batch_size"]
    errors = []
    for t in raw["trials"]:
        local = t["profiles"].get("local")
        if not (local and t["config"]):
            continue
        cfg = ArchConfig.from_dict(t["config"])
        memory = eager_memory_ops(cfg, batch, "bf16")
        launches = t.get("launches") or eager_kernel_count(cfg)  # the step as it was measured
        # The host's ops: the launches as measured and today's autograd nodes, as
        # `step_fit.StepRecord.host_ops` counts a recorded step's.
        host_ops = launches + eager_host_ops(cfg) - eager_kernel_count(cfg)
        report = modelled_profile(
            cfg, model, batch, "bf16", launches=launches, memory_ops=memory, host_ops=host_ops
        )
        assert report is not None  # a catalogued model
        errors.append(report.step_time_s / local - 1)
        print(f"  trial {t['number']}: {cfg.describe()}: measured {local * 1e3:.2f} ms, {model} now "
              f"{report.step_time_s * 1e3:.2f} ms ({errors[-1]:+.1%})")  # fmt: skip
    if not errors:
        return None
    summary = {"median": statistics.median(abs(e) for e in errors), "worst": max(abs(e) for e in errors)}
    print(f"part 2: {model} as modelled now against the measured step of {len(errors)} trials: median "
          f"|error| {summary['median']:.1%}, worst {summary['worst']:.1%}")  # fmt: skip
    return summary


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--parts",
        default=",".join(map(str, DEFAULT_PARTS)),
        help="comma-separated parts to run (default 1,2,3,4; run in the order 1, 2, 5, 3, 4): "
        + ", ".join(f"{n} {name}" for n, name in PARTS.items()),
    )
    parser.add_argument("--part", type=int, help="one part (as --parts N)")
    parser.add_argument(
        "--budget-s", type=float, help="seconds this invocation may spend (default: no limit)"
    )
    parser.add_argument("--out", type=Path, default=DATA, help="records folder (default benchmarks/data)")
    parser.add_argument("--mirror", type=Path, help="also write every record here (on a lent machine: $OUT)")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument(
        "--model", default="auto", help="catalogued model the fit starts from (auto: by name)"
    )
    parser.add_argument("--min-run-time", type=float, help="seconds of repeats per kernel (0.1)")
    parser.add_argument("--train-steps", type=int, help="real steps timed per shape, after 3 more (10)")
    parser.add_argument(
        "--step-rounds", type=int, help="part 1: times each shape's real step is timed, in passes (3)"
    )
    parser.add_argument(
        "--serve-rounds", type=int, help="part 3: times each point is measured, in passes (3)"
    )
    parser.add_argument("--search-tokens", type=int, help="part 2's proxy tokens per trial (3,000,000)")
    parser.add_argument("--search-trials", type=int, help="part 2's finished trials (8)")
    parser.add_argument(
        "--gpus-per-trial", type=float, default=1.0, help="part 2 on CUDA: Ray GPUs per trial"
    )
    parser.add_argument(
        "--address", help="a Ray cluster parts 2 and 5 join (default: each starts a local one)"
    )
    parser.add_argument("--retry-failed", action="store_true", help="part 1: measure failed shapes again")
    parser.add_argument("--only", help="part 1: measure only the shapes whose label starts so (fresh3-)")
    parser.add_argument(
        "--corpus",
        type=Path,
        help=f"part 5's BPE corpus folder, built if missing ({CORPUS.relative_to(ROOT)})",
    )
    parser.add_argument(
        "--sitting", action="store_true",
        help="one sitting: parts 1 (only the fresh3- shapes), 5 and 3, in that order",
    )  # fmt: skip
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the planned device seconds and carried bytes; run nothing",
    )
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shapes and budgets: about a minute")
    parser.add_argument("--report", action="store_true", help="score the records in --out; measure nothing")
    args = parser.parse_args(argv)
    if args.sitting:
        if args.part is not None or args.parts != ",".join(map(str, DEFAULT_PARTS)):
            raise CampaignError("--sitting names its parts (1, 5, 3): leave out --part and --parts")
        args.parts = ",".join(map(str, SITTING["parts"]))
        args.only = args.only or SITTING["smoke_only" if args.smoke else "only"]
    try:
        parts = [args.part] if args.part is not None else [int(p) for p in args.parts.split(",") if p.strip()]
    except ValueError:
        raise CampaignError(f"--parts must be numbers, got {args.parts!r}") from None
    for part in parts:
        if part not in PARTS:
            raise CampaignError(
                f"no part {part}; parts: " + ", ".join(f"{n} {name}" for n, name in PARTS.items())
            )
    if not parts:
        raise CampaignError("no part to run")
    args.parts = [part for part in RUN_ORDER if part in parts]
    if args.budget_s is not None and not args.budget_s > 0:
        raise CampaignError(f"--budget-s must be positive, got {args.budget_s:g}")
    # Defaults, a campaign's or (--smoke) a CPU minute's; a value given is kept either way.
    defaults = SMOKE_DEFAULTS if args.smoke else DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.smoke:
        args.device = "cpu"
    if not args.min_run_time > 0:
        raise CampaignError(f"--min-run-time must be positive, got {args.min_run_time:g}")
    counts = (args.train_steps, args.search_tokens, args.search_trials, args.step_rounds, args.serve_rounds)
    if min(counts) < 1:
        raise CampaignError(
            "--train-steps, --search-tokens, --search-trials, --step-rounds and --serve-rounds must be at "
            "least 1"
        )
    return args


def dry_run(args: argparse.Namespace) -> None:
    """The sitting's planned device seconds and carried bytes (benchmarks/gpu_campaign_plan.py),
    from the records in `--out` (what is recorded is not planned again; the smoke's: none) and the
    corpus's figures if it is built here (else those of the recorded build)."""
    import gpu_campaign_plan
    import gpu_corpus

    work = Path(tempfile.mkdtemp(prefix="gpu_campaign_plan."))
    try:
        records = work if args.smoke else args.out
        raw = _load(next(iter(sorted(records.glob("gpu_campaign_*_steps.json"))), work / "none")) or {}
        recorded = {e["label"] for e in raw.get("shapes", [])}
        table = smoke_shapes() if args.smoke else shapes()
        part1 = [
            label for label, _, _ in table if label.startswith(args.only or "") and label not in recorded
        ]
        folder = (args.corpus or CORPUS).absolute()
        meta = None if args.smoke else _load(folder / "meta.json")
        built = None if meta is None else gpu_campaign_plan.folder_bytes(folder)
        if meta is None:  # not built here: the plan reads only the space, which names a folder
            vocab = gpu_corpus.SMOKE["vocab"] if args.smoke else gpu_corpus.DEFAULT_VOCAB
            meta, folder = {"vocab_size": vocab, "train_tokens": gpu_campaign_plan.CORPUS_TRAIN_TOKENS}, work
        corpus = {**meta, "path": str(folder), "bytes": built}
        runs: set[str] = set()
        for path in sorted(records.glob("gpu_campaign_*_fidelity.jsonl")):
            runs |= {line["key"] for line in gpu_campaign_fidelity.Record(path, None, "").runs()}
        space = fidelity_space(args, corpus)
        # Part 3: the points short of --serve-rounds timings, of every shape at every scenario.
        serve = _load(next(iter(sorted(records.glob("gpu_campaign_*_serve.json"))), work / "none")) or {}
        rounds = {(p["label"], p["batch"], p["context"]): p.get("rounds", 1) for p in serve.get("points", [])}
        serve_table = gpu_campaign_serve.smoke_shapes() if args.smoke else gpu_campaign_serve.shapes()
        scenarios = gpu_campaign_serve.SMOKE_SCENARIOS if args.smoke else gpu_campaign_serve.SCENARIOS
        points = [(label, b, c) for label, _ in serve_table for b, c in scenarios]
        part3 = (len(points), sum(rounds.get(p, 0) < args.serve_rounds for p in points))
        gpu_campaign_plan.dry_run(args, ROOT, part1, bool(raw.get("fit_gemms")), corpus, space, runs, part3)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.report:
        report(args)
        return
    if args.dry_run:
        dry_run(args)
        return
    budget = Budget(args.budget_s)
    if args.smoke:
        import torch

        # The suite shares a few cores: on 2 loaded ones a tiny step took 6x longer on 2 torch
        # threads than on 1 (OpenMP contention); the trials of part 2 run on 1 too ([proxy] threads).
        torch.set_num_threads(1)
    from archsearch.errors import ArchsearchError
    from archsearch.evaluators.device import detect_device

    try:
        info = detect_device(args.device)
    except ArchsearchError as exc:
        raise CampaignError(str(exc)) from None
    temporary = args.smoke and args.out == DATA  # a smoke run never writes into the records
    if temporary:
        args.out = Path(tempfile.mkdtemp(prefix="gpu_campaign_smoke."))
    args.model = catalogue_model(info.to_dict(), args.model)
    files = Files(args.out, device_slug(info), args.mirror)
    limit = "none" if args.budget_s is None else f"{args.budget_s:g} s"
    print(f"gpu campaign on {info.name} ({info.type}, fingerprint {info.fingerprint}), torch "
          f"{info.torch_version}; parts {','.join(map(str, args.parts))}; records in {args.out}; model "
          f"{args.model}; budget {limit}", flush=True)  # fmt: skip
    given = sys.argv[1:] if argv is None else argv  # called in process (a test): its own arguments
    files.event("start", argv=given, device=info.name, fingerprint=info.fingerprint)
    try:
        run = {
            1: lambda: part_steps(args, info, files, budget),
            2: lambda: part_search(args, args.model, files, budget),
            3: lambda: part_serve(args, info, files, budget),
            4: lambda: part_trace(args, info, files, budget),
            5: lambda: part_fidelity(args, info, files, budget),
        }
        for part in args.parts:  # in RUN_ORDER
            run[part]()
        files.event("end", elapsed_s=round(budget.elapsed(), 1))
        print(f"gpu campaign: {budget.elapsed():.0f} s", flush=True)
    finally:
        if temporary:
            shutil.rmtree(args.out, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except CampaignError as exc:
        print(f"gpu_campaign: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
