"""The proxy transformer: a decoder-only LM built from any valid `ArchConfig`.

One file, read top to bottom (nanoGPT's layout). Same code on CPU and CUDA: attention is
`F.scaled_dot_product_attention` (causal, GQA through `enable_gqa`), no hand-written kernels.
Parameter counts equal `space.costs.param_counts` exactly and the FLOPs that
`torch.utils.flop_counter` measures equal `space.costs.flop_counts` (with the attention formulas
of `flop_formulas`); tests pin both. What an eager step of it launches and moves is counted in
`counting`.

Shapes in comments: B batch, T sequence, C d_model, H n_heads, K n_kv_heads, D head_dim.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.evaluators import flop_formulas  # noqa: F401  (FlopCounterMode counts this model whole)
from archsearch.registry import Registry
from archsearch.space.config import POSITIONS, ArchConfig

ROPE_THETA = 10_000.0  # RoPE base of Su et al. 2021 and LLaMA 1/2
NORM_EPS = 1e-5  # LayerNorm's default; also used for RMSNorm
INIT_STD = 0.02  # GPT-2's init; output projections are scaled by 1/sqrt(2 n_layers) on top

# Pointwise functions behind `ACTIVATIONS[name].base`. GELU is the tanh form of GPT-2 and Gemma.
POINTWISE: Registry[Callable[[torch.Tensor], torch.Tensor]] = Registry("pointwise function")
POINTWISE.register("relu", F.relu)
POINTWISE.register("gelu", functools.partial(F.gelu, approximate="tanh"))
POINTWISE.register("silu", F.silu)


class RMSNorm(nn.RMSNorm):
    """torch's RMSNorm with its weight cast to the input's dtype. CUDA runs `rms_norm` as one
    fused kernel each way only when the two match; autocast's bf16 tensors (a qk-norm's
    projections, a sandwich norm's sublayer output) against the fp32 weight ran as a dozen
    elementwise kernels each way, and PyTorch warned "Cannot dispatch to fused implementation":
    a byte-level d1024 sandwich shape with qk-norm launched 1,505 kernels a step, a pre-norm one
    721 (H200, 2026-11-27). The weight's gradient flows back through the cast in fp32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if weight is not None and weight.dtype != x.dtype:
            weight = weight.to(x.dtype)
        return F.rms_norm(x, self.normalized_shape, weight, self.eps)


def make_norm(cfg: ArchConfig, width: int) -> nn.Module:
    """A norm of `cfg.norm` kind over the last `width` features."""
    if cfg.norm == "layernorm":
        return nn.LayerNorm(width, eps=NORM_EPS, bias=cfg.bias)
    return RMSNorm(width, eps=NORM_EPS)


