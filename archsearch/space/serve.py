"""A serving scenario and what it costs a shape, exactly. Pure, no torch.

A `ServeScenario` says how a shape is served: sequences decoded at once, prompt and generated
lengths, the dtypes weights and cache are held in, the device and its memory limit. `serve_costs`
prices a shape under it with the exact counts of `space.costs`: KV-cache bytes per token and at
the scenario's context, weight bytes, the memory the scenario holds and the largest batch that
fits the limit. What the scenario costs in time is modelled in `evaluators.hardware_serving` (catalogued
GPUs) and measured there too (the device at hand). Background: docs/explanations/serving-costs.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from archsearch.errors import ConfigError
from archsearch.space.config import ArchConfig
from archsearch.space.costs import (
    DTYPE_BYTES,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    max_serve_batch,
    serve_memory_bytes,
    weight_bytes,
)
from archsearch.units import short_number

# The most sequences, prompt or generated tokens a scenario counts: far past any serving run, and
# its cache bytes stay well inside what the database stores (unbounded, 20-digit values would be
# accepted and printed as "1.121e+13Ps").
MAX_SERVE_COUNT = 2**31 - 1
LOCAL = "local"  # the device at hand: measured, not modelled
LOCAL_DEVICES = ("cpu", "cuda")  # and cuda:N; what "local" resolves to


class ServeError(ConfigError):
    """A serving scenario breaks a rule; the message names the field."""


def check_count(name: str, value: Any, error: type[ConfigError] = ConfigError) -> None:
    """A count of sequences or tokens (a batch, a prompt, a context) is a whole number in
    1..MAX_SERVE_COUNT; else `error` naming it: the rule of every modelled step and serving run."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_SERVE_COUNT:
        raise error(f"{name} must be a positive integer up to 2**31 - 1, got {short_number(value)}")


@dataclass(frozen=True)
class ServeScenario:
    """How a shape is served. Validated on construction; never mutated.

    Raises:
        ServeError: a field has the wrong type or breaks a rule (one line naming the field).
    """

    batch: int = 1  # sequences decoded together; 1 is the latency case
    prompt_len: int = 512  # tokens prefilled per sequence
    gen_len: int = 128  # tokens generated per sequence: the cache grows to prompt + generated
    weight_dtype: str = "bf16"  # what serving engines hold 16-bit-trained weights in
    cache_dtype: str = "bf16"  # fp8 caches halve it (vLLM's kv_cache_dtype)
    # "local", "cpu", "cuda", "cuda:N" (measured) or a catalogued GPU (modelled): the space room
    # cannot read the catalogue, `evaluators.hardware_serving.resolve_scenario` checks the name.
    device: str = LOCAL
    # Bytes the server may hold; None: no limit (resolve_scenario gives a GPU its memory).
    memory_bytes: int | None = None
    # Memory held beside weights and cache (activations, allocator slack, CUDA context), stated.
    working_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("batch", "prompt_len", "gen_len"):
            check_count(name, getattr(self, name), ServeError)
        for name in ("weight_dtype", "cache_dtype"):
            if getattr(self, name) not in DTYPE_BYTES:
                valid = ", ".join(DTYPE_BYTES.names())
                raise ServeError(f"{name} {getattr(self, name)!r} is unknown; valid: {valid}")
        for name in ("memory_bytes", "working_bytes"):
            value = getattr(self, name)
            if value is None and name == "memory_bytes":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ServeError(f"{name} must be a whole number of bytes >= 0, got {value!r}")
            if name == "memory_bytes" and value == 0:  # no shape fits: every point was infeasible
                raise ServeError("a memory limit of 0 bytes holds no shape: give more, or none for no limit")
        if not isinstance(self.device, str) or not self.device.strip():
            raise ServeError(f"device must be a device name, got {self.device!r}")

    @property
    def local(self) -> bool:
        """Whether the device is one at hand (measured): local, cpu, cuda or cuda:N."""
        if self.device == LOCAL or self.device in LOCAL_DEVICES:
            return True
        kind, _, index = self.device.partition(":")
        return kind == "cuda" and index.isascii() and index.isdigit()

    @property
    def modelled(self) -> bool:
        """Whether the device is a GPU to model: any other name, which
        `evaluators.hardware_serving.resolve_scenario` checks against the catalogue."""
        return not self.local

    @property
    def context(self) -> int:
        """Tokens each sequence's cache holds at the end: prompt plus generated."""
        return self.prompt_len + self.gen_len

    @property
    def memory_limit(self) -> int | None:
        """The memory limit in force (a catalogued GPU's memory once resolved), or None."""
        return self.memory_bytes

    def replace(self, **changes: Any) -> ServeScenario:
        """A changed copy, validated again."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ServeCosts:
    """What serving a shape under a scenario costs in memory: exact, from the shape."""

    kv_bytes_per_token: int  # one token of one sequence, every layer, key and value
    kv_bytes: int  # the whole batch's cache at the scenario's context
    weight_bytes: int
    memory_bytes: int  # weights + cache + working memory
    memory_limit: int | None
    max_batch: int | None  # largest batch that fits the limit at the context; None: no limit

    @property
    def fits(self) -> bool:
        """The scenario's own batch fits its memory limit (always, without a limit)."""
        return self.memory_limit is None or self.memory_bytes <= self.memory_limit

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "fits": self.fits}


def serve_costs(cfg: ArchConfig, scenario: ServeScenario) -> ServeCosts:
    """The exact memory costs of serving `cfg` under `scenario`."""
    s = scenario
    limit = s.memory_limit
    return ServeCosts(
        kv_bytes_per_token=kv_cache_bytes_per_token(cfg, s.cache_dtype),
        kv_bytes=kv_cache_bytes(cfg, s.context, s.batch, s.cache_dtype),
        weight_bytes=weight_bytes(cfg, s.weight_dtype),
        memory_bytes=serve_memory_bytes(
            cfg, s.batch, s.context, s.weight_dtype, s.cache_dtype, s.working_bytes
        ),
        memory_limit=limit,
        max_batch=(
            None
            if limit is None
            else max_serve_batch(cfg, s.context, limit, s.weight_dtype, s.cache_dtype, s.working_bytes)
        ),
    )
