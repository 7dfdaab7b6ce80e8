"""Incremental decoding with a KV cache: the same logits as the full forward, the cache's bytes as
the cost model counts them, and the same greedy tokens and cache size as transformers' `generate`."""

from __future__ import annotations

import dataclasses
import os

import pytest

torch = pytest.importorskip("torch")

from archsearch.evaluators.model import KVCache, ProxyLM, greedy_generate  # noqa: E402
from archsearch.space.config import ArchConfig  # noqa: E402
from archsearch.space.costs import kv_cache_bytes  # noqa: E402
from archsearch.space.export import hf_model_type  # noqa: E402

BASE = dict(vocab_size=61, seq_len=24, d_model=48, n_layers=2, n_heads=4, n_kv_heads=4, head_dim=12, d_ff=80)
LAYOUTS = {"mha": 4, "gqa": 2, "mqa": 1}
SHAPES = {
    f"{layout}-{placement}-{pos}": ArchConfig(
        **{**BASE, "n_kv_heads": kv}, norm_placement=placement, pos_embedding=pos
    )
    for layout, kv in LAYOUTS.items()
    for placement in ("pre", "post", "sandwich")
    for pos in ("rope", "learned")
}
SHAPES |= {
    "parallel-qknorm-gelu": ArchConfig(**BASE, parallel_block=True, qk_norm=True, activation="gelu"),
    "layernorm-bias-tied-none": ArchConfig(
        **{**BASE, "n_kv_heads": 2}, norm="layernorm", bias=True, tie_embeddings=True, pos_embedding="none"
    ),
    "q-wider-than-d_model": ArchConfig(**{**BASE, "head_dim": 16, "n_kv_heads": 1}),
}


def _model(cfg: ArchConfig) -> ProxyLM:
    torch.manual_seed(0)
    model = ProxyLM(cfg).eval()
    with torch.no_grad():  # non-trivial norm scales and biases
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("name", SHAPES)
def test_cached_decoding_gives_the_full_forwards_logits(name):
    cfg = SHAPES[name]
    model = _model(cfg)
    idx = torch.randint(0, cfg.vocab_size, (3, cfg.seq_len))
    with torch.no_grad():
        full = model(idx)
        cache = KVCache(cfg, batch=3, capacity=cfg.seq_len)
        parts = [model(idx[:, :7], cache)]  # prefill
        parts += [model(idx[:, t : t + 1], cache) for t in range(7, 15)]  # decode, one token a step
        parts.append(model(idx[:, 15:19], cache))  # a chunk after a cached prefix
        parts += [model(idx[:, t : t + 1], cache) for t in range(19, cfg.seq_len)]
    assert cache.length == cfg.seq_len
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)


def test_a_forward_past_the_context_or_the_cache_is_refused():
    cfg = SHAPES["gqa-pre-rope"]
    model = _model(cfg)
    cache = KVCache(cfg, batch=1, capacity=4)
    with torch.no_grad():
        model(torch.zeros(1, 4, dtype=torch.long), cache)
        with pytest.raises(ValueError, match="5 tokens do not fit a cache of 4"):
            model(torch.zeros(1, 1, dtype=torch.long), cache)
        with pytest.raises(ValueError, match="longer than seq_len=24"):
            model(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(ValueError, match="must be positive"):
        KVCache(cfg, batch=0, capacity=4)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_caches_bytes_after_t_tokens_are_the_cost_models(layout, dtype):
    cfg = SHAPES[f"{layout}-pre-rope"]
    model = _model(cfg).to(dtype)
    prompt = torch.randint(0, cfg.vocab_size, (2, 5))
    tokens, cache = greedy_generate(model, prompt, 9)
    assert tokens.shape == (2, 14) and torch.equal(tokens[:, :5], prompt)
    held = 5 + 9 - 1  # the last generated token is never fed back
    assert cache.length == cache.capacity == held
    name = "fp32" if dtype == torch.float32 else "bf16"
    assert cache.nbytes == kv_cache_bytes(cfg, held, batch=2, dtype=name)


def test_greedy_generate_is_the_argmax_of_the_full_forward_at_every_step():
    cfg = SHAPES["mqa-sandwich-learned"]
    model = _model(cfg)
    prompt = torch.randint(0, cfg.vocab_size, (2, 4))
    tokens, _ = greedy_generate(model, prompt, 6)
    with torch.no_grad():
        for t in range(4, 10):
            assert torch.equal(model(tokens[:, :t])[:, -1].argmax(-1), tokens[:, t])


# --- against transformers ------------------------------------------------------------------------
HF_SHAPES = {
    "llama-mha": ArchConfig(**BASE),
    "llama-gqa-bias": ArchConfig(**{**BASE, "n_kv_heads": 2}, bias=True),
    "llama-mqa-reglu": ArchConfig(**{**BASE, "n_kv_heads": 1}, activation="reglu"),
    "qwen3-gqa": ArchConfig(**{**BASE, "n_kv_heads": 2}, qk_norm=True),
    "gpt2": ArchConfig(
        **{**BASE, "d_ff": 192}, activation="gelu", norm="layernorm", pos_embedding="learned", bias=True,
        tie_embeddings=True,
    ),
    "gpt-neox": ArchConfig(
        **{**BASE, "d_ff": 192}, activation="gelu", norm="layernorm", pos_embedding="rope", bias=True,
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def transformers():
    os.environ["HF_HUB_OFFLINE"] = "1"  # configs from a local folder; never the network
    module = pytest.importorskip(
        "transformers", reason="transformers is not installed (the test extra has it)"
    )
    module.logging.set_verbosity_error()
    return module


@pytest.mark.parametrize("name", HF_SHAPES)
def test_greedy_tokens_and_cache_bytes_equal_transformers_generate(name, transformers, tmp_path):
    from tests.helpers import load_hf, proxy_weights_as_hf

    cfg = HF_SHAPES[name]
    assert hf_model_type(cfg) is not None
    model = load_hf(transformers, cfg, tmp_path).eval()
    proxy = _model(cfg)
    head_key = next(k for k in ("lm_head.weight", "embed_out.weight") if k in model.state_dict())
    missing, unexpected = model.load_state_dict(
        proxy_weights_as_hf(proxy, cfg, hf_model_type(cfg), head_key), strict=False
    )
    assert not missing and not unexpected
    prompt = torch.randint(0, cfg.vocab_size, (2, 6))
    new = 12
    ours, cache = greedy_generate(proxy, prompt, new)
    with torch.no_grad():
        out = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, min_new_tokens=new,
            do_sample=False, return_dict_in_generate=True, pad_token_id=0,
        )  # fmt: skip
    assert torch.equal(out.sequences, ours)
    theirs = getattr(out, "past_key_values", None) or out.cache
    layers = [(layer.keys, layer.values) for layer in theirs.layers]
    assert len(layers) == cfg.n_layers
    hf_bytes = sum(t.numel() * t.element_size() for pair in layers for t in pair)
    held = 6 + new - 1
    assert hf_bytes == cache.nbytes == kv_cache_bytes(cfg, held, batch=2, dtype="fp32")


def test_the_training_forward_is_unchanged_by_the_cache_path():
    # The cache-less call is the one training runs: same logits as a fresh cache's prefill.
    cfg = dataclasses.replace(SHAPES["gqa-sandwich-rope"], seq_len=16)
    model = _model(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    with torch.no_grad():
        assert torch.equal(model(idx), model(idx, KVCache(cfg, 2, 16)))
