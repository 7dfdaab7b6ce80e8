"""The proxy transformer: a decoder-only LM built from any valid `ArchConfig`.

One file, read top to bottom (nanoGPT's layout). Same code on CPU and CUDA: attention is
`F.scaled_dot_product_attention` (causal, GQA through `enable_gqa`), no hand-written kernels.
Parameter counts equal `space.costs.param_counts` exactly and the FLOPs that
`torch.utils.flop_counter` measures equal `space.costs.flop_counts`; tests pin both.

Shapes in comments: B batch, T sequence, C d_model, H n_heads, K n_kv_heads, D head_dim.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import (
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
    shape_wrapper,
)

from archsearch.errors import ArchsearchError
from archsearch.evaluators.kernels import MemoryOp
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


# --- kernels an eager step launches ---
def _tensor_bytes(x: object) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, list | tuple):
        return sum(_tensor_bytes(y) for y in x)
    return 0


# ATen ops that run a GEMM or attention kernel: the device models price those from their shapes
# (`kernels.step_kernels`); every other kernel is memory-bound and priced by the bytes it moves.
_COMPUTE_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm"})  # matmul and linear decompose to these
# The memory-bound kernels' groups, by ATen op (the rest: "elementwise"): the loss streams rows of
# the vocabulary's width (`kernels.MemoryOp.row`), the fused optimizer the fp32 parameters.
_BYTE_GROUPS = {
    "_log_softmax": "cross_entropy", "_log_softmax_backward_data": "cross_entropy",
    "nll_loss_forward": "cross_entropy", "nll_loss_backward": "cross_entropy",
    "_fused_adamw_": "optimizer",
}  # fmt: skip


class _KernelCounter(TorchDispatchMode):
    """Counts the ATen calls that run a kernel (views and detaches only re-label memory) and the
    bytes each memory-bound one reads and writes, by group (`_BYTE_GROUPS`)."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels = 0
        self.bytes: dict[str, int] = {}
        self.nodes = 0  # the autograd graph's, set by `_count_step`
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not (func.is_view or self.paused):
            self.kernels += 1
            name = func.overloadpacket.__name__
            if name not in _COMPUTE_OPS and "scaled_dot_product" not in name:
                self.count_bytes(func, name, args, kwargs or {}, out)
        return out

    def count_bytes(self, func: Any, name: str, args: tuple, kwargs: dict, out: object) -> None:
        """A memory-bound op's bytes: inputs read, outputs written; an argument the op writes in
        place is read and written (its output aliases it: counted once more, not twice)."""
        moved = sum(_tensor_bytes(a) for a in (*args, *kwargs.values()))
        written = [a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments]
        moved += sum(_tensor_bytes(a) for a, w in zip(args, written, strict=False) if w)
        if not any(written):
            moved += _tensor_bytes(out)
        self.add_bytes(_BYTE_GROUPS.get(name, "elementwise"), moved)

    def add_bytes(self, group: str, moved: int) -> None:
        self.bytes[group] = self.bytes.get(group, 0) + moved

    @contextlib.contextmanager
    def pause(self):
        """Run ops uncounted (a fused kernel's CPU stand-in)."""
        self.paused = True
        try:
            yield
        finally:
            self.paused = False


class _FusedRMSNorm(torch.autograd.Function):
    """An RMSNorm counted as a GPU step runs it: on CUDA, PyTorch's `rms_norm` runs one fused kernel
    each way (`_fused_rms_norm` and its backward) when the input and the weight share a dtype, while
    on the CPU it is a dozen elementwise ops each way. Computes the same values, uncounted."""

    @staticmethod
    def forward(ctx, x, weight, eps, counter):  # type: ignore[override]
        with counter.pause():
            y = F.rms_norm(x, (x.shape[-1],), weight, eps)
        counter.kernels += 1
        counter.add_bytes("elementwise", _tensor_bytes((x, weight, y)))
        ctx.save_for_backward(x, weight)
        ctx.eps, ctx.counter = eps, counter
        return y

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        with ctx.counter.pause(), torch.enable_grad():
            x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()
            dx, dw = torch.autograd.grad(F.rms_norm(x, (x.shape[-1],), weight, ctx.eps), (x, weight), grad)
        ctx.counter.kernels += 1
        ctx.counter.add_bytes("elementwise", _tensor_bytes((grad, x, weight, dx, dw)))
        return dx, dw, None, None


