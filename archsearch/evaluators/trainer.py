"""Proxy training: train an `ArchConfig`'s proxy LM briefly and report its held-out loss.

The loss of a short run ranks candidates (docs/explanations/proxy-fidelity.md). What keeps the
ranking fair:
- One budget for every candidate, in tokens, training FLOPs or seconds.
- A learning rate that scales with width (see `param_groups`), so narrow and wide shapes are each
  trained near their own best rate instead of one width's.
- Fixed seeds and a fixed set of held-out batches, so two runs of a shape give the same loss.

Failures (a NaN or infinite loss, running out of memory, a shape too large for the device) end the
run with `status="failed"` and the reason; they never raise out of `train`.

A long run can keep a `Checkpoint`: every few minutes its whole state (weights, optimizer, step,
curves, the place in the batch stream) goes to one file, and a run of the same shape, settings and
data that finds the file goes on from there, to the same losses as a run never stopped. With
`keep=True` a finished run leaves its final state behind, and a later run of a longer token budget
goes on from it (promotion): exactly, because under the constant schedule with a warm-up in tokens
(`TrainSettings.budget_free`) the rate at each step does not depend on the budget. Under cosine or
WSD the decay is placed by the budget, so a shorter run is no prefix of a longer one: such a run
resumes only at its own budget and trains afresh at another.
"""

from __future__ import annotations

import io
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from archsearch.evaluators.device import DeviceInfo, is_memory_error, resolve_device
from archsearch.evaluators.model import ProxyLM
from archsearch.evaluators.profiler import (
    MeasurementCache,
    ProfilerError,
    model_flops_utilisation,
    peak_matmul_flops,
    resolve_precision,
)
from archsearch.evaluators.settings import (
    SCHEDULES,
    TrainError,
    TrainSettings,
    available_cores,
    check_threads,
    choose_threads,
    logits_bytes,
)
from archsearch.fileio import write_atomic
from archsearch.space.config import ArchConfig
from archsearch.space.costs import flop_counts, param_counts
from archsearch.trial import COMPLETE, FAILED, OUTCOMES, PRUNED, check_state

log = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor]


class TokenData(Protocol):
    """What the trainer needs from a dataset (`evaluators.dataset.Dataset` provides it)."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def fingerprint(self) -> str: ...
    def bits_per_byte(self, nats_per_token: float) -> float | None: ...
    def train_batches(
        self, batch_size: int, seq_len: int, seed: int, device: torch.device
    ) -> Iterator[Batch]: ...
    def val_batches(self, batch_size: int, seq_len: int, count: int, device: torch.device) -> list[Batch]: ...


@dataclass(frozen=True)
class TrainResult:
    """The outcome of one proxy run. Losses are nats per token on the held-out batches."""

    status: str  # one of trial.OUTCOMES: complete, pruned or failed
    reason: str | None  # why a run failed or was pruned
    val_loss: float | None  # at the end of the run (or the last evaluation before it stopped)
    bits_per_byte: float | None  # val_loss / ln 2 / bytes per token, for byte-level data
    tokens: int  # tokens trained
    steps: int
    wall_time_s: float  # training plus evaluation
    tokens_per_second: float  # training steps only
    achieved_flops_per_second: float  # causal training FLOPs (costs.FlopCounts.train_causal) / time
    mfu: float | None  # achieved / measured peak matmul rate in the same dtype
    peak_flops_per_second: float | None
    precision: str  # "bf16" or "fp32", as used
    device: str  # description of the device
    corpus_fingerprint: str
    params: int
    loss_curve: tuple[tuple[int, float], ...] = ()  # (tokens, training loss) every few steps
    val_curve: tuple[tuple[int, float], ...] = ()  # (tokens, held-out loss) at each evaluation
    config: dict[str, Any] = field(default_factory=dict)
    # The real training step: median seconds of the steady-state optimizer steps (forward,
    # backward, clip, optimizer step, zero_grad; evaluation excluded), and how many steps it is of.
    step_time_s: float | None = None
    step_time_steps: int = 0
    threads: int | None = None  # torch intra-op threads of a CPU run; None on CUDA (left alone)
    resumed_tokens: int = 0  # tokens taken over from a checkpoint; 0: trained from step 0

    def __post_init__(self) -> None:
        check_state(self.status, OUTCOMES)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["loss_curve"] = [list(p) for p in self.loss_curve]
        out["val_curve"] = [list(p) for p in self.val_curve]
        return out


def step_threads(
    cfg: ArchConfig, device: str, tokens: int, threads: int | None = None, cores: int | None = None
) -> int | None:
    """The intra-op threads a CPU training step of `cfg` on `tokens` tokens (one micro-batch) runs
    on: `threads` when given, else `choose_threads` on `cores` (None: `available_cores()`, the free
    cores now). None on CUDA: the GPU runs the step, and the process's thread count is left as it is.

    The one rule for every step this process trains or times: `train` (`run_threads`),
    `archsearch profile` and a search's trials, so one shape, batch and machine get one count.

    Raises:
        TrainError: `threads` is not a positive integer.
        DeviceError: an unknown device, or CUDA asked for where there is none.
    """
    check_threads(threads)
    if resolve_device(device).type != "cpu":
        return None
    if threads is not None:
        return threads
    return choose_threads(cfg, tokens, available_cores() if cores is None else cores)


def run_threads(cfg: ArchConfig, settings: TrainSettings, cores: int | None = None) -> int | None:
    """`step_threads` for a run of `settings`: its device, its micro-batch of `batch_size` sequences
    of its `seq_len` (else the shape's), its `threads`.

    Raises:
        DeviceError: an unknown device, or CUDA asked for where there is none.
    """
    tokens = settings.batch_size * (settings.seq_len or cfg.seq_len)
    return step_threads(cfg, settings.device, tokens, settings.threads, cores)


@contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to `threads` inside, the previous one restored after; None
    changes nothing."""
    previous = torch.get_num_threads()
    if threads is not None and threads != previous:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)


