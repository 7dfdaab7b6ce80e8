"""Scaled candidate shapes keep every design choice of the trial and land near the target size."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest

from archsearch.errors import ArchsearchError
from archsearch.space import ArchConfig, param_counts
from archsearch.space.scale_candidates import (
    KEPT_FIELDS,
    aspect_range,
    d_ff_options,
    design_choices,
    naive_d_ff,
    pad_vocab,
    scaled_candidates,
)
from archsearch.units import parse_count

LLAMA = ArchConfig(
    vocab_size=256, seq_len=32, d_model=96, n_layers=3, n_heads=6, n_kv_heads=2, head_dim=16, d_ff=256
)  # GQA groups of 3, d_ff / d_model = 8/3
GPT2 = ArchConfig(
    vocab_size=256, seq_len=32, d_model=48, n_layers=2, n_heads=4, n_kv_heads=4, head_dim=12, d_ff=192,
    activation="gelu", norm="layernorm", pos_embedding="learned", bias=True, tie_embeddings=True,
)  # fmt: skip
SOURCES = {
    "llama-gqa": LLAMA,
    "gpt2-mha": GPT2,
    "mqa-qknorm-parallel": replace(LLAMA, n_kv_heads=1, qk_norm=True, parallel_block=True, head_dim=64),
    "sandwich-reglu-bias": replace(LLAMA, norm_placement="sandwich", activation="reglu", bias=True),
}


@pytest.mark.parametrize("target", [300_000_000, 1_300_000_000], ids=["300M", "1.3B"])
@pytest.mark.parametrize("name", SOURCES)
def test_every_candidate_keeps_the_design_and_the_size(name, target):
    source = SOURCES[name]
    shapes = scaled_candidates(source, target, seq_len=2048, vocab_size=50304)
    assert shapes
    kept = design_choices(source)
    low, high = aspect_range(target)
    for cfg in shapes:
        choices = design_choices(cfg)
        for key in (*KEPT_FIELDS, "attention_layout", "kv_groups", "q_ratio"):
            assert choices[key] == kept[key], (key, cfg)
        # d_ff: the trial's ratio rounded up to a multiple of 128 or 256, never narrower
        exact = kept["d_ff_ratio"] * cfg.d_model
        assert exact <= cfg.d_ff < exact + 256 and cfg.d_ff % 128 == 0
        assert cfg.d_model % 128 == 0 and cfg.head_dim in (64, 128) and low <= cfg.aspect_ratio <= high
        assert abs(param_counts(cfg).total / target - 1) <= 0.1
        assert (cfg.seq_len, cfg.vocab_size) == (2048, 50304)


@pytest.mark.parametrize("name", SOURCES)
def test_the_candidates_are_every_depth_in_the_window_as_one_shape_per_depth_finds_them(name):
    # The depths are solved from two counts a width (parameters are linear in depth); built one
    # shape per depth, every width, depth, head_dim and d_ff in the window, they are the same.
    source, target = SOURCES[name], 300_000_000
    shapes = scaled_candidates(source, target, seq_len=2048, vocab_size=50304)
    low, high = aspect_range(target)
    brute = set()
    for cfg in {replace(s, n_layers=1) for s in shapes}:  # every (width, heads, d_ff) that fits
        for depth in range(max(1, -(-cfg.d_model // high)), cfg.d_model // low + 1):
            deeper = replace(cfg, n_layers=depth)
            if abs(param_counts(deeper).total / target - 1) <= 0.1:
                brute.add(deeper)
    assert set(shapes) == brute and len(shapes) == len(brute)


def test_a_fast_head_dim_is_kept_and_mqa_stays_mqa():
    shapes = scaled_candidates(SOURCES["mqa-qknorm-parallel"], 10**9, seq_len=2048, vocab_size=256)
    assert {c.head_dim for c in shapes} == {64} and {c.n_kv_heads for c in shapes} == {1}


def test_llamas_rule_is_among_the_d_ff_options():
    llama = replace(LLAMA, d_model=96, d_ff=256)  # 8/3
    assert d_ff_options(llama, 4096) == (11008,)  # 10922.67 up to 128 and to 256 alike
    assert naive_d_ff(llama, 4096) == 10923
    assert d_ff_options(llama, 2048) == (5504, 5632)


def test_vocab_padding_and_sizes():
    assert (pad_vocab(50257), pad_vocab(32000), pad_vocab(256)) == (50304, 32000, 256)
    assert parse_count("1.3B") == parse_count("1.3G") == 1_300_000_000 and parse_count("350M") == 350 * 10**6
    assert aspect_range(10**9) == (100, 200) and aspect_range(125 * 10**6) == (32, 100)
    assert design_choices(LLAMA)["d_ff_ratio"] == Fraction(8, 3)


@pytest.mark.parametrize("text", ["1.3X", "-1B", "0", "B", "1.3 billion"])
def test_bad_counts_are_one_line_errors(text):
    with pytest.raises(ArchsearchError, match=r"--scale-to .* must be a positive number.*B \(= G\)"):
        parse_count(text, "--scale-to")


def test_no_candidate_when_the_target_is_too_small():
    assert scaled_candidates(LLAMA, 1000, seq_len=2048, vocab_size=256) == ()
