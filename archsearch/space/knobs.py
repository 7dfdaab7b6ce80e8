"""From search knobs to a concrete shape.

Users and the search think in knobs (aspect ratio, d_ff / d_model, head_dim); an `ArchConfig`
stores the sizes. `config_from_knobs` derives the coupled sizes so the result is valid by
construction, or says which knob makes it impossible.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any

from archsearch.errors import ConfigError
from archsearch.space.config import ACTIVATIONS, ArchConfig, check_size
from archsearch.space.width import gated_d_ff

ARCH_FIELDS = frozenset(f.name for f in dataclasses.fields(ArchConfig))
DEFAULT_HEAD_DIM = 64  # what flash attention kernels are tuned for, with 128
DEFAULT_D_FF_RATIO = 4  # the plain-MLP ratio; gated MLPs take 2/3 of it (the 8/3 rule)
DEFAULT_MULTIPLE_OF = 64  # tensor-core friendly without LLaMA's coarse 256 at small widths


def aligned_d_ff(
    d_model: int,
    activation: str,
    d_ff_ratio: float | Fraction = DEFAULT_D_FF_RATIO,
    multiple_of: int = DEFAULT_MULTIPLE_OF,
    gated_parity: bool = True,
) -> int:
    """The MLP width for a ratio, rounded up to `multiple_of`.

    With `gated_parity`, a gated activation takes 2/3 of the ratio (same parameters and FLOPs as
    the plain MLP the ratio describes); without it, the ratio applies as given.

    Raises:
        ConfigError: a non-positive ratio or multiple, or an unknown activation.
    """
    if activation not in ACTIVATIONS:
        raise ConfigError(f"activation {activation!r} is unknown; valid: {', '.join(ACTIVATIONS)}")
    # Finite: `config new --d-ff-ratio inf` (or nan) would pass a `<= 0` check into an
    # OverflowError traceback.
    if not (math.isfinite(d_ff_ratio) and d_ff_ratio > 0):
        raise ConfigError(f"d_ff_ratio must be positive and finite, got {d_ff_ratio}")
    if ACTIVATIONS[activation].gated and gated_parity:
        return gated_d_ff(d_model, multiple_of=multiple_of, plain_ratio=d_ff_ratio)
    if multiple_of <= 0:
        raise ConfigError(f"multiple_of must be positive, got {multiple_of}")
    return multiple_of * math.ceil(Fraction(d_ff_ratio) * d_model / multiple_of)


def config_from_knobs(
    *,
    d_model: int,
    n_layers: int | None = None,
    aspect_ratio: float | None = None,
    n_heads: int | None = None,
    head_dim: int | None = None,
    n_kv_heads: int | None = None,
    d_ff: int | None = None,
    d_ff_ratio: float = DEFAULT_D_FF_RATIO,
    multiple_of: int = DEFAULT_MULTIPLE_OF,
    gated_parity: bool = True,
    **fields: Any,
) -> ArchConfig:
    """Build an `ArchConfig`, deriving the sizes that are not given.

    - `n_layers` from `aspect_ratio = d_model / n_layers` (rounded, at least 1).
    - `n_heads` from `head_dim` (default 64) so that `n_heads * head_dim = d_model`, or `head_dim`
      from `n_heads`; both may be given and need not multiply to d_model.
    - `n_kv_heads` defaults to `n_heads` (MHA).
    - `d_ff` from `d_ff_ratio` via `aligned_d_ff`.
    Other keyword arguments are `ArchConfig` fields (vocab_size, seq_len, activation, ...).

    Raises:
        ConfigError: the knobs contradict each other or the result is not a valid config.
    """
    unknown = sorted(set(fields) - ARCH_FIELDS)
    if unknown:
        raise ConfigError(f"unknown ArchConfig field(s): {', '.join(unknown)}")
    sizes = dict(
        d_model=d_model, n_layers=n_layers, n_heads=n_heads, head_dim=head_dim, n_kv_heads=n_kv_heads,
        d_ff=d_ff, multiple_of=multiple_of,
    )  # fmt: skip
    for name, value in sizes.items():  # before any arithmetic: 400 digits overflowed a float division
        check_size(name, value)
    if n_layers is None:
        if aspect_ratio is None:
            raise ConfigError("give n_layers or aspect_ratio (d_model / n_layers)")
        if not (math.isfinite(aspect_ratio) and aspect_ratio > 0):  # nan: a ValueError traceback
            raise ConfigError(f"aspect_ratio must be positive and finite, got {aspect_ratio}")
        n_layers = max(1, round(d_model / aspect_ratio))
    elif aspect_ratio is not None:
        raise ConfigError("give n_layers or aspect_ratio, not both")
    if n_heads is None:
        head_dim = DEFAULT_HEAD_DIM if head_dim is None else head_dim
        if head_dim <= 0 or d_model % head_dim:
            raise ConfigError(f"head_dim={head_dim} must divide d_model={d_model} to derive n_heads")
        n_heads = d_model // head_dim
    elif head_dim is None:
        if n_heads <= 0 or d_model % n_heads:
            raise ConfigError(f"n_heads={n_heads} must divide d_model={d_model} to derive head_dim")
        head_dim = d_model // n_heads
    if d_ff is None:
        activation = fields.get("activation", ArchConfig.activation)
        d_ff = aligned_d_ff(d_model, activation, d_ff_ratio, multiple_of, gated_parity)
    return ArchConfig(
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_heads if n_kv_heads is None else n_kv_heads,
        head_dim=head_dim,
        d_ff=d_ff,
        **fields,
    )