# Optimizer steps left out of the step-time median: the first ones pay for lazy initialisation
# (oneDNN / cuBLAS plans, the caching allocator growing, the optimizer's state), not steady state.
STEP_WARMUP = 3


def choose_precision(device: DeviceInfo, requested: str, cache: MeasurementCache | None = None) -> str:
    """bf16 autocast where the device runs it natively and faster, else fp32 (`resolve_precision`).

    On CPU bf16 helps only with native support (AVX512-BF16 / AMX; about 4x on this project's
    machines); without it every matmul is emulated far below the fp32 rate, so "auto" is fp32.
    """
    if requested == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise TrainError("bf16 asked for, but this CUDA device does not support it")
    return resolve_precision(device, requested, cache)


class StepClock:
    """Times each optimizer step: CUDA events on a GPU (read once, at the end, so timing adds no
    synchronisation to the loop), wall time on a CPU, whose kernels run synchronously."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._events: list[tuple[Any, Any]] = []  # (start, end) of each finished step
        self._start: Any = None
        self._seconds: list[float] = []
        self._t0 = 0.0

    def start(self) -> None:
        if self._cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self._cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((self._start, end))  # a step that raised never gets here
        else:
            self._seconds.append(time.perf_counter() - self._t0)

    def median(self, warmup: int = STEP_WARMUP) -> tuple[float | None, int]:
        """Median seconds of the steps after the first `warmup` (at most half of them are
        skipped, so a short run still reports), and how many steps that is; (None, 0) if none.
        On CUDA, call after the device is synchronised."""
        if self._cuda:
            self._seconds = [a.elapsed_time(b) / 1e3 for a, b in self._events]  # ms -> s
        times = self._seconds[min(warmup, len(self._seconds) // 2) :]
        return (statistics.median(times), len(times)) if times else (None, 0)


def param_groups(model: ProxyLM, lr: float, base_width: int, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups with a per-width learning rate (µP's rule for Adam, Yang et al. 2022, Table 3).

    Hidden matrices (every 2-D weight in the blocks, and an untied LM head) take
    `lr * base_width / d_model`: their update size per unit of rate grows with fan-in, so a wider
    model needs a proportionally smaller rate for the same change in activations. Vector-like
    parameters (embeddings, norms, biases) keep `lr` and no weight decay. This is the learning-rate
    part of µP only (no output or attention multipliers). Evidence (`benchmarks/lr_transfer.py` at
    commit eeea5b5, 150k tokens, widths 64 / 256 / 512): with one rate for all, the best rate drifts
    10x (1e-2 to 1e-3); with this rule it stays within one 3x grid step (1e-2, 3e-3, 3e-3).
    """
    scale = base_width / model.cfg.d_model
    embeddings = {id(model.tok_emb.weight)} | (
        {id(model.pos_emb.weight)} if model.pos_emb is not None else set()
    )
    hidden, vector = [], []
    for p in model.parameters():
        (hidden if p.dim() == 2 and id(p) not in embeddings else vector).append(p)
    return [
        {"params": hidden, "lr": lr * scale, "weight_decay": weight_decay, "base_lr": lr * scale},
        {"params": vector, "lr": lr, "weight_decay": 0.0, "base_lr": lr},
    ]


