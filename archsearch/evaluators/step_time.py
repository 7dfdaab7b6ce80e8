"""The time of one training step of a shape on a device: measured here, or modelled.

One answer for every caller (a search's worker, `archsearch profile`): a device this machine has
("cpu", "cuda", "cuda:N") is measured, its kernels timed (`profiler.profile_step`) and, with
steps, the real training step timed too, so the kernels read as its breakdown with a residual
line; a catalogued GPU ("h100-sxm", see `archsearch devices`) is modelled by the roofline
(`hardware.modelled_profile`), with the framework overhead of the kernels its eager step
launches (`counting.eager_kernel_count`) and of the host's work on them and on its autograd graph
(`counting.eager_host_ops`). Either way the result is a `ProfileReport`.
"""

from __future__ import annotations

from collections.abc import Callable

from archsearch.evaluators.counting import eager_host_ops, eager_kernel_count, eager_memory_ops
from archsearch.evaluators.hardware import check_device, modelled_dtype, modelled_profile
from archsearch.evaluators.profiler import DEFAULT_MIN_RUN_TIME, InMemoryCache, MeasurementCache, profile_step
from archsearch.evaluators.step_kernels import ProfileReport
from archsearch.evaluators.trainer import MEASURE_STEPS, measure_step
from archsearch.space.config import ArchConfig


def step_profile(
    cfg: ArchConfig,
    device: str,
    batch: int,
    dtype: str,
    cache: MeasurementCache | None = None,
    *,
    steps: int = MEASURE_STEPS,
    trained: tuple[float, int] | None = None,
    min_run_time: float = DEFAULT_MIN_RUN_TIME,
    progress: Callable[[int, int, str], None] | None = None,
) -> ProfileReport:
    """One training step of `cfg` on `batch` sequences in `dtype` ("auto": what training runs in
    there; bf16 on a modelled GPU), on `device`.

    Measured only:
        cache: kernel times already known, and where new ones go (None: this call's own).
        steps: real steady-state training steps to time (the median, `trainer.measure_step`);
            0: the kernels alone, with no measured step.
        trained: (seconds, steps) of this very step, already timed by a training run of the same
            shape, batch and precision: used instead of timing it again.
        min_run_time: seconds of repeats per kernel.
        progress: called as `progress(done, total, kernel)` while kernels are timed.

    Raises:
        ConfigError: `device` is neither here nor catalogued.
        DeviceError: a local device this machine does not have.
        ProfilerError: the dtype is not supported there, a kernel does not fit, or the timed
            training run failed.
    """
    if check_device(device):  # raises on a device neither here nor catalogued
        dtype = modelled_dtype(dtype)
        memory = eager_memory_ops(cfg, batch, dtype)
        return modelled_profile(
            cfg, device, batch, dtype, launches=eager_kernel_count(cfg), memory_ops=memory,
            host_ops=eager_host_ops(cfg),
        )  # fmt: skip
    cache = InMemoryCache() if cache is None else cache
    report = profile_step(cfg, batch, device, dtype, cache, min_run_time, progress=progress)
    if trained is None and steps:
        trained = measure_step(cfg, batch, device, report.dtype, steps, cache=cache)
    return report if trained is None else report.with_measured_step(*trained)
