"""Hypothesis strategies: random valid ArchConfigs over every variant, sized for tiny models."""

from __future__ import annotations

from hypothesis import strategies as st

from archsearch.space import ACTIVATIONS, NORM_PLACEMENTS, NORMS, POSITIONS, ArchConfig


@st.composite
def arch_configs(draw: st.DrawFn, max_width: int = 96, max_layers: int = 3) -> ArchConfig:
    """Any valid shape: odd sizes, GQA/MQA, head_dim != d_model / n_heads, every variant."""
    pos = draw(st.sampled_from(POSITIONS.names()))
    n_heads = draw(st.integers(1, 8))
    n_kv_heads = draw(st.sampled_from([k for k in range(1, n_heads + 1) if n_heads % k == 0]))
    head_dim = draw(st.integers(1, 24))
    if POSITIONS[pos].rotary:
        head_dim = 2 * ((head_dim + 1) // 2)
    return ArchConfig(
        vocab_size=draw(st.integers(2, 300)),
        seq_len=draw(st.integers(1, 48)),
        d_model=draw(st.integers(1, max_width)),
        n_layers=draw(st.integers(1, max_layers)),
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        d_ff=draw(st.integers(1, 2 * max_width)),
        activation=draw(st.sampled_from(ACTIVATIONS.names())),
        norm=draw(st.sampled_from(NORMS.names())),
        norm_placement=draw(st.sampled_from(NORM_PLACEMENTS.names())),
        pos_embedding=pos,
        parallel_block=draw(st.booleans()),
        bias=draw(st.booleans()),
        tie_embeddings=draw(st.booleans()),
        qk_norm=draw(st.booleans()),
    )
