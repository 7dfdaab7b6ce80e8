"""The cost model: exact parameter, FLOP and memory counts of an `ArchConfig`. Pure functions.

Conventions (docs/explanations/shape-costs.md), pinned by tests against the PyTorch proxy:
1. Parameters are exactly `sum(p.numel())` of `evaluators.model.ProxyLM`. "Embedding" is the
   token table plus a learned position table; "non-embedding" is attention + MLP + norms and
   excludes an untied LM head too (Kaplan et al. 2020's N).
2. A multiply-add is 2 FLOPs. Only matrix products count: projections, the attention score
   (`Q K^T`) and value (`P V`) products and the LM head, as `torch.utils.flop_counter` counts
   them. Norms, activations, softmax, RoPE and bias adds are left out (they are memory-bound).
3. Attention is counted over the full `seq_len x seq_len` square, as SDPA kernels and
   FlopCounterMode count it; the causal count keeps only the lower triangle, so a query sees on
   average `(seq_len + 1) / 2` keys.
4. Training is 3x forward (the backward pass has two matrix products per forward one).
"""

from __future__ import annotations

from dataclasses import dataclass

from archsearch.registry import Registry
from archsearch.space.config import NORMS, POSITIONS, ArchConfig
from archsearch.space.width import relu_feature_loss

DTYPE_BYTES: Registry[int] = Registry("dtype")
DTYPE_BYTES.register("fp32", 4)
DTYPE_BYTES.register("bf16", 2)
DTYPE_BYTES.register("fp16", 2)
DTYPE_BYTES.register("fp8", 1)


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by component, summed over all layers."""

    embedding: int  # token table, plus the position table for learned positions
    attention: int  # Q, K, V and output projections with their biases
    mlp: int  # up (and gate) and down projections with their biases
    norms: int  # block norms, QK-norms and the final norm
    head: int  # an untied LM head; 0 when tied to the token table

    @property
    def total(self) -> int:
        return self.embedding + self.attention + self.mlp + self.norms + self.head

    @property
    def non_embedding(self) -> int:
        return self.attention + self.mlp + self.norms


@dataclass(frozen=True)
class FlopCounts:
    """Forward FLOPs per token at context `seq_len`, by component, summed over all layers."""

    attention_proj: int  # Q, K, V and output projections
    attention_full: int  # score and value products over the full seq_len square
    attention_causal: int  # the same over the causal lower triangle only
    mlp: int
    head: int  # LM head logits

    @property
    def forward(self) -> int:
        """Full-square count: what FlopCounterMode measures per token."""
        return self.attention_proj + self.attention_full + self.mlp + self.head

    @property
    def forward_causal(self) -> int:
        """Counting only the attention a causal mask lets each query compute."""
        return self.attention_proj + self.attention_causal + self.mlp + self.head

    @property
    def train(self) -> int:
        """Forward plus backward, 3x the full-square forward."""
        return 3 * self.forward

    @property
    def train_causal(self) -> int:
        """Forward plus backward, 3x the causal forward: the FLOPs MFU counts. Causal attention
        kernels skip the masked half of the square, so over the full count a step at long
        context (a 1B shape at 131k tokens) would read past 100% of the peak."""
        return 3 * self.forward_causal


def _norm_params(cfg: ArchConfig, width: int) -> int:
    """One norm's parameters: a scale, plus a shift for LayerNorm with biases."""
    return width * (2 if cfg.bias and NORMS[cfg.norm].has_bias else 1)


def _mlp_matrices(cfg: ArchConfig) -> int:
    """Weight matrices of width d_ff in one MLP: up and down, plus gate when gated."""
    return 3 if cfg.gated else 2


