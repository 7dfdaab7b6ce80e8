from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from torch.utils.flop_counter import FlopCounterMode

from archsearch.evaluators.model import ProxyLM
from archsearch.evaluators.step_kernels import step_kernels
from archsearch.space import flop_counts, preset
from tests.strategies import arch_configs


@settings(max_examples=60, deadline=None)
@given(arch_configs(max_layers=2))
def test_inventory_flops_equal_one_measured_training_step(cfg):
    """The GEMM inventory is exactly what one forward + backward runs; SDPA as its kernel counts."""
    batch = 2
    model = ProxyLM(cfg)
    idx = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len))
    with FlopCounterMode(display=False) as counter:
        model.loss(idx, idx).backward()
    counts = {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}
    kernels = step_kernels(cfg, batch, "fp32")
    gemm_flops = counts.pop("aten.mm", 0) + counts.pop("aten.addmm", 0)  # addmm: a linear with bias
    assert gemm_flops == sum(g.flops for g in kernels.gemms)
    fwd, bwd = kernels.attention
    if "aten.bmm" in counts:  # tiny shapes take SDPA's math path: backward is 2 bmm per forward one
        assert counts == {"aten.bmm": 3 * fwd.flops}
    else:  # the flash kernel's backward counts 2.5x its forward, as the inventory does
        assert sum(counts.values()) == fwd.flops + bwd.flops


def test_gemms_are_three_times_the_forward_projections():
    cfg = preset("llama3-8b")
    kernels = step_kernels(cfg, batch=2)
    f = flop_counts(cfg)
    assert sum(g.flops for g in kernels.gemms) == 3 * (f.forward - f.attention_full) * kernels.tokens
    names = {g.name for g in kernels.gemms}
    for proj in ("qkv", "attn_out", "mlp_up", "mlp_down", "lm_head"):
        assert {f"{proj}.fwd", f"{proj}.dgrad", f"{proj}.wgrad"} <= names
    up = next(g for g in kernels.gemms if g.name == "mlp_up.fwd")
    assert up.shape == (2 * 8192, 2 * 14336, 4096)  # gate and up fused
    wgrad = next(g for g in kernels.gemms if g.name == "qkv.wgrad")
    assert wgrad.shape == (4096 + 2 * 1024, 4096, 2 * 8192) and wgrad.count == 32


def test_attention_calls_and_memory_ops():
    cfg = preset("llama3-8b")
    kernels = step_kernels(cfg, batch=1)
    fwd, bwd = kernels.attention
    assert (fwd.name, bwd.name) == ("sdpa.fwd", "sdpa.bwd")
    assert (fwd.n_heads, fwd.n_kv_heads, fwd.head_dim, fwd.count) == (32, 8, 128, 32)
    assert bwd.flops == fwd.flops * 5 // 2
    assert fwd.causal_flops == fwd.flops * 8193 // 16384
    ops = {op.name: op.bytes for op in kernels.memory_ops}
    assert {"norms", "activation", "residual_add", "cross_entropy", "optimizer", "rope"} <= set(ops)
    assert ops["optimizer"] == 8_030_261_248 * 28  # AdamW: 7 fp32 reads and writes per parameter
    assert all(b > 0 for b in ops.values())


@pytest.mark.parametrize("batch", [0, -1, 2**31, 1.5, True])
def test_batch_must_be_a_whole_count_up_to_2_31(batch):
    with pytest.raises(ValueError, match=r"batch must be a positive integer up to 2\*\*31 - 1"):
        step_kernels(preset("gpt2-small"), batch)
