"""Record real training steps and their kernels: the runs `archsearch fit-device` fits.

A recorded run is one JSON object (`step_fit.records_from_benchmark` reads it):

    {"date", "device": DeviceInfo.to_dict(), "nvidia_smi", "torch", "min_run_time",
     "dtype",                                          # of every kernel and the real steps
     "fit_gemms": [[m, n, k, seconds], ...],           # a synthetic GEMM set (stage 1 of the fit)
     "shapes": [{"label", "config", "batch",
                 "report": ProfileReport.to_dict(),    # every distinct GEMM and SDPA call, timed
                 "attention_kernels": [...],           # which SDPA backend ran
                 "train_step_s": float | None,         # the real step (median); None: did not fit
                 "measure_s": float}, ...]}            # wall seconds spent measuring the shape

`benchmarks/gpu_model_accuracy.py` (8 shapes) and `benchmarks/gpu_campaign.py` (part 1) write it.
The device is chosen at run time: CUDA or CPU run the same code (CUDA events or the wall clock,
`trainer.StepClock`), so a CPU smoke run proves what a GPU will run. Times are medians in
seconds; the inputs are seeded, the times are measurements and vary run to run.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import subprocess
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F

from archsearch.evaluators.device import DeviceInfo, detect_device, is_memory_error
from archsearch.evaluators.model import ProxyLM
from archsearch.evaluators.profiler import TORCH_DTYPES, MeasurementCache, profile_step, time_gemm
from archsearch.evaluators.trainer import STEP_WARMUP, StepClock
from archsearch.space.config import ArchConfig

logger = logging.getLogger(__name__)

DTYPE = "bf16"  # what the fitted GPU models model: bf16 autocast, as GPU training runs
TRAIN_STEPS = 10  # steady-state steps timed, after STEP_WARMUP more (the recorded H100 run's)

# The synthetic GEMMs stage 1 of the fit sees besides the steps' own: squares, skinny,
# memory-bound and launch-bound (m, n, k), as recorded on the H100 on 2026-11-22.
FIT_GEMMS: tuple[tuple[int, int, int], ...] = (
    (256, 256, 256), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
    (16384, 4096, 4096), (8192, 1024, 1024), (8192, 4096, 1024), (8192, 1024, 4096), (1024, 1024, 8192),
    (4096, 128, 4096), (128, 4096, 4096), (64, 8192, 8192), (4096, 4096, 128), (2048, 256, 2048),
    (8192, 8192, 1024),
)  # fmt: skip


def nvidia_smi() -> str:
    """The GPU's clocks, power limit and memory as nvidia-smi reports them, or why it could not."""
    query = "name,pci.device_id,clocks.max.sm,clocks.max.mem,power.limit,power.max_limit,memory.total"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv"], capture_output=True, text=True, timeout=30
        )
        return out.stdout.strip() or out.stderr.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi failed: {exc}"