def param_counts(cfg: ArchConfig) -> ParamCounts:
    """Exact parameter counts of the proxy model built from `cfg`."""
    d, L = cfg.d_model, cfg.n_layers
    embedding = cfg.vocab_size * d
    if POSITIONS[cfg.pos_embedding].learned_table:
        embedding += cfg.seq_len * d
    # Q and O are d x q_dim; K and V are d x kv_dim. Biases: one per output feature.
    attention = 2 * d * cfg.q_dim + 2 * d * cfg.kv_dim
    if cfg.bias:
        attention += cfg.q_dim + 2 * cfg.kv_dim + d
    n_mat = _mlp_matrices(cfg)
    mlp = n_mat * d * cfg.d_ff
    if cfg.bias:
        mlp += (n_mat - 1) * cfg.d_ff + d
    placement = cfg.placement
    norms = placement.norms_per_layer(cfg.parallel_block) * _norm_params(cfg, d)
    if cfg.qk_norm:
        norms += 2 * _norm_params(cfg, cfg.head_dim)  # shared across heads, one for Q, one for K
    final = _norm_params(cfg, d) if placement.final else 0
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * d
    return ParamCounts(
        embedding=embedding,
        attention=L * attention,
        mlp=L * mlp,
        norms=L * norms + final,
        head=head,
    )


def flop_counts(cfg: ArchConfig) -> FlopCounts:
    """Forward FLOPs per token (see the module docstring for what is counted)."""
    d, L, T = cfg.d_model, cfg.n_layers, cfg.seq_len
    # 1. Each weight of a projection is one multiply-add per token: 2 FLOPs.
    attention_proj = 2 * (2 * d * cfg.q_dim + 2 * d * cfg.kv_dim)
    # 2. Each query head dots with T keys (2*T*head_dim) and mixes T values (2*T*head_dim).
    #    GQA shares K and V between heads but every query head still does both products.
    attention_full = 2 * 2 * T * cfg.q_dim
    # 3. Causal: query t sees t+1 keys, (T+1)/2 on average: 4*q_dim*(T+1)/2, exact in integers.
    attention_causal = 2 * (T + 1) * cfg.q_dim
    mlp = 2 * _mlp_matrices(cfg) * d * cfg.d_ff
    head = 2 * d * cfg.vocab_size  # a matrix product whether or not the weights are tied
    return FlopCounts(
        attention_proj=L * attention_proj,
        attention_full=L * attention_full,
        attention_causal=L * attention_causal,
        mlp=L * mlp,
        head=head,
    )


def kv_cache_bytes_per_token(cfg: ArchConfig, dtype: str = "bf16") -> int:
    """Inference KV-cache bytes one token adds: a key and a value per KV head, per layer."""
    return 2 * cfg.n_layers * cfg.kv_dim * DTYPE_BYTES[dtype]


def weight_bytes(cfg: ArchConfig, dtype: str = "bf16") -> int:
    """Bytes to hold all parameters in `dtype` (tied matrices once)."""
    return param_counts(cfg).total * DTYPE_BYTES[dtype]


# --- serving (docs/explanations/serving-costs.md) ---
def kv_cache_bytes(cfg: ArchConfig, tokens: int, batch: int = 1, dtype: str = "bf16") -> int:
    """KV-cache bytes of `batch` sequences holding `tokens` tokens each: every layer keeps a key
    and a value of `n_kv_heads * head_dim` per token. Llama-2-7B in bf16: 512 KiB per token, 2 GiB
    for one 4096-token sequence.

    Raises:
        ValueError: `tokens` is negative or `batch` is not positive.
        UnknownNameError: unknown dtype.
    """
    if tokens < 0 or batch <= 0:
        raise ValueError(f"tokens must be >= 0 and batch > 0, got tokens={tokens}, batch={batch}")
    return batch * tokens * kv_cache_bytes_per_token(cfg, dtype)


def serve_memory_bytes(
    cfg: ArchConfig,
    batch: int,
    context: int,
    weight_dtype: str = "bf16",
    cache_dtype: str = "bf16",
    working_bytes: int = 0,
) -> int:
    """Memory a server of `batch` sequences at `context` tokens holds: the weights once, every
    sequence's cache, and the working memory stated (activations, allocator slack, runtime)."""
    return weight_bytes(cfg, weight_dtype) + kv_cache_bytes(cfg, context, batch, cache_dtype) + working_bytes


