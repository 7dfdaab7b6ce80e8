"""Modelled serving time: prefill and decode of a shape on a device model. Pure, no torch.

The serving half of the hardware model (`evaluators.hardware`), on the same `DeviceModel` and
kernels (docs/explanations/serving-costs.md):

1. Prefill runs the prompts through the model at once: the forward GEMMs of `batch * prompt`
   tokens (tile-and-wave roofline, `hardware.plan_gemm`), causal flash attention over the prompt
   (`hardware.predict_attention`), the memory-bound ops' bytes, the cache written once. The LM head
   runs on each sequence's last position only, as serving engines do.
2. A decode step produces one token per sequence: the same GEMMs with `m = batch`, which read every
   weight once for the whole batch (memory-bound until the batch makes them compute-bound, near
   peak FLOP/s over bandwidth), and attention of one query per head over each sequence's cache,
   which is read once per sequence and grows with context.
3. Each kernel is a roofline, `max(compute, memory)`, and each launch costs `kernel_s` on top: a
   serving engine replays a decode step as a CUDA graph of fused kernels (`SERVE_KERNELS`), so the
   gap per kernel is the graph's, not an eager step's host overhead.
4. The floor of a step is the bytes it must read (the weights it multiplies, the batch's cache)
   over the *peak* bandwidth, and for prefill also its FLOPs at peak: no kernel beats it.

The breakdown names the parts (weights read, cache read, compute, launches) at the achieved
bandwidth and FLOP/s; the time is the sum of the kernels' rooflines plus the launches, so it is at
least the larger of the bytes and the compute.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from archsearch.errors import ConfigError
from archsearch.evaluators.catalogue import ACCELERATORS, COMPUTE_DTYPES
from archsearch.evaluators.hardware import DeviceModel, device_model, plan_gemm, predict_attention
from archsearch.evaluators.step_kernels import AttentionCall
from archsearch.space.config import POSITIONS, ArchConfig
from archsearch.space.costs import DTYPE_BYTES, kv_cache_bytes
from archsearch.space.serve import ServeError, ServeScenario, check_count

# Seconds per kernel of a decode step replayed as a CUDA graph: the launch gap between kernels on
# the GPU. An assumption, not a datasheet figure (graph launches remove the host's per-kernel
# cost; what remains is about 1-3 us per kernel on recent GPUs): calibrate on a lent GPU.
GRAPH_KERNEL_S = 2e-6


@dataclass(frozen=True)
class ServeGemm:
    """One forward GEMM `(m x k) @ (k x n)` whose `(k x n)` operand is a weight matrix."""

    name: str
    m: int
    n: int
    k: int
    count: int


def serve_gemms(cfg: ArchConfig, tokens: int, head_tokens: int) -> tuple[ServeGemm, ...]:
    """The forward GEMMs of `tokens` tokens through every layer and of `head_tokens` through the
    LM head (the model's fused QKV and gate+up projections, as `evaluators.model` runs them)."""
    d, L = cfg.d_model, cfg.n_layers
    up = (2 if cfg.gated else 1) * cfg.d_ff
    return (
        ServeGemm("qkv", tokens, cfg.q_dim + 2 * cfg.kv_dim, d, L),
        ServeGemm("attn_out", tokens, d, cfg.q_dim, L),
        ServeGemm("mlp_up", tokens, up, d, L),
        ServeGemm("mlp_down", tokens, d, cfg.d_ff, L),
        ServeGemm("lm_head", head_tokens, cfg.vocab_size, d, 1),
    )


def serve_kernels(cfg: ArchConfig) -> int:
    """Kernels one forward call of a serving engine launches (prefill or a decode step alike).

    Per layer: each norm; the QKV GEMM; QK-norm and RoPE where the shape has them; the cache
    write; attention; the output GEMM; the up (gate+up) GEMM, the activation, the down GEMM; the
    residual adds (one for a parallel block). Biases ride in the GEMMs' epilogues. Once: the
    embedding lookup (and a learned position add), the final norm, the LM head and the sampler.
    """
    placement = cfg.placement
    per_layer = placement.norms_per_layer(cfg.parallel_block)
    per_layer += 1 + int(cfg.qk_norm) + int(POSITIONS[cfg.pos_embedding].rotary) + 1 + 1 + 1
    per_layer += 3 + (1 if cfg.parallel_block else 2)
    once = 1 + int(POSITIONS[cfg.pos_embedding].learned_table) + int(placement.final) + 1 + 1
    return cfg.n_layers * per_layer + once


@dataclass(frozen=True)
class ServeTime:
    """One prefill, or one decode step, of `batch` sequences: modelled seconds and their parts.

    Attributes:
        phase: "prefill" (the whole prompt of each sequence) or "decode" (one token each).
        tokens: tokens each sequence adds in this call: the prompt, or 1.
        context: tokens each sequence attends over at the end of the call.
        weight_bytes_read: the weights the call's GEMMs multiply, read once for the batch (the
            embedding table is only looked up, row by row).
        cache_bytes_read: keys and values the attention reads, every sequence's.
        cache_bytes_written: the new tokens' keys and values.
        flops: the call's matrix FLOPs (causal attention: what is computed).
        weights_read_s, cache_read_s: those bytes at the achieved bandwidth.
        compute_s: the GEMMs' and attention's FLOPs at the achieved FLOP/s (the rooflines in
            `time_s` add the tile and wave losses, and small batches' padding to whole tiles).
        gemm_s, attention_s: the parts of `time_s` that are the GEMMs' rooflines and attention's.
        launch_s: `kernels` launches at `kernel_s` each.
        host_s: an eager call's host time: its `kernels` at the device's fitted host time per
            launch (`DeviceModel.host_kernel_s`, fitted on training steps, whose host also runs
            an autograd graph); 0 for a serving engine's replayed graphs and where not eager.
        time_s: the kernels' rooflines, `max(compute, memory)` each, plus the launches; at
            least `host_s` (the GPU then waits on the host).
        floor_s: the bytes that must be read over the peak bandwidth, or the FLOPs at peak,
            whichever is larger: no implementation beats it.
    """

    phase: str
    device: str
    weight_dtype: str
    cache_dtype: str
    batch: int
    tokens: int
    context: int
    weight_bytes_read: int
    cache_bytes_read: int
    cache_bytes_written: int
    flops: int
    weights_read_s: float
    cache_read_s: float
    compute_s: float
    gemm_s: float
    attention_s: float
    other_memory_s: float  # activations, norms, the cache write: bytes at the achieved bandwidth
    kernels: int
    kernel_s: float
    launch_s: float
    time_s: float
    floor_s: float
    host_s: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        """Tokens the batch takes in (prefill) or produces (decode) per second."""
        return self.batch * self.tokens / self.time_s

    @property
    def bound(self) -> str:
        """What dominates: "compute", "memory", "launches" or (an eager call) "host"."""
        memory = self.weights_read_s + self.cache_read_s + self.other_memory_s
        parts = {"compute": self.compute_s, "memory": memory, "launches": self.launch_s}
        if self.host_s >= self.time_s:
            return "host"
        return max(parts, key=lambda k: parts[k])

    @property
    def floor_ratio(self) -> float:
        return self.time_s / self.floor_s

    def to_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "tokens_per_second": self.tokens_per_second,
            "bound": self.bound,
            "floor_ratio": self.floor_ratio,
        }


