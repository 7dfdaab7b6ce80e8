from __future__ import annotations

import dataclasses

import pytest

from archsearch.errors import UnknownNameError
from archsearch.space import (
    PRESETS,
    cost_report,
    flop_counts,
    kv_cache_bytes_per_token,
    param_counts,
    preset,
    weight_bytes,
)


@pytest.mark.parametrize("name", [n for n, p in PRESETS.items() if p.published_params is not None])
def test_preset_matches_published_parameter_count(name):
    assert param_counts(preset(name)).total == PRESETS[name].published_params


def test_required_presets_exist():
    assert {"gpt2-small", "gpt2-medium", "llama2-7b", "llama3-8b", "mistral-7b"} <= set(PRESETS)


def test_gpt2_small_by_component():
    # Hand count: 12 layers of 12d^2 + 13d weights and biases, wte + wpe, final LayerNorm.
    d, L = 768, 12
    p = param_counts(preset("gpt2-small"))
    assert p.embedding == 50257 * d + 1024 * d
    assert p.attention == L * (4 * d * d + 4 * d)
    assert p.mlp == L * (8 * d * d + 5 * d)
    assert p.norms == L * 4 * d + 2 * d
    assert p.head == 0  # tied
    assert p.non_embedding == 85_056_000
    assert p.total == 124_439_808


def test_llama2_7b_flops_per_token():
    # 2 FLOPs per weight of every projection, + QK^T and PV at T = 4096, + LM head.
    cfg = preset("llama2-7b")
    f = flop_counts(cfg)
    weights = 32 * (4 * 4096**2 + 3 * 4096 * 11008)
    assert f.attention_proj + f.mlp == 2 * weights
    assert f.attention_full == 32 * 4 * 4096 * 4096
    assert f.attention_causal == 32 * 2 * 4097 * 4096
    assert f.head == 2 * 4096 * 32000
    assert f.forward == 2 * weights + 32 * 4 * 4096 * 4096 + 2 * 4096 * 32000
    assert f.train == 3 * f.forward
    assert f.forward_causal < f.forward


def test_gqa_shrinks_projection_flops_not_attention_products():
    mha = preset("llama2-7b")
    gqa = dataclasses.replace(mha, n_kv_heads=8)
    assert flop_counts(gqa).attention_full == flop_counts(mha).attention_full
    assert flop_counts(mha).attention_proj - flop_counts(gqa).attention_proj == 32 * 2 * 2 * 4096 * (
        4096 - 1024
    )


def test_kv_cache_and_weight_bytes():
    cfg = preset("llama3-8b")
    assert kv_cache_bytes_per_token(cfg, "bf16") == 2 * 32 * 8 * 128 * 2 == 131_072
    assert kv_cache_bytes_per_token(cfg, "fp32") == 262_144
    assert weight_bytes(cfg, "bf16") == 2 * 8_030_261_248
    with pytest.raises(UnknownNameError, match=r"unknown dtype 'int3'; valid: fp32, bf16, fp16, fp8"):
        weight_bytes(cfg, "int3")


def test_cost_report_fields():
    report = cost_report(preset("gpt2-small"))
    for key in (
        "params_total", "params_non_embedding", "flops_forward_per_token", "flops_forward_per_token_causal",
        "flops_train_per_token", "kv_cache_bytes_per_token", "relu_feature_loss_log10",
    ):  # fmt: skip
        assert key in report
    assert report["relu_feature_loss_log10"] is None  # GELU is smooth
    relu = dataclasses.replace(preset("gpt2-small"), activation="relu")
    # n = 768 inputs, m = 3072 units: far past the 2x cliff.
    assert cost_report(relu)["relu_feature_loss_log10"] < -100


def test_training_activations_of_a_gpt3_layer_are_korthikanti_less_the_dropout_masks():
    # Korthikanti et al. 2022: 34 bytes per token per d_model a layer in 16-bit without
    # recomputation, 2 of them dropout masks; with flash attention no score matrix is kept.
    from archsearch.space.costs import train_activation_bytes_per_token

    cfg = preset("gpt2-medium")  # d_ff 4 d_model, MHA
    logits = cfg.vocab_size * (2 + 4)
    assert train_activation_bytes_per_token(cfg) == cfg.n_layers * 32 * cfg.d_model + logits