def train_memory_bytes(cfg: ArchConfig, batch_size: int, seq_len: int) -> int:
    """A rough upper bound of training memory: fp32 weights, grads, two Adam moments, activations.

    Activations: about 34 residual-width values per token per layer plus logits (Korthikanti et
    al. 2022 count 34*s*b*h for a GPT layer without recomputation), in 4 bytes to be safe.
    """
    tokens = batch_size * seq_len
    params = param_counts(cfg).total
    per_layer = tokens * (34 * cfg.d_model + 5 * cfg.n_heads * seq_len + 3 * cfg.d_ff)
    activations = 4 * cfg.n_layers * per_layer + 3 * logits_bytes(tokens, cfg.vocab_size)
    return 16 * params + activations


CHECKPOINT_EVERY_S = 300.0  # a run stopped loses at most this much training
_CHECKPOINT_FORMAT = 2  # 2: the budget and evaluation count left out of a budget-free identity
# Bytes on disk of a kept state per model parameter: fp32 weights (4) and AdamW's two fp32 moments
# (8), plus a few kilobytes of RNG state and curves whatever the size: kept states of two tiny
# configs measured 12.04 bytes per parameter at 590k parameters and 12.01 at 4.3M (the test
# `test_a_kept_state_costs_twelve_bytes_per_parameter` holds the bound).
STATE_BYTES_PER_PARAM = 12


@dataclass(frozen=True)
class Checkpoint:
    """Where a run keeps its state, and how often (seconds of wall time) it writes it.

    The file is written atomically at a step boundary, read back by a run of the same config,
    settings (threads aside) and corpus, and removed once the run ends (pruned or failed, or
    complete unless `keep`); a file of another run, or one that cannot be read, is set aside with a
    warning and the run starts from step 0.

    `keep=True` leaves a complete run's final state in the file, for a longer run to go on from:
    where the settings are `budget_free`, the identity leaves out the budget and the evaluation
    count, so a run of 2x the tokens resumes from a 1x run's final state (or a 1x run from a 2x
    run's state stopped before 1x) and ends with the losses of one run never stopped. Evaluation
    points are fractions of the run's own budget: a resumed run evaluates at those of its points
    not yet passed. A state past the budget asked for is set aside. A kept state costs about
    `STATE_BYTES_PER_PARAM` (12) bytes per parameter.
    """

    path: Path
    every_s: float = CHECKPOINT_EVERY_S
    keep: bool = False  # leave a complete run's final state for a longer run to resume from

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        if not (math.isfinite(self.every_s) and self.every_s >= 0):
            raise TrainError(
                f"a checkpoint interval must be a finite number of seconds >= 0, not {self.every_s}"
            )


