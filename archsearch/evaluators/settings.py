"""How a proxy is trained: `TrainSettings` and its learning-rate schedules (no torch).

Kept apart from `trainer` so a space file's `[proxy]` table is validated, and a search is planned,
without importing torch.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from archsearch.errors import ArchsearchError
from archsearch.registry import Registry
from archsearch.space.config import ArchConfig
from archsearch.units import MAX_WHOLE, SEED_MAX, short_number


class TrainError(ArchsearchError):
    """Training settings that cannot run (no budget, two budgets, a bad device)."""


# --- learning-rate schedules: progress p in [0, 1] -> multiplier of the peak rate ---
def _cosine(p: float, warmup: float, floor: float) -> float:
    if p < warmup:
        return (p + 1e-9) / warmup
    q = min(1.0, (p - warmup) / max(1e-9, 1.0 - warmup))
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * q))


def _wsd(p: float, warmup: float, floor: float) -> float:
    """Warm-up, stable, decay: flat at the peak, then linear to the floor over the last 20%."""
    if p < warmup:
        return (p + 1e-9) / warmup
    decay_start = 0.8
    if p < decay_start:
        return 1.0
    return 1.0 - (1.0 - floor) * min(1.0, (p - decay_start) / (1.0 - decay_start))


def _constant(p: float, warmup: float, floor: float) -> float:
    """Warm-up, then the peak rate to the end: the proxy schedule that ranks like long training.

    A short run that decays its rate rewards the shapes that gain most from annealing early, which
    are mostly small ones; the loss at a constant rate is what a longer run passes through on its
    way. Measured on the 14-shape tiny calibration set (`benchmarks/proxy_fidelity.py`,
    docs/accuracy.md "The proxy: chosen by measured fidelity"): at 2x the original budget and the
    long runs' seed, Spearman against 10x training rose from 0.74 (cosine) to 0.84 (constant);
    the 10x runs' own undecayed losses rank better than a fully decayed 5x run (0.965 against
    0.921). `floor` is unused: nothing decays.
    """
    return (p + 1e-9) / warmup if p < warmup else 1.0


SCHEDULES: Registry[Callable[[float, float, float], float]] = Registry("lr schedule")
SCHEDULES.register("cosine", _cosine)
SCHEDULES.register("wsd", _wsd)
SCHEDULES.register("constant", _constant)
PRECISIONS = ("auto", "bf16", "fp32")
# What `device.resolve_device` can run; checked here so a space file's `device = "tpu"` is refused
# when it is read, not once per trial when the trial starts.
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
# The evaluation points and the held-out batches are made before the first step: `evals = 1e9` grew
# the schedule until Ray's memory monitor killed the worker (22 GB of 23.5 GB) and retried it, and
# `eval_batches = 1e9` asked for 29.8 GiB, both after `space check` had passed them. Proxies use
# 4 evaluations of 1 to 8 batches; 10,000 of either is past any use.
MAX_EVALS = 10_000
# Budgets past these never end (`ladder --tokens-per-param 1e300` and `train --seconds 1e300`
# would start runs that train until killed): the tokens are bounded by what the database
# stores (units.MAX_WHOLE), the FLOPs at 10x the largest training runs published (~2e25), the
# seconds at a year.
MAX_FLOPS = 1e27
MAX_SECONDS = 365 * 24 * 3600.0


@dataclass(frozen=True)
class TrainSettings:
    """How to train a proxy. Give exactly one budget: tokens, flops or seconds.

    The learning rate is `lr` at width `base_width`; hidden matrices scale it by
    `base_width / d_model` (see `param_groups`).
    """

    tokens: int | None = None  # training tokens
    flops: float | None = None  # training FLOPs, converted to tokens by the cost model (6N-style)
    seconds: float | None = None  # wall-clock seconds of training steps
    batch_size: int = 16  # sequences per step
    seq_len: int | None = None  # defaults to the config's seq_len
    lr: float = 3e-3  # peak Adam rate at base_width: well inside the stable range at width 128
    base_width: int = 128  # width at which `lr` applies unscaled
    schedule: str = "cosine"  # "cosine", "wsd" or "constant" (warm-up, then flat: for proxies)
    warmup: float = 0.05  # fraction of the budget; short, so warm-up does not dominate short runs
    # Warm-up in tokens, overriding `warmup` when set: the rate at a step then depends on the tokens
    # trained so far, not on the budget, so under the constant schedule a short run is the exact
    # prefix of a longer one and can be resumed to it (`trainer.Checkpoint(keep=True)`).
    warmup_tokens: int | None = None
    min_lr: float = 0.1  # floor of the decay, as a fraction of the peak
    weight_decay: float = 0.1  # on hidden matrices only
    grad_clip: float = 1.0
    seed: int = 0
    eval_batches: int = 8  # fixed held-out batches per evaluation
    evals: int = 4  # evaluations spread evenly over the budget; the last is the reported loss
    device: str = "auto"  # "cpu", "cuda", "cuda:N" or "auto"
    precision: str = "auto"  # "bf16", "fp32" or "auto" (bf16 where the device runs it faster)
    compile: bool = False  # torch.compile the model
    # torch intra-op threads of a CPU run; None: `choose_threads` from the shape and the free cores.
    # Not part of what a run computes, only of how fast: a space file's fingerprint leaves it out.
    threads: int | None = None

    @property
    def budget_free(self) -> bool:
        """Whether the rate at each step is the same under any token budget: the constant schedule
        with its warm-up in tokens (or none). Such a run is the prefix of any longer one with the
        same settings, so it may resume to a longer budget; under cosine or WSD the decay is placed
        by the budget and no prefix is shared."""
        has_total = self.seconds is None
        fixed_warmup = self.warmup_tokens is not None or self.warmup == 0
        return has_total and self.schedule == "constant" and fixed_warmup

    def __post_init__(self) -> None:
        # Every number finite first: NaN passes every `<=` test below, and inf never ends a run.
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise TrainError(f"{field.name} must be a finite number, got {value}")
        budgets = [b for b in (self.tokens, self.flops, self.seconds) if b is not None]
        if len(budgets) != 1:
            raise TrainError("give exactly one budget: tokens, flops or seconds")
        if budgets[0] <= 0:
            raise TrainError(f"the budget must be positive, got {budgets[0]}")
        for name, most, what in (
            ("tokens", MAX_WHOLE, "2**63 - 1, the most the database stores"),
            ("flops", MAX_FLOPS, "1e27, 10x the largest training runs published"),
            ("seconds", MAX_SECONDS, "a year"),
        ):
            value = getattr(self, name)
            if value is not None and value > most:
                raise TrainError(f"{name} budget {short_number(value)} is past {what}")
        for name in ("lr", "grad_clip"):
            if getattr(self, name) <= 0:
                raise TrainError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.min_lr <= 1:
            raise TrainError(f"min_lr must be a fraction of the peak in [0, 1], got {self.min_lr}")
        if self.weight_decay < 0:
            raise TrainError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not isinstance(self.device, str) or not DEVICE_PATTERN.fullmatch(self.device):
            raise TrainError(f"device {self.device!r} is unknown; valid: cpu, cuda, cuda:N, auto")
        if self.schedule not in SCHEDULES:
            raise TrainError(f"schedule {self.schedule!r} is unknown; valid: {', '.join(SCHEDULES)}")
        if self.precision not in PRECISIONS:
            raise TrainError(f"precision {self.precision!r} is unknown; valid: {', '.join(PRECISIONS)}")
        for name in ("batch_size", "eval_batches", "evals", "base_width"):
            if getattr(self, name) <= 0:
                raise TrainError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("eval_batches", "evals"):
            if getattr(self, name) > MAX_EVALS:
                raise TrainError(f"{name} must be at most {MAX_EVALS:,}, got {getattr(self, name)}")
        if not 0 <= self.seed <= SEED_MAX:
            raise TrainError(f"seed must be in 0..{SEED_MAX}, got {short_number(self.seed)}")
        if not 0 <= self.warmup < 1:
            raise TrainError(f"warmup must be a fraction in [0, 1), got {self.warmup}")
        if self.warmup_tokens is not None:
            if isinstance(self.warmup_tokens, bool) or not isinstance(self.warmup_tokens, int):
                raise TrainError(
                    f"warmup_tokens must be a whole number of tokens, got {self.warmup_tokens!r}"
                )
            if not 0 <= self.warmup_tokens <= MAX_WHOLE:
                raise TrainError(
                    f"warmup_tokens must be in 0..2**63 - 1, got {short_number(self.warmup_tokens)}"
                )
            if self.seconds is not None:  # a clock budget has no token total to place the decay in
                raise TrainError("warmup_tokens needs a tokens or flops budget, not seconds")
        check_threads(self.threads)


# More CPU threads than any one machine has (768 on the largest two-socket servers): a larger
# count is a slip, and torch's OpenMP crashes making 5000 (`train --threads 5000`: a segmentation
# fault under a memory limit, no line). Fewer than this may still exceed the
# cores here: oversubscribing is allowed (`choose_threads` says why it is slow).
MAX_THREADS = 1024


def check_threads(threads: object) -> None:
    """Refuse a thread count that is neither None (chosen: `choose_threads`) nor an int in
    1..MAX_THREADS.

    Raises:
        TrainError: naming the value.
    """
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads <= 0):
        raise TrainError(f"threads must be a positive integer (or unset: chosen), got {threads!r}")
    if threads is not None and threads > MAX_THREADS:
        raise TrainError(f"threads must be at most {MAX_THREADS}, got {threads}")


# --- CPU threads: how many torch intra-op threads a CPU training run uses ---
# Multiply-adds of a step's largest matrix product that each intra-op thread must have to pay for
# itself: a second thread from 2x this (24M), a third from 3x, and so on. See `choose_threads`.
GEMM_MACS_PER_THREAD = 12_000_000
# A core counts as free while less than this fraction of it is busy: room for the idle machine's
# background and this process's own start-up in the load average, and no more (`free_cores`).
FREE_CORE_SLACK = 0.25


def largest_gemm(cfg: ArchConfig, tokens: int) -> int:
    """Multiply-adds of the largest matrix product of a training step on `tokens` tokens (one
    micro-batch): tokens x d_model x the widest matrix the residual stream meets (the MLP's d_ff,
    the attention projections' q_dim, or the LM head's vocab_size)."""
    return tokens * cfg.d_model * max(cfg.d_ff, cfg.q_dim, cfg.vocab_size)


def choose_threads(cfg: ArchConfig, tokens: int, cores: int) -> int:
    """The intra-op thread count for a CPU training step of `cfg` on `tokens` tokens per micro-batch,
    given `cores` free cores: one thread per `GEMM_MACS_PER_THREAD` multiply-adds of the step's
    largest matrix product (`largest_gemm`), at least 1 and at most `cores`.

    Why: a thread with too little work per kernel costs more in synchronisation than it
    computes, and one that waits for a busy core stalls every kernel of the step (OpenMP joins
    the threads after each op); the loss is the same either way. Pure: `available_cores` reads
    the machine.

    Measured (`python benchmarks/threads.py --batch B --shapes 6 --json runs.jsonl`, B = 2, 4,
    8, 16 sequences of 128 tokens; 2-core AMD EPYC, torch 2.13 CPU, fp32, 2026-11-23, a shared
    machine, so each run is sorted by the CPU other processes used meanwhile; the runs are in
    benchmarks/data/threads_cpu_2026-11-23.jsonl), tokens/s at 2 threads over 1:
    - others below 0.15 of a core: 0.92 and 1.11 at 8M multiply-adds (two shapes), 1.05 and
      1.53 at 17M, 1.27 and 1.68 at 34M; tiny.toml's smallest shape at its batch of 16 x 128
      (34M) 1.46 on a quiet machine (`--smoke`). So the second thread pays from about 24M.
    - others about one core: 0.05-0.25 at every size from 4M to 201M (a 31x slowdown of a
      search on a busy machine was this case); hence `free_cores` counts a core only when nearly idle.
    One thread per further 12M is an extrapolation: no machine with more cores was measured.
    """
    return max(1, min(cores, largest_gemm(cfg, tokens) // GEMM_MACS_PER_THREAD))


def free_cores(cores: int, load: float) -> int:
    """The cores of `cores` that are nearly idle at a run-queue `load` (the load average):
    `cores - load + FREE_CORE_SLACK`, rounded down, at least 1 and at most `cores`."""
    return max(1, min(cores, math.floor(cores - load + FREE_CORE_SLACK)))


def logits_bytes(tokens: int, vocab_size: int) -> int:
    """One fp32 copy of a step's logits: a floor under any shape's training memory at that vocab."""
    return 4 * tokens * vocab_size


def physical_memory_bytes() -> int:
    """The host's physical memory (a CPU device's); 0 where it cannot be read."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not Linux / not POSIX
        return 0


def usable_cores() -> int:
    """The cores this process may run on: `os.sched_getaffinity`, else `os.cpu_count`."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def available_cores() -> int:
    """The free cores of this process now: `usable_cores()` minus the 1-minute load average
    (`os.getloadavg`), as `free_cores` rounds it.

    The load average is the whole machine's and lags by up to a minute; it counts other users'
    work, which a second thread would wait on, and this process's own recent work too.
    """
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):  # not available on this platform
        load = 0.0
    return free_cores(usable_cores(), load)