def max_serve_batch(
    cfg: ArchConfig,
    context: int,
    memory_bytes: int,
    weight_dtype: str = "bf16",
    cache_dtype: str = "bf16",
    working_bytes: int = 0,
) -> int:
    """The largest batch of `context`-token sequences that fits `memory_bytes`:
    `(memory - weights - working) // (context * cache bytes per token)`; 0 when not even one does.

    Raises:
        ValueError: `context` is not positive.
    """
    if context <= 0:
        raise ValueError(f"context must be positive, got {context}")
    free = memory_bytes - weight_bytes(cfg, weight_dtype) - working_bytes
    return max(0, free // kv_cache_bytes(cfg, context, 1, cache_dtype))


# --- a training step's memory on an accelerator ---
# Mixed-precision Adam holds 16 bytes a parameter: bf16 weights and gradients, fp32 master
# weights and two fp32 moments (Rajbhandari et al. 2020, ZeRO, section 3.1: "16 Psi").
TRAIN_STATE_BYTES_PER_PARAM = 16


def train_activation_bytes_per_token(cfg: ArchConfig, dtype: str = "bf16") -> int:
    """Activations a training step keeps for its backward, per token, in `dtype`, without
    recomputation and with a fused (flash) attention kernel, which keeps no score matrix. Per layer:
    the two norms' inputs (2 d_model), the attention's input, queries, keys, values and output
    (d_model + 2 q_dim + 2 kv_dim), the MLP's input, its up (and gate) outputs and the activation
    it feeds the down projection (d_model + 2 or 3 d_ff); then the LM head's logits, in `dtype` and
    once more in fp32 for the loss. For GPT-3's layer (d_ff = 4 d_model, MHA) that is 32 bytes per
    d_model in bf16, Korthikanti et al. 2022's 34 less the two dropout masks."""
    per_layer = 4 * cfg.d_model + 2 * cfg.q_dim + 2 * cfg.kv_dim + _mlp_matrices(cfg) * cfg.d_ff
    logits = cfg.vocab_size * (DTYPE_BYTES[dtype] + 4)
    return cfg.n_layers * per_layer * DTYPE_BYTES[dtype] + logits


def relu_feature_loss_log10(cfg: ArchConfig) -> float | None:
    """log10 of the ReLU feature-loss risk with n = d_model, m = d_ff; None for smooth activations."""
    if not cfg.activation_spec.hard_gated:
        return None
    return relu_feature_loss(cfg.d_model, cfg.d_ff).log10_risk


def cost_report(cfg: ArchConfig, dtype: str = "bf16") -> dict[str, object]:
    """Every cost of `cfg` as one flat JSON-ready dict (the `archsearch cost --json` object).

    Raises:
        UnknownNameError: `dtype` is not in DTYPE_BYTES.
    """
    dtype_bytes = DTYPE_BYTES[dtype]
    params = param_counts(cfg)
    flops = flop_counts(cfg)
    return {
        "params_total": params.total,
        "params_non_embedding": params.non_embedding,
        "params_embedding": params.embedding,
        "params_attention": params.attention,
        "params_mlp": params.mlp,
        "params_norms": params.norms,
        "params_head": params.head,
        "flops_forward_per_token": flops.forward,
        "flops_forward_per_token_causal": flops.forward_causal,
        "flops_train_per_token": flops.train,
        "flops_attention_per_token": flops.attention_full,
        "flops_mlp_per_token": flops.mlp,
        "flops_head_per_token": flops.head,
        "kv_cache_bytes_per_token": kv_cache_bytes_per_token(cfg, dtype),
        "weight_bytes": params.total * dtype_bytes,
        "dtype": dtype,
        "attention_layout": cfg.attention_layout,
        "aspect_ratio": cfg.aspect_ratio,
        "d_ff_ratio": cfg.d_ff_ratio,
        "relu_feature_loss_log10": relu_feature_loss_log10(cfg),
        "conventions": CONVENTIONS,
    }


CONVENTIONS = (
    "multiply-add = 2 FLOPs; matrix products only; attention over the full seq_len square "
    "(causal count: lower triangle); training = 3x forward; non-embedding excludes token and "
    "position tables and an untied LM head"
)
