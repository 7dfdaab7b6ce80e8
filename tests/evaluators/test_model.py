from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from torch.utils.flop_counter import FlopCounterMode

from archsearch.evaluators.model import ProxyLM, count_parameters
from archsearch.space import ACTIVATIONS, NORM_PLACEMENTS, ArchConfig, flop_counts, param_counts, preset
from tests.strategies import arch_configs

TINY = ArchConfig(
    vocab_size=32, seq_len=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64
)


@settings(max_examples=400, deadline=None)
@given(arch_configs(max_width=160, max_layers=4))
def test_param_count_equals_numel(cfg):
    with torch.device("meta"):
        model = ProxyLM(cfg)
    assert count_parameters(model) == param_counts(cfg).total


def measured_forward_flops(model: ProxyLM, seq_len: int, device: str) -> int:
    idx = torch.zeros(1, seq_len, dtype=torch.long, device=device)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(idx)
    return counter.get_total_flops()


@settings(max_examples=200, deadline=None)
@given(arch_configs())
def test_forward_flops_equal_flop_counter_on_cpu(cfg):
    model = ProxyLM(cfg)
    # The issue allows 0.5%; the count is exact.
    assert measured_forward_flops(model, cfg.seq_len, "cpu") == flop_counts(cfg).forward * cfg.seq_len


@pytest.mark.parametrize("name", ["gpt2-small", "llama3-8b", "gemma-7b"])
def test_presets_on_meta_device(name):
    cfg = preset(name)
    with torch.device("meta"):
        model = ProxyLM(cfg)
    assert count_parameters(model) == param_counts(cfg).total
    assert measured_forward_flops(model, cfg.seq_len, "meta") == flop_counts(cfg).forward * cfg.seq_len


def test_training_flops_are_three_times_forward():
    model = ProxyLM(TINY)
    idx = torch.randint(0, TINY.vocab_size, (1, TINY.seq_len))
    with FlopCounterMode(display=False) as counter:
        model.loss(idx, idx).backward()
    # Every matrix product costs exactly 3x its forward FLOPs; torch counts SDPA's backward as 2.5x
    # its forward (flash attention recomputes the scores), so attention costs 3.5x.
    f = flop_counts(TINY)
    expected = 3 * (f.forward - f.attention_full) + 3.5 * f.attention_full
    assert counter.get_total_flops() == expected * TINY.seq_len
    assert counter.get_total_flops() == pytest.approx(f.train * TINY.seq_len, rel=0.02)


@settings(max_examples=40, deadline=None)
@given(arch_configs(max_layers=2))
def test_outputs_are_causal(cfg):
    torch.manual_seed(0)
    model = ProxyLM(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % cfg.vocab_size
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert a.shape == (2, cfg.seq_len, cfg.vocab_size)
    torch.testing.assert_close(a[:, :-1], b[:, :-1])


def test_gqa_equals_mha_with_repeated_kv_heads():
    torch.manual_seed(0)
    gqa, mha = ProxyLM(TINY), ProxyLM(dataclasses.replace(TINY, n_kv_heads=4))
    state = gqa.state_dict()
    hd, q_dim = TINY.head_dim, TINY.q_dim

    def repeat(t: torch.Tensor) -> torch.Tensor:
        # Each of the 2 KV heads serves 2 consecutive query heads.
        return t.view(2, hd, -1).repeat_interleave(2, dim=0).reshape(4 * hd, -1)

    for i in range(TINY.n_layers):
        q, k, v = state[f"blocks.{i}.attn.qkv.weight"].split([q_dim, 2 * hd, 2 * hd])
        state[f"blocks.{i}.attn.qkv.weight"] = torch.cat([q, repeat(k), repeat(v)])
    mha.load_state_dict(state)
    idx = torch.randint(0, TINY.vocab_size, (2, TINY.seq_len))
    torch.testing.assert_close(gqa(idx), mha(idx))


def test_tied_head_shares_the_embedding():
    model = ProxyLM(dataclasses.replace(TINY, tie_embeddings=True))
    assert model.head.weight is model.tok_emb.weight


def test_sequence_longer_than_seq_len_is_rejected():
    with pytest.raises(ValueError, match="longer than seq_len=16"):
        ProxyLM(TINY)(torch.zeros(1, 17, dtype=torch.long))


def overfit(cfg: ArchConfig, steps: int = 150) -> tuple[float, float]:
    """Train on one fixed batch; return (first loss, last loss)."""
    torch.manual_seed(0)
    model = ProxyLM(cfg)
    batch = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len + 1))
    x, y = batch[:, :-1], batch[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        loss = model.loss(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses[0], losses[-1]


@pytest.mark.parametrize(
    ("activation", "norm_placement"),
    list(itertools.product(ACTIVATIONS.names(), NORM_PLACEMENTS.names())),
    ids=lambda v: v,
)
def test_every_activation_and_placement_overfits_a_batch(activation, norm_placement):
    cfg = dataclasses.replace(TINY, activation=activation, norm_placement=norm_placement)
    first, last = overfit(cfg)
    assert first == pytest.approx(math.log(TINY.vocab_size), abs=0.3)  # uniform at init
    assert last < 0.1 * first


@pytest.mark.parametrize(
    "changes",
    [
        {"parallel_block": True},
        {"parallel_block": True, "norm_placement": "sandwich"},
        {"parallel_block": True, "norm_placement": "post"},
        {"qk_norm": True, "n_kv_heads": 1},
        {"pos_embedding": "learned", "norm": "layernorm", "bias": True, "tie_embeddings": True},
        {"pos_embedding": "none", "activation": "gelu"},
    ],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()),
)
def test_other_variants_overfit_a_batch(changes):
    first, last = overfit(dataclasses.replace(TINY, **changes))
    assert last < 0.1 * first


def test_an_rmsnorm_casts_its_weight_to_a_bf16_input_so_cuda_can_fuse_it():
    # Under autocast a qk-norm sees bf16 projections and a sandwich norm a bf16 sublayer output;
    # against the fp32 weight PyTorch warns "Cannot dispatch to fused implementation" and runs a
    # dozen kernels each way on CUDA. Cast, it runs one; the weight's gradient stays fp32.
    import warnings

    import torch.nn.functional as F

    from archsearch.evaluators.model import NORM_EPS, make_norm

    cfg = dataclasses.replace(preset("gpt2-small"), norm="rmsnorm", bias=False)
    norm = make_norm(cfg, 16)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(4, 16).bfloat16()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "Mismatch dtype between input and weight"
        y = norm(x)
    assert y.dtype == torch.bfloat16
    expected = F.rms_norm(x.float(), (16,), norm.weight.detach(), NORM_EPS)
    torch.testing.assert_close(y.float(), expected, atol=0.05, rtol=0.02)
    y.float().sum().backward()
    assert norm.weight.grad is not None and norm.weight.grad.dtype == torch.float32
    fp32 = torch.randn(4, 16)
    torch.testing.assert_close(norm(fp32), F.rms_norm(fp32, (16,), norm.weight, NORM_EPS))  # as before