def rope_tables(seq_len: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of RoPE's rotation angles, each (T, D/2), in float32."""
    inv_freq = ROPE_THETA ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, D) by position, pairing dim i with i + D/2 (the Hugging Face Llama layout)."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[: x.size(-2)].to(x.dtype), sin[: x.size(-2)].to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class KVCache:
    """Keys and values of every layer for incremental decoding, preallocated for `capacity` tokens.

    Each layer holds a key and a value tensor of (B, K, capacity, D): exactly
    `space.costs.kv_cache_bytes(cfg, capacity, batch, dtype)` bytes (`nbytes`, tested). A forward
    pass with the cache writes its tokens' keys and values at `length` and attends over the first
    `length + T`; `length` then advances by T.
    """

    def __init__(
        self,
        cfg: ArchConfig,
        batch: int,
        capacity: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if batch <= 0 or capacity <= 0:
            raise ValueError(f"batch and capacity must be positive, got {batch}, {capacity}")
        shape = (batch, cfg.n_kv_heads, capacity, cfg.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.batch, self.capacity, self.length = batch, capacity, 0

    @property
    def nbytes(self) -> int:
        """Bytes the cache's tensors hold."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (B, K, T, D) keys and values at the current length; the layer's keys and values
        up to the new tokens. Called once per layer per forward pass: `advance` moves the length."""
        start, T = self.length, k.size(-2)
        if start + T > self.capacity:
            raise ValueError(f"{start + T} tokens do not fit a cache of {self.capacity}")
        self.keys[layer][:, :, start : start + T] = k
        self.values[layer][:, :, start : start + T] = v
        return self.keys[layer][:, :, : start + T], self.values[layer][:, :, : start + T]

    def advance(self, tokens: int) -> None:
        self.length += tokens


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool) -> torch.Tensor:
    """Causal SDPA of T queries that are the last T of k's S positions: (B, H, T, D)."""
    T, S = q.size(-2), k.size(-2)
    if T == S:  # the whole sequence: SDPA's own causal mask, as training runs it
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    if T == 1:  # one new token sees every cached one
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    # A chunk after a cached prefix: query i (position S - T + i) sees keys 0..S - T + i. SDPA's
    # is_causal aligns the mask top-left, which would hide the prefix, so the mask is explicit.
    mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


class Attention(nn.Module):
    """Causal self-attention with H query heads sharing K key/value heads (MHA, GQA, MQA)."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.cfg = cfg
        # One fused projection for Q, K and V: one GEMM instead of three, same parameters.
        self.qkv = nn.Linear(cfg.d_model, cfg.q_dim + 2 * cfg.kv_dim, bias=cfg.bias)
        self.out = nn.Linear(cfg.q_dim, cfg.d_model, bias=cfg.bias)
        self.q_norm = make_norm(cfg, cfg.head_dim) if cfg.qk_norm else None
        self.k_norm = make_norm(cfg, cfg.head_dim) if cfg.qk_norm else None
        # The attention call; a counter swaps in a stand-in (`serve_profiler.count_serve_calls`).
        self.attend: Callable[..., torch.Tensor] = _attend

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        cache: tuple[KVCache, int] | None = None,
    ) -> torch.Tensor:
        """`cache`: (the KV cache, this layer's index) to decode incrementally; `rope` then holds
        the angles of the new tokens' positions."""
        cfg = self.cfg
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim], dim=-1)
        q = q.view(B, T, cfg.n_heads, cfg.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)  # (B, K, T, D)
        v = v.view(B, T, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)  # (B, K, T, D)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            k, v = cache[0].update(cache[1], k, v)  # (B, K, S, D): the cached positions and these
        y = self.attend(q, k, v, gqa=cfg.n_kv_heads != cfg.n_heads)  # (B, H, T, D)
        return self.out(y.transpose(1, 2).reshape(B, T, cfg.q_dim))