def _count_norms_as_fused(model: nn.Module, counter: _KernelCounter) -> None:
    """Make `model`'s RMSNorms count as CUDA runs them: one fused kernel each way
    (`_FusedRMSNorm`), on the weight cast to the input's dtype where they differ (`RMSNorm`: the
    cast and its gradient's are counted as the dispatcher sees them)."""
    for norm in model.modules():
        if isinstance(norm, RMSNorm):
            plain = norm.forward

            def forward(x: torch.Tensor, norm: RMSNorm = norm, plain: Callable = plain) -> torch.Tensor:
                if norm.weight is None:
                    return plain(x)
                weight = norm.weight if norm.weight.dtype == x.dtype else norm.weight.to(x.dtype)
                return _FusedRMSNorm.apply(x, weight, norm.eps, counter)

            norm.forward = forward


def _count_step(structure: ArchConfig, batch: int = 1, dtype: str = "bf16") -> _KernelCounter:
    """Count one steady-state training step of `structure` on `batch` sequences: autocast forward
    in `dtype` (fp32 and tf32: none), fp32 cross-entropy, backward, fused AdamW, gradients set to
    None (benchmarks/gpu_model_accuracy.py's real step). The optimizer steps once first, on zero
    gradients, so that its state already exists (the same count as after a whole step, checked by
    tests/evaluators/test_step_fit.py, in half the time). On one thread: the tensors are tiny, and
    a second thread waiting on a busy core made it 3x slower (5.3 s against 1.8 s a structure)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _count_step_here(structure, batch, dtype)
    finally:
        torch.set_num_threads(threads)


def _count_step_here(structure: ArchConfig, batch: int, dtype: str) -> _KernelCounter:
    torch.manual_seed(0)
    model = ProxyLM(structure)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    idx = torch.randint(0, structure.vocab_size, (batch, structure.seq_len + 1))
    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype)
    counter = _KernelCounter()
    _count_norms_as_fused(model, counter)
    with counter:
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten())
        counter.nodes = _graph_nodes(loss)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return counter


def _graph_nodes(loss: torch.Tensor) -> int:
    """The nodes of `loss`'s autograd graph: one per differentiable op of the forward (a fused
    norm's `_FusedRMSNorm` is one) and one per parameter whose gradient it accumulates."""
    seen: set[object] = set()
    todo = [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo.extend(parent for parent, _ in node.next_functions)
    return len(seen)


@functools.lru_cache(maxsize=256)
def _counts_per_step(structure: ArchConfig) -> tuple[int, int]:
    """(kernels, autograd nodes) of one steady-state bf16 training step of `structure`
    (`_count_step`)."""
    counter = _count_step(structure)
    return counter.kernels, counter.nodes


def _kernels_per_step(structure: ArchConfig) -> int:
    """Kernels one steady-state bf16 training step of `structure` runs (`_count_step`)."""
    return _counts_per_step(structure)[0]


def _head_layout(cfg: ArchConfig) -> tuple[int, int]:
    """The fewest (n_heads, n_kv_heads) of `cfg`'s kind of head layout: one head, MQA, GQA or MHA.

    A step launches the same kernels for every head count of a kind (SDPA takes the heads as a
    batch dimension; with `enable_gqa` a single KV head is broadcast, more are grouped), so one
    count serves all of them: `export --scale-to` scores hundreds of candidates whose head counts
    differ, and counted each anew it took minutes at 70B. Checked against the real head counts
    by tests/evaluators/test_step_fit.py.
    """
    if cfg.n_heads == 1:
        return 1, 1
    if cfg.n_kv_heads == 1:
        return 2, 1
    if cfg.n_kv_heads == cfg.n_heads:
        return 2, 2
    return 4, 2


def eager_kernel_count(cfg: ArchConfig) -> int:
    """How many kernels one eager training step of `cfg` launches, whatever its widths.

    The count depends on the structure (activation, norms and their placement, positions, bias,
    tying, qk-norm, parallel block, the kind of head layout) and the depth, not on widths or head
    counts: it is counted with PyTorch's dispatcher on a one- and a two-layer copy of `cfg` at tiny
    widths and the layout's smallest head counts (`_head_layout`), on the CPU (an instant, cached
    per structure), and extended linearly in depth, as every block is the same. The device
    models charge each launch the GPU's gap between kernels (`hardware.DeviceModel.eager_kernel_s`)
    and, with the autograd graph's nodes, the host's time (`eager_host_ops`).
    """
    return _in_depth(cfg, 0)


def eager_host_ops(cfg: ArchConfig) -> int:
    """The host's work in one eager training step of `cfg`, counted in ops: the kernels it launches
    (`eager_kernel_count`) and the nodes of its autograd graph, each recorded in the forward and
    run by the backward engine (one per differentiable op, one per parameter's gradient
    accumulated). Counted as `eager_kernel_count` counts, extended linearly in depth.

    The host's time a step is charged per unit (`hardware.DeviceModel.host_kernel_s`). Per launch
    alone, the H200's fit charged 36 us a launch while the 656 launches a fused RMSNorm removed had
    cost 4 us each, and left out of its own fit the H100's host-bound byte-level shape was 58% off;
    per launch and node, 20 us (H200) and 21 us (H100) each, and that shape is 1% off
    (benchmarks/data/gpu_campaign_nvidia-h200_steps.json, docs/accuracy.md). A call without
    autograd (prefill, decode) is charged its launches alone (`serving`).
    """
    return _in_depth(cfg, 0) + _in_depth(cfg, 1)


def _in_depth(cfg: ArchConfig, which: int) -> int:
    """`_counts_per_step(...)[which]` of `cfg`, counted at one and two layers of tiny widths and
    the layout's smallest head counts, extended linearly to `cfg`'s depth."""
    heads, kv_heads = _head_layout(cfg)
    tiny = dict(
        n_heads=heads, n_kv_heads=kv_heads, d_model=8 * heads, head_dim=8, d_ff=32, vocab_size=64, seq_len=16
    )
    one = _counts_per_step(dataclasses.replace(cfg, n_layers=1, **tiny))[which]
    two = _counts_per_step(dataclasses.replace(cfg, n_layers=2, **tiny))[which]
    return one + (cfg.n_layers - 1) * (two - one)


# --- bytes an eager step's memory-bound kernels move ---
log = logging.getLogger(__name__)


@functools.cache
def _module_hash() -> str:
    """What counted the cached bytes (`_byte_coefficients`): this module's source, which builds
    the step (read once, when a count is first looked up, not at import)."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def _width_terms(cfg: ArchConfig, batch: int) -> tuple[int, ...]:
    """The products of sizes that the tensors of an eager step's memory-bound kernels have: per
    token (M = batch * seq_len) the residual stream, the query, key/value and MLP widths, the
    logits, per-row and per-head statistics; per step the weights, biases, per-head norms,
    position tables and indices."""
    M, d, q, kv, f, V, S = (batch * cfg.seq_len, cfg.d_model, cfg.q_dim, cfg.kv_dim, cfg.d_ff, cfg.vocab_size,
                            cfg.seq_len)  # fmt: skip
    h, g, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    return (M * d, M * q, M * kv, M * f, M * V, M, M * h, M * g,
            d * q, d * kv, d * f, V * d, S * d, S * hd, d, q, kv, f, V, hd, S, 1)  # fmt: skip


def _tiny_variants(cfg: ArchConfig) -> list[tuple[ArchConfig, int]]:
    """(config, batch) pairs of `cfg`'s structure at tiny sizes, each size drawn independently
    (seeded), its kind of head layout kept (`_head_layout`): more pairs than `_width_terms`, so
    that the terms' coefficients are determined, and one more to check them on."""
    heads, kv_heads = _head_layout(cfg)
    layouts = {
        (1, 1): [(1, 1)], (2, 1): [(2, 1), (3, 1), (4, 1)], (2, 2): [(2, 2), (3, 3), (4, 4)],
        (4, 2): [(4, 2), (6, 2), (6, 3), (8, 4)],
    }[heads, kv_heads]  # fmt: skip
    rng = random.Random(0)
    out = []
    for _ in range(len(_width_terms(cfg, 1)) + 7):  # 29: the 22 terms, with room to spare
        h, g = rng.choice(layouts)
        sizes = dict(
            n_heads=h, n_kv_heads=g, d_model=rng.randrange(8, 41, 4), head_dim=rng.choice((4, 6, 8)),
            d_ff=rng.randrange(8, 41, 4), vocab_size=rng.randrange(16, 65, 8),
            seq_len=rng.randrange(4, 13, 2),
        )  # fmt: skip
        out.append((dataclasses.replace(cfg, n_layers=1, **sizes), rng.choice((2, 3, 4))))
    return out


@functools.lru_cache(maxsize=64)
def _byte_coefficients(structure: ArchConfig, dtype: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per group, the coefficients of `_width_terms` that give the bytes of a one-layer step and
    of each layer more (`_fit_byte_coefficients`), kept in the cache folder
    (`data.cache_dir()/eager-bytes`) across processes: a search's Ray workers and each CLI call
    would otherwise count the same structure again (2-4 s on a CPU core). A file is keyed by the
    structure, the dtype, torch's version and this module's source, so a change to either counts
    anew; a folder that cannot be written only loses the saving."""
    from archsearch.evaluators.data import cache_dir
    from archsearch.fileio import write_atomic

    key = json.dumps([structure.to_dict(), dtype, torch.__version__, _module_hash()], sort_keys=True)
    path = cache_dir() / "eager-bytes" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
    try:
        stored = json.loads(path.read_text())
        return {g: (torch.tensor(one, dtype=torch.float64), torch.tensor(more, dtype=torch.float64))
                for g, (one, more) in stored.items()}  # fmt: skip
    except (OSError, ValueError, TypeError, AttributeError):
        pass  # not counted yet here (or a file that is not ours): count it
    out = _fit_byte_coefficients(structure, dtype)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(
            path, json.dumps({g: [one.tolist(), more.tolist()] for g, (one, more) in out.items()}).encode()
        )
    except (OSError, ArchsearchError) as exc:
        log.debug("eager bytes of %s not cached: %s", structure.describe(), exc)
    return out


def _fit_byte_coefficients(structure: ArchConfig, dtype: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per group, the coefficients of `_width_terms` that give the bytes of a one-layer step and
    of each layer more, found by least squares on `_tiny_variants` (one and two layers each). A
    step's tensors are products of its sizes, so the fit is exact: checked, not assumed."""
    terms, counts = [], []
    for variant, batch in _tiny_variants(structure):
        terms.append(_width_terms(variant, batch))
        counts.append(
            [_count_step(dataclasses.replace(variant, n_layers=n), batch, dtype).bytes for n in (1, 2)]
        )
    X = torch.tensor(terms, dtype=torch.float64)
    out = {}
    for group in sorted({g for pair in counts for c in pair for g in c}):
        y = torch.tensor([[c.get(group, 0) for c in pair] for pair in counts], dtype=torch.float64)
        y = torch.stack([y[:, 0], y[:, 1] - y[:, 0]], dim=1)  # one layer, each layer more
        coef = torch.linalg.lstsq(X[:-1], y[:-1], driver="gelsd").solution  # the last one checks it
        worst = (X @ coef - y).abs().max().item()
        if worst > 0.5:  # a tensor whose size is not a product the terms name: a missing term
            raise RuntimeError(f"{group} bytes of {structure.describe()} are not a sum of width terms "
                               f"(off by {worst:.0f} bytes): extend model._width_terms")  # fmt: skip
        out[group] = (coef[:, 0], coef[:, 1])
    return out


def eager_memory_ops(cfg: ArchConfig, batch: int, dtype: str = "bf16") -> tuple[MemoryOp, ...]:
    """The memory-bound kernels of one eager training step of `cfg` on `batch` sequences (every
    kernel but the GEMMs and attention), with the bytes they read and write, in groups: the loss
    (rows of the vocabulary's width), the fused optimizer, and the rest ("elementwise": norms,
    activations, residual adds, rotary embeddings, autocast's casts, copies).

    Counted with PyTorch's dispatcher, as `eager_kernel_count` counts launches: each kernel's
    tensors read and written, on tiny copies of `cfg`'s structure on the CPU, where the bytes
    are sums of products of the sizes (`_width_terms`); fitted once per structure (a second or
    two, cached) and evaluated at `cfg`'s sizes in an instant. For d1024 at batch 32 it counts
    158 GB, where `kernels.step_kernels` estimates 46; on the H200 (2026-11-27) that step's
    elementwise and copy kernels took about 52 ms of its 96 (a trace: benchmarks/gpu_campaign.py
    part 4).
    """
    heads, kv_heads = _head_layout(cfg)
    structure = dataclasses.replace(
        cfg, n_layers=1, n_heads=heads, n_kv_heads=kv_heads, d_model=8 * heads, head_dim=8, d_ff=32,
        vocab_size=64, seq_len=16,
    )  # fmt: skip
    x = torch.tensor(_width_terms(cfg, batch), dtype=torch.float64)
    rows = {"cross_entropy": cfg.vocab_size}
    ops = []
    for group, (one, per_layer) in _byte_coefficients(structure, dtype).items():
        moved = round(float(x @ one + (cfg.n_layers - 1) * (x @ per_layer)))
        ops.append(MemoryOp(group, moved, row=rows.get(group, 0)))
    return tuple(ops)