def _check(batch: int, tokens: int, context: int) -> None:
    for name, value in (("batch", batch), ("tokens", tokens), ("context", context)):
        check_count(name, value)


def _serve_time(
    model: DeviceModel,
    cfg: ArchConfig,
    phase: str,
    batch: int,
    tokens: int,
    context: int,
    weight_dtype: str,
    cache_dtype: str,
    kernel_s: float | None,
    kernels: int | None,
    memory_op_bandwidth: float | None = None,
    memory_op_bytes: int | None = None,
    cache_bandwidth: float | None = None,
    eager: bool = False,
) -> ServeTime:
    _check(batch, tokens, context)
    if context < tokens:
        raise ConfigError(f"context ({context}) must be at least the tokens added ({tokens})")
    if COMPUTE_DTYPES[weight_dtype].storage != weight_dtype:
        raise ConfigError(f"weights are stored in a storage dtype, got {weight_dtype!r}")
    bare = dataclasses.replace(model, launch_overhead_s=0.0)  # launches are counted apart
    device = model.device
    peak_bw = device.memory_bandwidth
    rate = device.peak_flops(weight_dtype) * model.compute_efficiency
    w_size = DTYPE_BYTES[weight_dtype]
    B, T, S = batch, tokens, context
    # 1. GEMMs: m = every new token; the LM head on each sequence's last position only.
    roofline = 0.0
    weight_bytes = flops = 0
    for g in serve_gemms(cfg, B * T, B):
        roofline += g.count * plan_gemm(bare, g.m, g.n, g.k, weight_dtype).time_s  # tiles, waves
        weight_bytes += g.count * g.n * g.k * w_size
        flops += g.count * 2 * g.m * g.n * g.k
    compute = flops / rate
    # The embedding table is looked up (B*T rows), not multiplied; a tied one is read by the head.
    # 2. Attention: T queries per head over S keys each, causal within the new tokens. Its FLOPs
    # count at the GEMMs' achieved rate at most, in both phases: the fitted efficiency is the
    # training flash kernel's (above 1 on the H100: relative to a GEMM's).
    per_token = kv_cache_bytes(cfg, 1, 1, cache_dtype)
    cache_read = B * (S - T) * per_token  # the cached prefix; the new keys come from the GEMM
    cache_written = B * T * per_token
    attn_rate = rate * min(1.0, model.attention_efficiency)
    if T == S:  # prefill from an empty cache: the training forward's flash kernel
        call = AttentionCall("sdpa.fwd", B, cfg.n_heads, cfg.n_kv_heads, T, cfg.head_dim, cfg.n_layers)
        attn_flops = call.causal_flops
        attention = predict_attention(bare, call, weight_dtype)
    else:  # decode: every query reads the whole cache (flash-decoding splits it over the SMs)
        if model.decode_attention_efficiency is not None:
            attn_rate = rate * min(1.0, model.decode_attention_efficiency)
        attn_flops = cfg.n_layers * 4 * B * cfg.n_heads * T * S * cfg.head_dim
        q_bytes = 2 * B * T * cfg.q_dim * w_size  # queries in, outputs out
        attn_bytes = cfg.n_layers * q_bytes + cache_read + cache_written
        attention = max(attn_flops / attn_rate, attn_bytes / (cache_bandwidth or model.bandwidth))
    compute += attn_flops / attn_rate
    flops += attn_flops
    # 3. Memory-bound ops: their bytes as counted when an eager call ran them, else a fused
    # engine's: each norm, activation, residual add, rope reads and writes its tensor once.
    other = memory_op_bytes
    if other is None:
        act = B * T * cfg.d_model * w_size
        placement = cfg.placement
        n_norms = cfg.n_layers * placement.norms_per_layer(cfg.parallel_block) + int(placement.final)
        other = 2 * act * (n_norms + cfg.n_layers * (2 if not cfg.parallel_block else 1))
        other += cfg.n_layers * B * T * cfg.d_ff * w_size * (3 if cfg.gated else 2)  # activation
        if POSITIONS[cfg.pos_embedding].rotary:
            other += cfg.n_layers * 2 * B * T * (cfg.q_dim + cfg.kv_dim) * w_size
        other += act + cache_written  # the embedding rows, the cache write
    other_s = other / (memory_op_bandwidth or model.bandwidth)
    n_kernels = serve_kernels(cfg) if kernels is None else kernels
    each = GRAPH_KERNEL_S if kernel_s is None else kernel_s
    launch = n_kernels * each
    host = n_kernels * model.host_kernel_s if eager else 0.0
    time_s = max(roofline + attention + other_s + launch, host)
    must_read = weight_bytes + cache_read
    floor = max(must_read / peak_bw, flops / device.peak_flops(weight_dtype))
    return ServeTime(
        phase=phase, device=device.name, weight_dtype=weight_dtype, cache_dtype=cache_dtype, batch=B,
        tokens=T, context=S, weight_bytes_read=weight_bytes, cache_bytes_read=cache_read,
        cache_bytes_written=cache_written, flops=flops, weights_read_s=weight_bytes / model.bandwidth,
        cache_read_s=cache_read / (cache_bandwidth or model.bandwidth), compute_s=compute, gemm_s=roofline,
        attention_s=attention, other_memory_s=other_s,
        kernels=n_kernels, kernel_s=each, launch_s=launch, time_s=time_s, floor_s=floor, host_s=host,
    )  # fmt: skip