def run_header(info: DeviceInfo, min_run_time: float, dtype: str = DTYPE) -> dict[str, Any]:
    """The fields of a recorded run that say where and how it was measured (no shapes yet)."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": info.to_dict(),
        "nvidia_smi": nvidia_smi() if info.type == "cuda" else "",
        "torch": str(torch.__version__),
        "min_run_time": min_run_time,
        "dtype": dtype,
        "fit_gemms": [],
        "shapes": [],
    }


def _autocast(dev: torch.device, dtype: str) -> contextlib.AbstractContextManager[Any]:
    if dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(dev.type, dtype=TORCH_DTYPES[dtype])


def _train_step(cfg: ArchConfig, batch: int, dev: torch.device, dtype: str) -> Callable[[], None]:
    """One real eager training step of `cfg` on `batch` sequences, ready to call: `dtype` autocast
    forward, fp32 cross-entropy, backward, fused AdamW, gradients set to None."""
    torch.manual_seed(0)
    with dev:  # parameters made on the device: a 1B model initialises there in a second
        model = ProxyLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    data = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len + 1), device=dev)
    x, y = data[:, :-1], data[:, 1:]  # (B, T) each

    def step() -> None:
        with _autocast(dev, dtype):
            logits = model(x)  # (B, T, vocab)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _warm_step(
    cfg: ArchConfig, batch: int, device: str | DeviceInfo, dtype: str, steps: int, warmup: int
) -> tuple[torch.device, Callable[[], None]]:
    """The device and `_train_step`, run `warmup` times; `steps` (to be run next) checked."""
    if steps <= 0:
        raise ValueError(f"steps must be positive, got {steps}")
    info = device if isinstance(device, DeviceInfo) else detect_device(device)
    step = _train_step(cfg, batch, info.torch_device, dtype)
    for _ in range(warmup):
        step()
    return info.torch_device, step


def time_train_step(
    cfg: ArchConfig,
    batch: int,
    device: str | DeviceInfo = "cpu",
    dtype: str = DTYPE,
    steps: int = TRAIN_STEPS,
    warmup: int = STEP_WARMUP,
    synchronize_each: bool = True,
) -> float:
    """Median seconds of one real eager training step of `cfg` on `batch` sequences.

    The step `counting.eager_kernel_count` counts: `dtype` autocast forward, fp32 cross-entropy,
    backward, fused AdamW, gradients set to None. Each timed step is synchronised, so it starts on
    an idle device, as in the recorded H100 run the catalogued fit came from; with
    `synchronize_each` False the steps run back to back, the host issuing the next while the
    device runs the last, as the trainer runs them (its `StepClock` times each on the device).

    Raises:
        ValueError: `steps` is not positive.
        torch.OutOfMemoryError (or the CPU allocator's RuntimeError): the step does not fit.
    """
    dev, step = _warm_step(cfg, batch, device, dtype, steps, warmup)
    clock = StepClock(dev)
    for _ in range(steps):
        clock.start()
        step()
        clock.stop()
        if dev.type == "cuda" and synchronize_each:
            torch.cuda.synchronize(dev)
    if dev.type == "cuda" and not synchronize_each:
        torch.cuda.synchronize(dev)  # the clock's events are read once the last step has run
    seconds, _ = clock.median(warmup=0)
    return float(seconds)  # type: ignore[arg-type]  # steps >= 1 were timed


def trace_train_step(
    cfg: ArchConfig,
    batch: int,
    device: str | DeviceInfo = "cpu",
    dtype: str = DTYPE,
    steps: int = 3,
    warmup: int = STEP_WARMUP,
    top: int = 30,
) -> dict[str, Any]:
    """Where a real step's time goes (`time_train_step`'s step, under `torch.profiler`).

    Over `steps` steps after `warmup`: the wall time a step, and on CUDA every kernel the device
    ran (on the CPU every top-level operator) by name, with its calls and seconds a step; the `top`
    names by time, and the totals over all of them. On a GPU the device seconds against the wall
    seconds say how long the device idled waiting on the host; the calls, how many launches the
    host issued (what `counting.eager_kernel_count` counts).

    Raises:
        ValueError: `steps` is not positive.
        torch.OutOfMemoryError (or the CPU allocator's RuntimeError): the step does not fit.
    """
    from torch.profiler import ProfilerActivity, profile

    dev, step = _warm_step(cfg, batch, device, dtype, steps, warmup)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize(dev)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize(dev)
        wall = time.perf_counter() - start
    calls: dict[str, int] = {}
    seconds: dict[str, float] = {}
    for e in prof.events():
        if cuda and e.device_type.name == "CUDA":
            us = e.time_range.elapsed_us()
        elif not cuda and e.device_type.name == "CPU" and e.cpu_parent is None:
            us = e.cpu_time_total  # a top-level operator, its children inside it
        else:
            continue
        calls[e.name] = calls.get(e.name, 0) + 1
        seconds[e.name] = seconds.get(e.name, 0.0) + us * 1e-6
    ranked = sorted(seconds, key=seconds.__getitem__, reverse=True)
    return {
        "steps": steps,
        "wall_s": wall / steps,  # a step, the profiler's own overhead included
        "device_s": sum(seconds.values()) / steps,
        "calls": sum(calls.values()) / steps,
        "names": len(calls),
        "top": [
            {"name": n[:120], "calls": calls[n] / steps, "seconds": seconds[n] / steps} for n in ranked[:top]
        ],
    }


def attention_kernels(
    cfg: ArchConfig, batch: int, device: str | DeviceInfo = "cpu", dtype: str = DTYPE
) -> list[str]:
    """Names of the kernels (CUDA) or operators (CPU) one causal SDPA forward of this shape runs:
    which attention backend the step gets."""
    from torch.profiler import ProfilerActivity, profile

    info = device if isinstance(device, DeviceInfo) else detect_device(device)
    dev, torch_dtype = info.torch_device, TORCH_DTYPES[dtype]
    q = torch.randn((batch, cfg.n_heads, cfg.seq_len, cfg.head_dim), device=dev, dtype=torch_dtype)
    k = torch.randn((batch, cfg.n_kv_heads, cfg.seq_len, cfg.head_dim), device=dev, dtype=torch_dtype)
    v = torch.randn_like(k)
    gqa = cfg.n_kv_heads != cfg.n_heads
    F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    cuda = dev.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        if cuda:
            torch.cuda.synchronize(dev)
    kind = "CUDA" if cuda else "CPU"
    names = {e.name for e in prof.events() if e.device_type.name == kind}
    return sorted(n[:90] for n in names)


def time_fit_gemms(
    gemms: Iterable[tuple[int, int, int]], device: str | DeviceInfo, min_run_time: float, dtype: str = DTYPE
) -> list[list[float]]:
    """`[m, n, k, seconds]` of each GEMM (the recorded run's `fit_gemms`)."""
    info = device if isinstance(device, DeviceInfo) else detect_device(device)
    return [[m, n, k, time_gemm(m, n, k, info, dtype, min_run_time)] for m, n, k in gemms]


def measure_shape(
    label: str,
    cfg: ArchConfig,
    batch: int,
    device: str,
    cache: MeasurementCache,
    min_run_time: float,
    dtype: str = DTYPE,
    train_steps: int = TRAIN_STEPS,
) -> dict[str, Any]:
    """One recorded shape on `device` ("cpu", "cuda", "cuda:N"): its step's kernels (`profile_step`),
    its attention backend and its real step (`time_train_step`; `train_steps` 0 skips it).

    A real step that runs out of memory is recorded as `train_step_s: None` with the reason under
    `error` (the fit leaves such a shape out); the memory is given back before returning.

    Raises:
        ProfilerError: a kernel of the step does not fit (nothing to record).
    """
    info = detect_device(device)
    t0 = time.perf_counter()
    report = profile_step(cfg, batch, device, dtype, cache, min_run_time)
    entry: dict[str, Any] = {
        "label": label, "config": cfg.to_dict(), "batch": batch, "report": report.to_dict(),
        "attention_kernels": attention_kernels(cfg, batch, info, dtype),
    }  # fmt: skip
    if train_steps:
        try:
            entry["train_step_s"] = time_train_step(cfg, batch, info, dtype, train_steps)
        except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            if not is_memory_error(exc):
                raise
            entry["train_step_s"] = None
            entry["error"] = f"real step out of memory: {str(exc).splitlines()[0]}"
            logger.warning("%s: %s", label, entry["error"])
    gc.collect()
    if info.type == "cuda":
        torch.cuda.empty_cache()
    entry["measure_s"] = time.perf_counter() - t0
    return entry