def _run_identity(
    cfg: ArchConfig, settings: TrainSettings, data: TokenData, device: torch.device
) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: the threads may differ (they change no result
    beyond float rounding), nothing else may; where the settings are `budget_free`, neither may the
    budget (tokens or FLOPs) nor the evaluation count, which change where a run stops and what it
    records on the way, not the steps it takes."""
    free = ("threads", "tokens", "flops", "evals") if settings.budget_free else ("threads",)
    return dict(
        format=_CHECKPOINT_FORMAT,
        config=cfg.to_dict(),
        settings={k: v for k, v in asdict(settings).items() if k not in free},
        corpus=data.fingerprint,
        device=device.type,
    )


def _load_checkpoint(checkpoint: Checkpoint, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The saved state of this run, or None (no file, another run's, unreadable: warned)."""
    path = checkpoint.path
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a torn or foreign file: the run starts again rather than fail
        log.warning("checkpoint %s cannot be read (%s); training from step 0", path, str(exc).splitlines()[0])
        return None
    if not isinstance(state, dict) or state.get("identity") != identity:
        log.warning("checkpoint %s belongs to another run; training from step 0", path)
        return None
    return state


def _save_checkpoint(checkpoint: Checkpoint, state: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    checkpoint.path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(checkpoint.path, buffer.getvalue())


def too_large(cfg: ArchConfig, batch_size: int, seq_len: int, info: DeviceInfo) -> str | None:
    """Why `cfg` cannot train at `batch_size` on the device `info` describes (its training memory,
    `train_memory_bytes`, past 90% of the device's), or None: the trainer's check, which a command
    can run before it starts workers."""
    need, have = train_memory_bytes(cfg, batch_size, seq_len), info.memory_bytes
    if have and need > 0.9 * have:
        gib = 2**30
        return (
            f"config too large for {info.torch_device}: needs ~{need / gib:.4g} GiB, has {have / gib:.1f} GiB"
        )
    return None


class _Stop(Exception):
    """Ends the training loop early with a status and reason."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def train(
    cfg: ArchConfig,
    data: TokenData,
    settings: TrainSettings,
    on_eval: Callable[[int, float], bool] | None = None,
    progress: Callable[[int, int, float, float], None] | None = None,
    cache: MeasurementCache | None = None,
    checkpoint: Checkpoint | None = None,
) -> TrainResult:
    """Train `cfg`'s proxy on `data` within the budget; return its held-out loss and speed.

    A CPU run uses `run_threads` torch intra-op threads (`TrainResult.threads`) and restores the
    process's previous count when it ends; on CUDA the count is left alone.

    Args:
        cfg: the shape; its vocab_size must cover the data's.
        data: train and validation batches (`evaluators.dataset.Dataset`).
        settings: budget and optimisation settings.
        on_eval: called as `on_eval(tokens, val_loss)` after each intermediate evaluation; a true
            return stops the run as "pruned" (multi-fidelity search uses this).
        progress: called as `progress(tokens, total_tokens, train_loss, tokens_per_second)` every
            few steps, for progress bars. For a seconds budget, `total_tokens` is an estimate.
        cache: where the matmul peak behind MFU is cached (the trial database's kernel table via
            `storage.KernelCache`); None: per process.
        checkpoint: where the run keeps its state to go on after a stop (`Checkpoint`); None:
            a stopped run starts again.

    Returns:
        A TrainResult; failures come back as `status="failed"` with the reason, not as exceptions.

    Raises:
        TrainError: settings or data that cannot run at all (bad device, vocab mismatch).
    """
    threads = run_threads(cfg, settings)
    with intra_op_threads(threads):
        return _train(cfg, data, settings, threads, on_eval, progress, cache, checkpoint)


def _train(
    cfg: ArchConfig,
    data: TokenData,
    settings: TrainSettings,
    threads: int | None,
    on_eval: Callable[[int, float], bool] | None,
    progress: Callable[[int, int, float, float], None] | None,
    cache: MeasurementCache | None,
    checkpoint: Checkpoint | None,
) -> TrainResult:
    """`train` on the thread count already set: the device (and so the MFU peak's cache key) is
    described with the threads the run uses."""
    info = resolve_device(settings.device)
    device = info.torch_device
    seq_len = settings.seq_len or cfg.seq_len
    if seq_len > cfg.seq_len:
        raise TrainError(f"seq_len={seq_len} is longer than the config's seq_len={cfg.seq_len}")
    if data.vocab_size > cfg.vocab_size:
        raise TrainError(f"data has vocab_size={data.vocab_size} but the config only {cfg.vocab_size}")
    flops = flop_counts(cfg)
    flops_per_token = flops.train
    tokens_per_step = settings.batch_size * seq_len
    if settings.tokens is not None:
        total_tokens = settings.tokens
    elif settings.flops is not None:
        total_tokens = int(settings.flops // flops_per_token)
    else:
        total_tokens = 0  # the clock decides
    total_steps = max(1, math.ceil(total_tokens / tokens_per_step))  # at least one step
    precision = choose_precision(info, settings.precision, cache)
    base = dict(
        precision=precision,
        device=f"{info.name} ({info.type}, {info.units} {'SMs' if info.type == 'cuda' else 'cores'})",
        corpus_fingerprint=data.fingerprint,
        params=param_counts(cfg).total,
        config=cfg.to_dict(),
        threads=threads,
    )

    def failed(reason: str) -> TrainResult:
        """A run that failed before its first step."""
        return TrainResult(
            status=FAILED, reason=reason, val_loss=None, bits_per_byte=None, tokens=0, steps=0,
            wall_time_s=0.0, tokens_per_second=0.0, achieved_flops_per_second=0.0, mfu=None,
            peak_flops_per_second=None, **base,
        )  # fmt: skip

    if why := too_large(cfg, settings.batch_size, seq_len, info):
        return failed(why)

    torch.manual_seed(settings.seed)
    try:
        model = ProxyLM(cfg).to(device)
    except Exception as exc:
        if is_memory_error(exc):
            return failed(f"out of memory building the model: {exc}".splitlines()[0])
        raise
    step_model: nn.Module = torch.compile(model) if settings.compile else model
    optimizer = torch.optim.AdamW(
        param_groups(model, settings.lr, settings.base_width, settings.weight_decay),
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=True,  # one kernel per step on CPU and CUDA: about 5x faster than foreach on CPU
    )
    schedule = SCHEDULES[settings.schedule]
    # A warm-up in tokens ramps by the tokens trained, the same at step s under any budget; the
    # schedule's later part (a decay) still follows the fraction done.
    warmup_tokens = settings.warmup_tokens
    warm_fraction = warmup_tokens / (total_steps * tokens_per_step) if warmup_tokens is not None else 0.0

    def rate_scale(done: float) -> float:
        """The multiplier of the peak rate for the next step, `done` the fraction trained."""
        if warmup_tokens is None:
            return schedule(done, settings.warmup, settings.min_lr)
        if tokens < warmup_tokens:
            return (tokens + tokens_per_step) / (warmup_tokens + tokens_per_step)
        return schedule(done, min(warm_fraction, done), settings.min_lr)

    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    val = data.val_batches(settings.batch_size, seq_len, settings.eval_batches, device)
    batches = data.train_batches(settings.batch_size, seq_len, settings.seed, device)

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with autocast:
            logits = step_model(x)
        return nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    @torch.no_grad()
    def evaluate() -> float:
        model.eval()
        total = sum(loss_of(x, y).item() for x, y in val)
        model.train()
        return total / len(val)

    loss_curve: list[tuple[int, float]] = []
    val_curve: list[tuple[int, float]] = []
    eval_at = [(i + 1) / settings.evals for i in range(settings.evals)]  # the last is 1.0
    next_eval = 0
    log_every = 10  # steps between host syncs: reading the loss waits for the device
    tokens = steps = 0
    eval_time = 0.0  # excluded from training time and throughput
    status, reason = COMPLETE, None
    pending_loss, pending_steps = torch.zeros((), device=device), 0
    clock = StepClock(device)
    identity = _run_identity(cfg, settings, data, device) if checkpoint is not None else {}
    saved = _load_checkpoint(checkpoint, identity) if checkpoint is not None else None
    if saved is not None and saved["steps"] > total_steps:
        log.warning(
            "checkpoint %s is %d steps in, past this run's %d; training from step 0",
            checkpoint.path, saved["steps"], total_steps,  # type: ignore[union-attr]
        )  # fmt: skip
        saved = None
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["torch_rng"])
        steps, tokens, next_eval = saved["steps"], saved["tokens"], saved["next_eval"]
        if saved["total_steps"] != total_steps:  # another budget: its evaluation points are not ours
            done = steps / total_steps
            next_eval = next((i for i, at in enumerate(eval_at) if at > done), len(eval_at) - 1)
        eval_time = saved["eval_s"]
        loss_curve = [tuple(p) for p in saved["loss_curve"]]
        val_curve = [tuple(p) for p in saved["val_curve"]]
        for _ in range(steps):  # the stream goes on where it stopped: the same batches as one run
            next(batches)
        log.info("resuming from %s at step %d of %d", checkpoint.path, steps, total_steps)  # type: ignore[union-attr]
    start = time.perf_counter() - (saved["train_s"] + saved["eval_s"] if saved is not None else 0.0)
    last_saved = time.perf_counter()

    def flush_loss() -> None:
        nonlocal pending_steps
        if pending_steps:
            mean_loss = pending_loss.item() / pending_steps
            pending_loss.zero_()
            pending_steps = 0
            if not math.isfinite(mean_loss):
                raise _Stop(FAILED, f"non-finite loss: training loss is {mean_loss} at step {steps}")
            loss_curve.append((tokens, mean_loss))
            # Reported at every sync, evaluations included: with evaluations closer together than
            # log_every steps (a tiny budget) the count below never reaches log_every.
            if progress is not None:
                elapsed = max(train_time(), 1e-9)
                estimate = total_tokens or int(tokens * settings.seconds / elapsed)
                progress(tokens, estimate, mean_loss, tokens / elapsed)

    def train_time() -> float:
        return time.perf_counter() - start - eval_time

    def keep_state(optimizer: torch.optim.Optimizer) -> None:
        """Write the checkpoint, at a step boundary with no loss pending."""
        nonlocal last_saved
        _save_checkpoint(checkpoint, dict(  # type: ignore[arg-type]
            identity=identity, model=model.state_dict(), optimizer=optimizer.state_dict(),
            torch_rng=torch.get_rng_state(), steps=steps, tokens=tokens, next_eval=next_eval,
            total_steps=total_steps,
            eval_s=eval_time, train_s=train_time(), loss_curve=[list(p) for p in loss_curve],
            val_curve=[list(p) for p in val_curve],
        ))  # fmt: skip
        last_saved = time.perf_counter()

    try:
        while True:
            done = train_time() / settings.seconds if settings.seconds is not None else steps / total_steps
            if steps and done >= eval_at[next_eval]:
                while next_eval < len(eval_at) - 1 and done >= eval_at[next_eval + 1]:
                    next_eval += 1  # a slow step crossed several evaluation points
                flush_loss()  # also waits for the device, so the clock below is fair
                if val_curve and val_curve[-1][0] == tokens:  # a kept final state, at its own budget
                    val_curve.pop()
                t_eval = time.perf_counter()
                val_loss = evaluate()
                eval_time += time.perf_counter() - t_eval
                if not math.isfinite(val_loss):  # the curve keeps finite points only, as the train curve
                    why = f"non-finite loss: validation loss is {val_loss} after {tokens} tokens"
                    raise _Stop(FAILED, why)
                val_curve.append((tokens, val_loss))
                if next_eval == len(eval_at) - 1:
                    if checkpoint is not None and checkpoint.keep:
                        keep_state(optimizer)
                    break
                if on_eval is not None and on_eval(tokens, val_loss):
                    raise _Stop(PRUNED, f"pruned after {tokens} tokens at val_loss {val_loss:.4f}")
                next_eval += 1
                continue
            lr_scale = rate_scale(done)
            for group in optimizer.param_groups:
                group["lr"] = group["base_lr"] * lr_scale
            x, y = next(batches)
            clock.start()
            loss = loss_of(x, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
            optimizer.step()
            clock.stop()
            pending_loss += loss.detach()
            pending_steps += 1
            steps += 1
            tokens += tokens_per_step
            if pending_steps == log_every:
                flush_loss()
                if checkpoint is not None and time.perf_counter() - last_saved >= checkpoint.every_s:
                    keep_state(optimizer)
    except _Stop as stop:
        status, reason = stop.status, stop.reason
    except Exception as exc:
        if not is_memory_error(exc):
            raise
        status, reason = FAILED, f"out of memory after {steps} steps: {str(exc).splitlines()[0]}"
    finally:
        del optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if checkpoint is not None and not (checkpoint.keep and status == COMPLETE):
        checkpoint.path.unlink(missing_ok=True)  # the run ended: its result is what a caller keeps
    wall = time.perf_counter() - start
    trained_s = wall - eval_time
    achieved = flops.train_causal * tokens / trained_s if trained_s > 0 else 0.0
    peak = peak_matmul_flops(info, precision, cache) if tokens else None
    step_time, step_time_steps = clock.median()
    val_loss = val_curve[-1][1] if val_curve else None
    if status == FAILED:
        val_loss = None
    bpb = data.bits_per_byte(val_loss) if val_loss is not None else None
    return TrainResult(
        status=status,
        reason=reason,
        val_loss=val_loss,
        bits_per_byte=bpb,
        tokens=tokens,
        steps=steps,
        wall_time_s=wall,
        tokens_per_second=tokens / trained_s if trained_s > 0 else 0.0,
        achieved_flops_per_second=achieved,
        mfu=model_flops_utilisation(achieved, peak) if peak else None,
        peak_flops_per_second=peak,
        loss_curve=tuple(loss_curve),
        val_curve=tuple(val_curve),
        step_time_s=step_time,
        step_time_steps=step_time_steps,
        resumed_tokens=int(saved["tokens"]) if saved is not None else 0,
        **base,
    )


class _RandomTokens:
    """Uniform random tokens: a `TokenData` for timing steps, where the text does not matter."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.fingerprint = f"random-{vocab_size}"

    def bits_per_byte(self, nats_per_token: float) -> float | None:
        return None

    def train_batches(
        self, batch_size: int, seq_len: int, seed: int, device: torch.device
    ) -> Iterator[Batch]:
        g = torch.Generator().manual_seed(seed)
        while True:
            tokens = torch.randint(self.vocab_size, (batch_size, seq_len + 1), generator=g)
            yield tokens[:, :-1].to(device), tokens[:, 1:].to(device)

    def val_batches(self, batch_size: int, seq_len: int, count: int, device: torch.device) -> list[Batch]:
        return [next(self.train_batches(batch_size, seq_len, -1 - i, device)) for i in range(count)]


MEASURE_STEPS = 10  # steady-state steps timed by `measure_step`, after STEP_WARMUP more


def measure_step(
    cfg: ArchConfig,
    batch: int,
    device: str = "cpu",
    precision: str = "auto",
    steps: int = MEASURE_STEPS,
    cache: MeasurementCache | None = None,
) -> tuple[float, int]:
    """Time the real training step of `cfg` on `batch` sequences: `train` on random tokens for
    `STEP_WARMUP + steps` steps, its own clock (`TrainResult.step_time_s`). For a step that no
    proxy run timed: `archsearch profile`, or a profile at another batch or dtype than training.

    Returns:
        (median seconds of the steady-state steps, how many steps that is of).

    Raises:
        ProfilerError: the run failed (out of memory, too large for the device).
    """
    if steps <= 0:
        raise ValueError(f"steps must be positive, got {steps}")
    # The process's thread count, as `profiler.profile_step` times the step's kernels on it.
    settings = TrainSettings(
        tokens=(STEP_WARMUP + steps) * batch * cfg.seq_len, batch_size=batch, evals=1, eval_batches=1,
        device=device, precision=precision, warmup=0.0, threads=torch.get_num_threads(),
    )  # fmt: skip
    result = train(cfg, _RandomTokens(cfg.vocab_size), settings, cache=cache)
    if result.status != COMPLETE or result.step_time_s is None:
        raise ProfilerError(f"could not time a training step of batch {batch}: {result.reason}")
    return result.step_time_s, result.step_time_steps