def predict_prefill(
    model: DeviceModel,
    cfg: ArchConfig,
    batch: int,
    prompt: int,
    weight_dtype: str = "bf16",
    cache_dtype: str = "bf16",
    kernel_s: float | None = None,
    kernels: int | None = None,
    memory_op_bandwidth: float | None = None,
    memory_op_bytes: int | None = None,
    cache_bandwidth: float | None = None,
    eager: bool = False,
) -> ServeTime:
    """The prefill of `batch` prompts of `prompt` tokens, into an empty cache.

    Args:
        kernel_s: seconds per kernel launched; None: `GRAPH_KERNEL_S` (a GPU serving engine).
        kernels: kernels the call launches; None: a serving engine's fused ones (`serve_kernels`).
        memory_op_bandwidth: bytes/s of the memory-bound ops (norms, activations, residual adds,
            rope); None: the model's bandwidth. A CPU's elementwise ops run well below its copy
            bandwidth (`serve_profiler` measures their rate).
        memory_op_bytes: the bytes those ops move, where they were counted as an eager call ran
            them (`serve_profiler` does); None: a fused engine's, one read and write of each tensor.
        cache_bandwidth: bytes/s at which attention reads the cache; None: the model's bandwidth.
            A CPU's SDPA kernel streams a cache faster than its 4-row GEMMs stream weights
            (`serve_profiler` measures both).
        eager: the host issues each kernel as the call runs (PyTorch's eager call, not a replayed
            graph): the call takes at least `kernels` x the device's fitted host time
            (`DeviceModel.host_kernel_s`; 0 on a model without one).

    Raises:
        ConfigError: a size is not a positive integer.
        UnknownNameError: a dtype is unknown, or the device has no peak for the weights' dtype.
    """
    return _serve_time(
        model, cfg, "prefill", batch, prompt, prompt, weight_dtype, cache_dtype, kernel_s, kernels,
        memory_op_bandwidth, memory_op_bytes, cache_bandwidth, eager,
    )  # fmt: skip


