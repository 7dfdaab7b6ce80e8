"""FLOP formulas that `torch.utils.flop_counter.FlopCounterMode` lacks for the proxy's attention,
registered on import (`evaluators.model` imports this, so a model counted with it is counted whole).

Without them FlopCounterMode counts the CPU flash-attention kernel as 0 FLOPs, and on older torch
builds raises on every GQA model; with them its count of `model.ProxyLM` equals
`space.costs.flop_counts` (tests pin it on CPU and CUDA).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.flop_counter import (
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
    shape_wrapper,
)


def _gqa_shapes(query_shape, key_shape, value_shape) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """K and V shapes (B, K, T, D) given the query's head count: GQA costs what MHA over repeated
    K/V heads costs. torch 2.13's SDPA formulas count it so; older ones (2.11.0+cu130 on the
    H100 machine, 2026-11-22) assert equal head counts, so FlopCounterMode raised on every GQA
    model there, on CPU and CUDA alike."""
    heads = query_shape[1]
    return (*key_shape[:1], heads, *key_shape[2:]), (*value_shape[:1], heads, *value_shape[2:])


# FlopCounterMode has no formula for the CPU flash-attention kernel SDPA picks on CPU (torch 2.13),
# so it counts CPU attention as 0 FLOPs. Give it torch's own SDPA formulas, unless torch has some.
def _cpu_flash_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, *_gqa_shapes(query_shape, key_shape, value_shape))


def _cpu_flash_backward_flop(
    grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs
) -> int:
    return sdpa_backward_flop_count(
        grad_out_shape, query_shape, *_gqa_shapes(query_shape, key_shape, value_shape)
    )


for _op, _formula in (
    (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu, _cpu_flash_flop),
    (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward, _cpu_flash_backward_flop),
):
    if _op not in flop_registry:
        register_flop_formula(_op)(_formula)


def _torch_counts_gqa() -> bool:
    try:
        sdpa_flop_count((1, 2, 1, 8), (1, 1, 1, 8), (1, 1, 1, 8))
    except AssertionError:
        return False
    return True


def _with_gqa_shapes(raw: Callable[..., int], query_index: int) -> Callable[..., int]:
    """torch's shape formula of an SDPA op, called with K and V expanded to the query's heads."""

    def formula(*shapes, **kwargs) -> int:
        q, k, v = shapes[query_index : query_index + 3]
        return raw(*shapes[:query_index], q, *_gqa_shapes(q, k, v), *shapes[query_index + 3 :], **kwargs)

    return shape_wrapper(formula)


# The CUDA kernels' formulas are torch's own: patch them only where torch cannot count GQA.
if not _torch_counts_gqa():
    for _name, _query_index in (
        ("_scaled_dot_product_flash_attention", 0),
        ("_scaled_dot_product_efficient_attention", 0),
        ("_scaled_dot_product_cudnn_attention", 0),
        ("_scaled_dot_product_flash_attention_backward", 1),  # after grad_out
        ("_scaled_dot_product_efficient_attention_backward", 1),
        ("_scaled_dot_product_cudnn_attention_backward", 1),
    ):
        _packet = getattr(torch.ops.aten, _name, None)
        _raw = getattr(flop_registry.get(_packet), "__wrapped__", None)  # shape_wrapper keeps it
        if _raw is not None:
            flop_registry[_packet] = _with_gqa_shapes(_raw, _query_index)
