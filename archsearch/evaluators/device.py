"""The device at hand: what it is (`DeviceInfo`, whose fingerprint keys every measurement), how a
name such as "auto", "cpu" or "cuda:1" resolves to it, its free memory, and what an allocation
failure on it looks like. Measuring kernels on it is `profiler`'s job, training on it `trainer`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
from dataclasses import dataclass
from typing import Any

import torch

from archsearch.errors import ArchsearchError
from archsearch.evaluators.settings import physical_memory_bytes

_MEMORY_ERROR_MARKERS = ("out of memory", "can't allocate memory", "not enough memory")


class DeviceError(ArchsearchError):
    """No such device here: not a device name, neither CPU nor CUDA, or CUDA asked for where torch
    sees none (or not that ordinal)."""


@dataclass(frozen=True)
class DeviceInfo:
    """Where a measurement was taken: everything that decides how fast a kernel runs.

    Attributes:
        type: "cpu" or "cuda".
        index: CUDA device ordinal; None on CPU.
        name: GPU name (`torch.cuda.get_device_name`) or CPU model (/proc/cpuinfo "model name").
        units: streaming multiprocessors on CUDA; logical CPU cores (`os.cpu_count`) on CPU.
        threads: torch intra-op threads (`torch.get_num_threads`) the CPU kernels run on.
        capability: what decides the kernels picked: CUDA compute capability ("sm_90") or the
            CPU SIMD level torch dispatches to ("AVX512").
        cpu_capability: `torch.backends.cpu.get_cpu_capability()` of the host, on both types.
        torch_version: `torch.__version__`, whose kernels and heuristics change between releases.
        cuda_version: `torch.version.cuda`; None in CPU-only builds.
        memory_bytes: total device memory (GPU) or physical RAM (CPU); 0 when unknown.
    """

    type: str
    index: int | None
    name: str
    units: int
    threads: int
    capability: str
    cpu_capability: str
    torch_version: str
    cuda_version: str | None
    memory_bytes: int

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.type, self.index) if self.index is not None else torch.device(self.type)

    @property
    def fingerprint(self) -> str:
        """16 hex digits identifying the fields that change kernel speed; stable across runs.

        The CUDA ordinal and the memory size are left out: two identical GPUs share measurements.
        The thread count counts only on CPU, where it is what runs the kernels.
        """
        fields = {
            "type": self.type,
            "name": self.name,
            "units": self.units,
            "capability": self.capability,
            "torch": self.torch_version,
            "cuda": self.cuda_version,
            "threads": self.threads if self.type == "cpu" else None,
        }
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
        return digest[:16]

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "index": self.index,
            "name": self.name,
            "units": self.units,
            "threads": self.threads,
            "capability": self.capability,
            "cpu_capability": self.cpu_capability,
            "torch_version": self.torch_version,
            "cuda_version": self.cuda_version,
            "memory_bytes": self.memory_bytes,
            "fingerprint": self.fingerprint,
        }


def _cpu_model_name() -> str:
    """The CPU model: /proc/cpuinfo on Linux, else what `platform` knows."""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    return platform.processor() or platform.machine() or "unknown cpu"


def detect_device(device: str = "cpu") -> DeviceInfo:
    """Describe `device` ("cpu", "cuda" or "cuda:N") for measurements taken on it.

    Raises:
        DeviceError: the string is not a device, the type is neither CPU nor CUDA, or CUDA is
            asked for where torch sees none (or not that ordinal).
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DeviceError(f"not a device: {device!r}; use 'cpu', 'cuda' or 'cuda:N'") from exc
    common = {
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_version": str(torch.__version__),
        "cuda_version": torch.version.cuda,
    }
    if dev.type == "cpu":
        return DeviceInfo(
            type="cpu",
            index=None,
            name=_cpu_model_name(),
            units=os.cpu_count() or 1,
            capability=common["cpu_capability"],
            memory_bytes=physical_memory_bytes(),
            **common,
        )
    if dev.type != "cuda":
        raise DeviceError(f"cannot profile on {device!r}: only 'cpu' and 'cuda[:N]' are supported")
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a build without CUDA"
        raise DeviceError(
            f"{device!r} asked for, but torch sees no CUDA device (torch {torch.__version__}, {build}); "
            "use --device cpu"
        )
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise DeviceError(f"{device!r} asked for, but there are {count} CUDA devices (0..{count - 1})")
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(
        type="cuda",
        index=index,
        name=torch.cuda.get_device_name(index),
        units=props.multi_processor_count,
        capability=f"sm_{props.major}{props.minor}",
        memory_bytes=props.total_memory,
        **common,
    )


def available_memory_bytes(info: DeviceInfo) -> int | None:
    """Memory free for new tensors now: CUDA's free memory, or Linux's MemAvailable; None if unknown."""
    if info.type == "cuda":
        return torch.cuda.mem_get_info(info.index)[0]
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the file counts kB
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def resolve_device(name: str) -> DeviceInfo:
    """ "auto" is CUDA when present, else CPU; anything else as `detect_device` reads it.

    Raises:
        DeviceError: an unknown device, or CUDA asked for where there is none.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return detect_device(name)


def is_memory_error(exc: BaseException) -> bool:
    """An allocation failure: CUDA's OutOfMemoryError, Python's MemoryError, or a CPU allocator's
    RuntimeError ("can't allocate memory")."""
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc).lower() for s in _MEMORY_ERROR_MARKERS)