def predict_decode(
    model: DeviceModel,
    cfg: ArchConfig,
    batch: int,
    context: int,
    weight_dtype: str = "bf16",
    cache_dtype: str = "bf16",
    kernel_s: float | None = None,
    kernels: int | None = None,
    memory_op_bandwidth: float | None = None,
    memory_op_bytes: int | None = None,
    cache_bandwidth: float | None = None,
    eager: bool = False,
) -> ServeTime:
    """One decode step of `batch` sequences whose caches hold `context` tokens each: the step reads
    them all and adds one token per sequence (arguments as `predict_prefill`). Its time is the
    seconds per generated token of each sequence; `tokens_per_second` is the batch's."""
    _check(batch, 1, context)
    return _serve_time(
        model, cfg, "decode", batch, 1, context + 1, weight_dtype, cache_dtype, kernel_s, kernels,
        memory_op_bandwidth, memory_op_bytes, cache_bandwidth, eager,
    )  # fmt: skip


@dataclass(frozen=True)
class ServeReport:
    """A serving scenario on a device: prefill, the mean decode step over the generated tokens,
    and decode at the largest batch that fits the memory limit."""

    prefill: ServeTime
    decode: ServeTime  # the step at the middle of generation: the mean step (see serve_report)
    decode_at_max_batch: ServeTime | None  # None: no memory limit, or no batch fits
    gen_len: int  # tokens generated per sequence

    @property
    def generation_time_s(self) -> float:
        """Prefill plus a decode step per generated token after the first (which the prefill's
        logits give): the latency of the whole request."""
        return self.prefill.time_s + self.decode.time_s * (self.gen_len - 1)

    def to_dict(self) -> dict[str, Any]:
        at_max = self.decode_at_max_batch
        return {
            "prefill_time_s": self.prefill.time_s,
            "decode_time_s": self.decode.time_s,
            "decode_tokens_per_s": self.decode.tokens_per_second,
            "generation_time_s": self.generation_time_s,
            # The largest batch itself is the memory figures' (`space.serve.ServeCosts`): 0 where
            # none fits, None without a limit; this report only has decode at it.
            "max_batch_tokens_per_s": None if at_max is None else at_max.tokens_per_second,
            "prefill": self.prefill.to_dict(),
            "decode": self.decode.to_dict(),
            "decode_at_max_batch": None if at_max is None else at_max.to_dict(),
        }