class MLP(nn.Module):
    """`down(act(up x))`, or gated `down(act(gate x) * up x)` with gate and up fused in one GEMM."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        spec = cfg.activation_spec
        self.gated = spec.gated
        self.act = POINTWISE[spec.base]
        self.up = nn.Linear(cfg.d_model, (2 if spec.gated else 1) * cfg.d_ff, bias=cfg.bias)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)  # (B, T, d_ff), or (B, T, 2 d_ff) gated
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            return self.down(self.act(gate) * up)
        return self.down(self.act(h))


class Block(nn.Module):
    """One transformer block; `cfg.placement` says where its norms sit.

    Serial:   x = x + A(x), then x = x + M(x), where for each sublayer S
              pre: x + S(n(x))   post: n(x + S(x))   sandwich: x + n_out(S(n_in(x))).
    Parallel: attention and MLP read the same (normed) input and add to the residual together.
    """

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.placement = cfg.placement
        self.parallel = cfg.parallel_block
        self.attn = Attention(cfg)
        self.mlp = MLP(cfg)
        p, n_in = self.placement, 1 if cfg.parallel_block else 2

        def norms(present: bool, count: int) -> nn.ModuleList:
            return nn.ModuleList(make_norm(cfg, cfg.d_model) for _ in range(count if present else 0))

        self.norm_in = norms(p.before, n_in)  # shared by both branches when parallel
        self.norm_out = norms(p.after, 2)  # one per branch
        self.norm_residual = norms(p.residual, n_in)  # after the (joint) residual add

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        cache: tuple[KVCache, int] | None = None,
    ) -> torch.Tensor:
        branches = (lambda h: self.attn(h, rope, cache), self.mlp)
        if self.parallel:
            h = self.norm_in[0](x) if self.norm_in else x
            outs = [f(h) for f in branches]
            if self.norm_out:
                outs = [norm(o) for norm, o in zip(self.norm_out, outs, strict=True)]
            x = x + outs[0] + outs[1]
            return self.norm_residual[0](x) if self.norm_residual else x
        for i, f in enumerate(branches):
            h = f(self.norm_in[i](x) if self.norm_in else x)
            x = x + (self.norm_out[i](h) if self.norm_out else h)
            if self.norm_residual:
                x = self.norm_residual[i](x)
        return x


class ProxyLM(nn.Module):
    """Decoder-only LM: embeddings, `n_layers` blocks, an optional final norm, the LM head."""

    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        position = POSITIONS[cfg.pos_embedding]
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model) if position.learned_table else None
        if position.rotary:
            cos, sin = rope_tables(cfg.seq_len, cfg.head_dim)
            # Buffers, not parameters; not saved in state dicts since they are recomputed.
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.rotary = position.rotary
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm_final = make_norm(cfg, cfg.d_model) if cfg.placement.final else None
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, 0.02) weights, zero biases, unit norm scales; residual-branch
        output projections scaled down by sqrt(2 n_layers) so the stream's variance stays flat."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                module.reset_parameters()
        residual_std = INIT_STD / math.sqrt(2 * self.cfg.n_layers)
        for block in self.blocks:
            nn.init.normal_(block.attn.out.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.down.weight, mean=0.0, std=residual_std)

    def forward(
        self, idx: torch.Tensor, cache: KVCache | None = None, last_only: bool = False
    ) -> torch.Tensor:
        """Logits (B, T, vocab_size) for token ids `idx` (B, T), T <= seq_len.

        With `cache`, `idx` continues the sequences the cache holds: its tokens sit at positions
        `cache.length ..`, attend to the cached ones too, and are added to the cache. Prefill is
        the prompt through an empty cache; each decode step one token per sequence.
        `last_only`: the logits of the last position only, (B, 1, vocab_size), as generation
        needs them (serving engines run the LM head on nothing else).
        """
        T = idx.size(1)
        start = 0 if cache is None else cache.length
        if start + T > self.cfg.seq_len:
            raise ValueError(f"sequence of {start + T} tokens is longer than seq_len={self.cfg.seq_len}")
        x = self.tok_emb(idx)  # (B, T, C)
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(start, start + T, device=idx.device))
        rope = None
        if self.rotary:
            rope = (self.rope_cos[start : start + T], self.rope_sin[start : start + T])
        for i, block in enumerate(self.blocks):
            x = block(x, rope, None if cache is None else (cache, i))
        if cache is not None:
            cache.advance(T)
        if last_only:
            x = x[:, -1:]
        if self.norm_final is not None:
            x = self.norm_final(x)
        return self.head(x)  # (B, T, vocab_size)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy in nats per token, computed in float32."""
        logits = self(idx)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


@torch.no_grad()
def greedy_generate(model: ProxyLM, prompt: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, KVCache]:
    """Greedy decoding with a KV cache: the prompt (B, T) prefilled at once, then `new_tokens`
    steps of one token per sequence. Returns the prompt with the generated tokens appended
    (B, T + new_tokens) and the cache, which then holds T + new_tokens - 1 tokens (the last token
    generated is never fed back)."""
    if new_tokens <= 0:
        raise ValueError(f"new_tokens must be positive, got {new_tokens}")
    weight = model.head.weight
    cache = KVCache(model.cfg, prompt.size(0), prompt.size(1) + new_tokens - 1, weight.dtype, weight.device)
    logits = model(prompt, cache, last_only=True)
    out = [prompt]
    for step in range(new_tokens):
        token = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        out.append(token)
        if step + 1 < new_tokens:
            logits = model(token, cache, last_only=True)
    return torch.cat(out, dim=1), cache


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied matrix once), as `space.costs.param_counts(cfg).total`."""
    return sum(p.numel() for p in model.parameters())
