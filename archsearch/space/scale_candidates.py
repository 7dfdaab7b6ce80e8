"""Shapes at the size a user will train, keeping a searched trial's design choices. Pure, no torch.

Searches run on small proxies; `scaled_candidates` takes a proxy's shape and lists the shapes
near a target parameter count that keep every choice the search made, with widths re-chosen for
the real size. `results.scale_ranking` ranks them by modelled step time on a catalogued GPU.

What is kept (`design_choices`): activation, norm, norm placement, positions, parallel blocks,
bias, tied embeddings, QK-norm; the attention layout (MHA stays MHA, MQA stays MQA, GQA keeps its
group size n_heads / n_kv_heads); the query width relative to d_model; the d_ff / d_model ratio.

What is re-chosen, and why:
1. d_model: multiples of 128, the catalogued GPU tiles' edge, so no dimension pays for a
   mostly empty extra tile (docs/explanations/hardware-costs.md).
2. d_ff: the trial's ratio times d_model rounded *up* to a multiple of 128 or of 256 (LLaMA's
   rule), so the MLP is never narrower than the search chose.
3. depth: from the aspect ratio d_model / n_layers published models use at the target size
   (`aspect_range`), not the proxy's: proxies are shallow and narrow for CPU speed.
4. head_dim: the trial's when flash kernels favour it (64 or 128), else both 64 and 128 are
   tried; a proxy's head_dim of 8-32 is a constraint of its width, not a finding.
5. vocabulary: the user's, padded up to a multiple of 64 (nanoGPT's 50257 -> 50304); default the
   trial's, which for byte-level proxies is 256.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any

from archsearch.errors import ConfigError
from archsearch.space.config import ArchConfig
from archsearch.space.costs import param_counts

D_MODEL_MULTIPLE = 128  # the catalogued GPUs' tile edge (evaluators/catalogue.py _CUBLAS_TILES)
D_FF_MULTIPLES = (128, 256)  # tile edge, and LLaMA's multiple_of
VOCAB_MULTIPLE = 64  # nanoGPT pads GPT-2's 50257 to 50304: an unaligned LM head runs far slower
FAST_HEAD_DIMS = (64, 128)  # what flash attention kernels are tuned for
# The fields a scaled shape copies from the trial unchanged.
KEPT_FIELDS = (
    "activation", "norm", "norm_placement", "pos_embedding", "parallel_block", "bias",
    "tie_embeddings", "qk_norm",
)  # fmt: skip


def aspect_range(target_params: int) -> tuple[int, int]:
    """The d_model / n_layers window published models use at `target_params`.

    Below 1B parameters models sit deeper for their width: GPT-2 at 33-64 (768/12 to 1600/48),
    GPT-3 125M-760M at 43-64 (Brown et al. 2020, table 2.1). From 1B up published models mostly sit
    at 100-200 (LLaMA 7B-65B 128, Llama-3.2-1B 2048/16 = 128).
    """
    return (32, 100) if target_params < 10**9 else (100, 200)


def pad_vocab(vocab_size: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """`vocab_size` rounded up to `multiple` (50257 -> 50304): the LM head's N stays aligned."""
    return multiple * -(-vocab_size // multiple)


def design_choices(cfg: ArchConfig) -> dict[str, Any]:
    """What a scaled shape keeps from `cfg`: the kept fields plus the layout and width ratios."""
    return {
        **{name: getattr(cfg, name) for name in KEPT_FIELDS},
        "attention_layout": cfg.attention_layout,
        "kv_groups": cfg.kv_groups if cfg.attention_layout == "gqa" else None,
        "q_ratio": Fraction(cfg.q_dim, cfg.d_model),
        "d_ff_ratio": Fraction(cfg.d_ff, cfg.d_model),
    }


def d_ff_options(
    cfg: ArchConfig, d_model: int, multiples: tuple[int, ...] = D_FF_MULTIPLES
) -> tuple[int, ...]:
    """The trial's d_ff / d_model ratio at `d_model`, rounded up to each of `multiples`."""
    exact = Fraction(cfg.d_ff, cfg.d_model) * d_model
    return tuple(sorted({m * math.ceil(exact / m) for m in multiples}))


def naive_d_ff(cfg: ArchConfig, d_model: int) -> int:
    """The trial's ratio at `d_model` rounded to the nearest integer: what alignment is measured
    against (`int(8 * 4096 / 3)`-style rounding gives 10923 where LLaMA uses 11008)."""
    return max(1, round(Fraction(cfg.d_ff, cfg.d_model) * d_model))


def head_dim_options(cfg: ArchConfig) -> tuple[int, ...]:
    return (cfg.head_dim,) if cfg.head_dim in FAST_HEAD_DIMS else FAST_HEAD_DIMS


def _heads(cfg: ArchConfig, d_model: int, head_dim: int) -> tuple[int, int] | None:
    """(n_heads, n_kv_heads) at `d_model` with the trial's query width ratio and layout, or None."""
    n_heads = Fraction(cfg.q_dim, cfg.d_model) * d_model / head_dim
    if n_heads.denominator != 1 or n_heads < 1:
        return None
    h = int(n_heads)
    layout = cfg.attention_layout
    if layout == "mha":
        return h, h
    if layout == "mqa":
        return (h, 1) if h > 1 else None
    groups = cfg.kv_groups  # GQA stays GQA: more than one KV head, fewer than the query heads
    if h % groups or h // groups in (1, h):
        return None
    return h, h // groups


def scaled_candidates(
    cfg: ArchConfig,
    target_params: int,
    *,
    seq_len: int,
    vocab_size: int,
    tolerance: float = 0.1,
    aspect: tuple[int, int] | None = None,
    d_model_multiple: int = D_MODEL_MULTIPLE,
    d_ff_multiples: tuple[int, ...] = D_FF_MULTIPLES,
    head_dims: tuple[int, ...] | None = None,
) -> tuple[ArchConfig, ...]:
    """Every shape within `tolerance` of `target_params` that keeps `cfg`'s design choices.

    Args:
        cfg: the trial's (proxy) shape.
        target_params: total parameters wanted (`param_counts(...).total`).
        seq_len: the context the scaled shape trains at.
        vocab_size: its vocabulary, used as given (pad it first with `pad_vocab`).
        tolerance: the largest relative distance from the target kept.
        aspect: the d_model / n_layers window; default `aspect_range(target_params)`.
        d_model_multiple, d_ff_multiples: the grids of d_model and d_ff; the GPU tiles' unless
            a size ladder's small rungs need finer ones (`search.ladder_plan`).
        head_dims: the head widths tried; default `head_dim_options(cfg)`.

    Returns:
        The shapes, ordered by (d_model, n_layers, head_dim, d_ff); empty when none fits.

    Raises:
        ConfigError: a non-positive target, tolerance, aspect window or grid.
    """
    grids = (d_model_multiple, *d_ff_multiples, *(head_dims or (1,)))
    if not d_ff_multiples or head_dims == () or min(grids) <= 0:
        raise ConfigError(
            f"the grids must be positive, got d_model_multiple {d_model_multiple}, d_ff_multiples "
            f"{d_ff_multiples}, head_dims {head_dims}"
        )
    if target_params <= 0 or not 0 < tolerance < 1:
        raise ConfigError(
            f"target_params must be positive and tolerance in (0, 1), got {target_params}, {tolerance}"
        )
    low_aspect, high_aspect = aspect or aspect_range(target_params)
    if not 0 < low_aspect <= high_aspect:
        raise ConfigError(f"aspect window must be 0 < low <= high, got {low_aspect}, {high_aspect}")
    low, high = target_params * (1 - tolerance), target_params * (1 + tolerance)
    kept = {name: getattr(cfg, name) for name in KEPT_FIELDS}
    out = []
    d_model = d_model_multiple
    while True:
        shallowest = max(1, math.ceil(d_model / high_aspect))
        depths = range(shallowest, max(shallowest, math.floor(d_model / low_aspect)) + 1)
        smallest = None
        for head_dim in head_dims or head_dim_options(cfg):
            heads = _heads(cfg, d_model, head_dim)
            if heads is None:
                continue
            for d_ff in d_ff_options(cfg, d_model, d_ff_multiples):
                base = ArchConfig(
                    vocab_size=vocab_size, seq_len=seq_len, d_model=d_model, n_layers=depths[0],
                    n_heads=heads[0], n_kv_heads=heads[1], head_dim=head_dim, d_ff=d_ff, **kept,
                )  # fmt: skip
                # Parameters are exactly linear in depth (every block is the same): the depths in
                # the window follow from two counts, not one shape per depth (building every depth of
                # every width ran for minutes at --scale-to 1P).
                first = param_counts(base).total
                per_layer = param_counts(dataclasses.replace(base, n_layers=depths[0] + 1)).total - first
                smallest = first if smallest is None else min(smallest, first)
                lo = depths[0] + max(0, math.ceil((low - first) / per_layer))
                hi = min(depths[-1], depths[0] + math.floor((high - first) / per_layer))
                out.extend(dataclasses.replace(base, n_layers=n) for n in range(lo, hi + 1))
        # Parameters grow with d_model at the shallowest depth: stop once that passes the window.
        if smallest is not None and smallest > high:
            break
        if d_model > 2**20:  # no head layout fits any width: nothing will
            break
        d_model += d_model_multiple
    return tuple(sorted(out, key=lambda c: (c.d_model, c.n_layers, c.head_dim, c.d_ff)))


def naive_d_model(chosen: ArchConfig, target_params: int) -> int:
    """The integer d_model whose shape (the chosen one's depth, heads and d_ff) comes closest to
    `target_params`: exact sizing without alignment, what the aligned d_model is measured against."""
    best, best_gap = chosen.d_model, abs(param_counts(chosen).total - target_params)
    for d in range(max(1, chosen.d_model - D_MODEL_MULTIPLE + 1), chosen.d_model + D_MODEL_MULTIPLE):
        gap = abs(param_counts(dataclasses.replace(chosen, d_model=d)).total - target_params)
        if gap < best_gap:
            best, best_gap = d, gap
    return best