def serve_report(
    model: DeviceModel,
    cfg: ArchConfig,
    batch: int,
    prompt: int,
    gen_len: int,
    weight_dtype: str = "bf16",
    cache_dtype: str = "bf16",
    max_batch: int | None = None,
    kernel_s: float | None = None,
) -> ServeReport:
    """Prefill and decode of a scenario: `batch` prompts of `prompt` tokens, `gen_len` generated.

    The decode step is taken with `prompt + gen_len // 2` cached tokens, the middle of
    generation: every part of a step is linear in the context, so it is about the mean step.
    `max_batch` (from `space.costs.max_serve_batch`) adds decode at the largest batch that fits.
    """
    mid = prompt + gen_len // 2
    prefill = predict_prefill(model, cfg, batch, prompt, weight_dtype, cache_dtype, kernel_s)
    decode = predict_decode(model, cfg, batch, mid, weight_dtype, cache_dtype, kernel_s)
    at_max = None
    if max_batch:
        at_max = predict_decode(model, cfg, max_batch, mid, weight_dtype, cache_dtype, kernel_s)
    return ServeReport(prefill, decode, at_max, gen_len)


def modelled_serve(
    cfg: ArchConfig,
    device: str,
    batch: int,
    prompt: int,
    gen_len: int,
    weight_dtype: str = "bf16",
    cache_dtype: str = "bf16",
    max_batch: int | None = None,
) -> ServeReport:
    """`serve_report` on the catalogued GPU `device` (its fitted model where it has one).

    Raises:
        UnknownNameError: `device` is not catalogued, or it has no peak for the weights' dtype.
    """
    return serve_report(
        device_model(device), cfg, batch, prompt, gen_len, weight_dtype, cache_dtype, max_batch
    )


def resolve_scenario(scenario: ServeScenario) -> ServeScenario:
    """`scenario` with its device checked: one at hand, or a catalogued GPU, whose memory becomes
    the limit when the scenario states none.

    Raises:
        ServeError: the device is neither (one line listing the catalogue).
    """
    if scenario.local:
        return scenario
    if scenario.device not in ACCELERATORS:
        raise ServeError(
            f"unknown device {scenario.device!r}; measured: local, cpu, cuda, cuda:N; "
            f"modelled: {', '.join(ACCELERATORS)}"
        )
    memory = ACCELERATORS[scenario.device].memory_bytes
    if scenario.memory_bytes is None and memory:
        return scenario.replace(memory_bytes=memory)
    return scenario


def scenario_report(cfg: ArchConfig, scenario: ServeScenario) -> ServeReport:
    """`modelled_serve` of a serving scenario on its catalogued GPU, with decode at the largest
    batch that fits its memory limit (`space.serve.serve_costs`).

    Raises:
        ConfigError: the scenario's device is not a catalogued GPU.
        UnknownNameError: the device has no peak for the weights' dtype.
    """
    from archsearch.space.serve import serve_costs

    if not scenario.modelled:
        raise ConfigError(f"serving on {scenario.device!r} is measured, not modelled: pick a catalogued GPU")
    s = resolve_scenario(scenario)
    costs = serve_costs(cfg, s)
    return modelled_serve(
        cfg, s.device, s.batch, s.prompt_len, s.gen_len, s.weight_dtype, s.cache_dtype, costs.max_batch
    )
