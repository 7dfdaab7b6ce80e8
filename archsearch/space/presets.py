"""Published architectures as `ArchConfig`s, with their published exact parameter counts.

Each count is what the reference implementation reports for the released checkpoint
(`transformers`' `model.num_parameters()`, tied weights once); tests pin the cost model to them.
"""

from __future__ import annotations

from dataclasses import dataclass

from archsearch.registry import Registry
from archsearch.space.config import ArchConfig


@dataclass(frozen=True)
class Preset:
    """A named shape and where its numbers come from."""

    config: ArchConfig
    published_params: int | None  # exact published count; None for archsearch's own shapes
    source: str  # the paper or model card the shape and count come from


PRESETS: Registry[Preset] = Registry("preset")


def _gpt2(d_model: int, n_layers: int, n_heads: int) -> ArchConfig:
    """GPT-2: learned positions, pre-LayerNorm with biases, GELU at 4x, tied embeddings."""
    return ArchConfig(
        vocab_size=50257, seq_len=1024, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=n_heads, head_dim=d_model // n_heads, d_ff=4 * d_model, activation="gelu",
        norm="layernorm", norm_placement="pre", pos_embedding="learned", bias=True,
        tie_embeddings=True,
    )  # fmt: skip


def _llama(
    vocab_size: int, seq_len: int, d_model: int, n_layers: int, n_kv_heads: int, d_ff: int
) -> ArchConfig:
    """LLaMA family: RoPE, pre-RMSNorm, SwiGLU, no biases, untied head, head_dim 128."""
    return ArchConfig(
        vocab_size=vocab_size, seq_len=seq_len, d_model=d_model, n_layers=n_layers,
        n_heads=d_model // 128, n_kv_heads=n_kv_heads, head_dim=128, d_ff=d_ff,
        activation="swiglu", norm="rmsnorm", norm_placement="pre", pos_embedding="rope",
        bias=False, tie_embeddings=False,
    )  # fmt: skip


_GPT2 = "Radford et al. 2019, GPT-2; Hugging Face gpt2 checkpoints"
PRESETS.register("gpt2-small", Preset(_gpt2(768, 12, 12), 124_439_808, _GPT2))
PRESETS.register("gpt2-medium", Preset(_gpt2(1024, 24, 16), 354_823_168, _GPT2))
PRESETS.register("gpt2-large", Preset(_gpt2(1280, 36, 20), 774_030_080, _GPT2))
PRESETS.register("gpt2-xl", Preset(_gpt2(1600, 48, 25), 1_557_611_200, _GPT2))
PRESETS.register(
    "llama2-7b",
    Preset(_llama(32000, 4096, 4096, 32, 32, 11008), 6_738_415_616, "Touvron et al. 2023, Llama 2"),
)
PRESETS.register(
    "llama2-13b",
    Preset(_llama(32000, 4096, 5120, 40, 40, 13824), 13_015_864_320, "Touvron et al. 2023, Llama 2"),
)
PRESETS.register(
    "llama3-8b",
    Preset(_llama(128256, 8192, 4096, 32, 8, 14336), 8_030_261_248, "Meta 2024, Llama 3 model card"),
)
PRESETS.register(
    "mistral-7b",
    Preset(_llama(32000, 8192, 4096, 32, 8, 14336), 7_241_732_096, "Jiang et al. 2023, Mistral 7B"),
)
# Gemma-7B: 16 heads of 256 on a 3072-wide residual, so n_heads * head_dim != d_model.
PRESETS.register(
    "gemma-7b",
    Preset(
        ArchConfig(
            vocab_size=256000,
            seq_len=8192,
            d_model=3072,
            n_layers=28,
            n_heads=16,
            n_kv_heads=16,
            head_dim=256,
            d_ff=24576,
            activation="geglu",
            norm="rmsnorm",
            norm_placement="pre",
            pos_embedding="rope",
            bias=False,
            tie_embeddings=True,
        ),
        8_537_680_896,
        "Gemma Team 2024, Gemma: open models",
    ),
)
# archsearch's own ~1M-parameter byte-level proxy: trains on a CPU in minutes.
PRESETS.register(
    "byte-1m",
    Preset(
        ArchConfig(
            vocab_size=256,
            seq_len=256,
            d_model=128,
            n_layers=4,
            n_heads=4,
            n_kv_heads=4,
            head_dim=32,
            d_ff=384,
        ),
        None,
        "archsearch: a LLaMA-style shape at aspect ratio 32 for CPU proxy runs",
    ),
)


def preset(name: str) -> ArchConfig:
    """The config of preset `name`.

    Raises:
        UnknownNameError: no such preset; the message lists them.
    """
    return PRESETS[name].config
