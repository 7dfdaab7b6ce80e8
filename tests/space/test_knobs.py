from __future__ import annotations

import pytest

from archsearch.errors import ConfigError
from archsearch.space.knobs import aligned_d_ff, config_from_knobs


def test_aspect_ratio_and_head_dim_derive_layers_and_heads():
    cfg = config_from_knobs(d_model=512, aspect_ratio=128, head_dim=64, vocab_size=256, seq_len=128)
    assert (cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (4, 8, 8, 64)


def test_gated_parity_takes_two_thirds_of_the_ratio():
    assert aligned_d_ff(768, "gelu", 4, 64) == 3072
    assert aligned_d_ff(768, "swiglu", 4, 64) == 2048
    assert aligned_d_ff(768, "swiglu", 4, 64, gated_parity=False) == 3072
    assert aligned_d_ff(100, "relu", 4, 64) == 448  # 400 rounded up to a multiple of 64


def test_n_heads_derives_head_dim():
    cfg = config_from_knobs(d_model=384, n_layers=2, n_heads=6, n_kv_heads=2, vocab_size=256, seq_len=64)
    assert (cfg.head_dim, cfg.kv_groups) == (64, 3)


@pytest.mark.parametrize(
    ("knobs", "match"),
    [
        ({"d_model": 512}, "give n_layers or aspect_ratio"),
        ({"d_model": 512, "n_layers": 2, "aspect_ratio": 64}, "not both"),
        ({"d_model": 512, "aspect_ratio": 0}, "aspect_ratio must be positive"),
        ({"d_model": 500, "n_layers": 2}, "head_dim=64 must divide d_model=500"),
        ({"d_model": 512, "n_layers": 2, "n_heads": 3}, "n_heads=3 must divide d_model=512"),
        ({"d_model": 512, "n_layers": 2, "n_kv_heads": 3}, "n_kv_heads=3 must divide n_heads=8"),
        ({"d_model": 512, "n_layers": 2, "activation": "tanh"}, "activation 'tanh' is unknown"),
        ({"d_model": 512, "n_layers": 2, "dmodel": 3}, r"unknown ArchConfig field\(s\): dmodel"),
    ],
)
def test_contradictions_are_config_errors(knobs, match):
    with pytest.raises(ConfigError, match=match):
        config_from_knobs(vocab_size=256, seq_len=64, **knobs)
