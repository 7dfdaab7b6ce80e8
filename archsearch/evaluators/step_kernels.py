"""The kernels one training step of the proxy model runs, as plain shapes. Pure, no torch.

Both the local profiler (which times these shapes on the device at hand) and the hardware model
(which predicts them for GPUs that are not here) start from this inventory, so they describe the
same step. It follows `evaluators.model.ProxyLM` exactly: a fused QKV projection, a fused gate+up
projection for gated MLPs, one SDPA call per layer, and the LM head.

A linear layer `y = x W^T` with x (M x in) and W (out x in) runs three GEMMs per step, written
as (m x k) @ (k x n):
  forward `y = x W^T`: m=M, n=out, k=in
  dgrad   `dx = dy W`: m=M, n=in,  k=out
  wgrad   `dW = dy^T x`: m=out, n=in, k=M
where M = batch * seq_len tokens. Every layer needs its dgrad (the embedding's gradient flows
through the whole residual stream), so each projection contributes all three.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from archsearch.space.config import NORMS, POSITIONS, ArchConfig
from archsearch.space.costs import DTYPE_BYTES, param_counts
from archsearch.space.serve import check_count


@dataclass(frozen=True)
class Gemm:
    """One GEMM shape `(m x k) @ (k x n)`, run `count` times per training step."""

    name: str  # projection and pass, e.g. "mlp_up.fwd"
    m: int
    n: int
    k: int
    count: int

    @property
    def flops(self) -> int:
        """FLOPs of all `count` calls (multiply-add = 2)."""
        return 2 * self.m * self.n * self.k * self.count

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.m, self.n, self.k)


@dataclass(frozen=True)
class AttentionCall:
    """One `scaled_dot_product_attention` shape (causal), forward or backward, `count` per step."""

    name: str  # "sdpa.fwd" or "sdpa.bwd"
    batch: int
    n_heads: int
    n_kv_heads: int
    seq_len: int
    head_dim: int
    count: int

    @property
    def flops(self) -> int:
        """Full-square FLOPs as `torch.utils.flop_counter` counts them (backward: 2.5x forward)."""
        forward = 4 * self.batch * self.n_heads * self.seq_len * self.seq_len * self.head_dim
        return (forward if self.name == "sdpa.fwd" else forward * 5 // 2) * self.count

    @property
    def causal_flops(self) -> int:
        """What a causal kernel computes: a bit over half the square."""
        return self.flops * (self.seq_len + 1) // (2 * self.seq_len)


@dataclass(frozen=True)
class MemoryOp:
    """A memory-bound step (norm, activation, residual add, softmax, optimizer): bytes it moves."""

    name: str
    bytes: int  # read + written, all calls of one step together
    row: int = 0  # elements per row of the tensors it streams, where that width varies (vocab)


@dataclass(frozen=True)
class StepKernels:
    """Everything one training step (forward + backward + optimizer) of a micro-batch runs."""

    config: ArchConfig
    batch: int
    dtype: str
    gemms: tuple[Gemm, ...]
    attention: tuple[AttentionCall, ...]
    memory_ops: tuple[MemoryOp, ...]

    @property
    def tokens(self) -> int:
        return self.batch * self.config.seq_len

    @property
    def matmul_flops(self) -> int:
        return sum(g.flops for g in self.gemms) + sum(a.flops for a in self.attention)


def _linear(name: str, tokens: int, d_in: int, d_out: int, count: int) -> list[Gemm]:
    return [
        Gemm(f"{name}.fwd", tokens, d_out, d_in, count),
        Gemm(f"{name}.dgrad", tokens, d_in, d_out, count),
        Gemm(f"{name}.wgrad", d_out, d_in, tokens, count),
    ]


@dataclass(frozen=True)
class GemmWidths:
    """The widths a step's GEMMs see, free of the config's coupling rules (q = heads x head_dim),
    so the alignment report can move one width at a time."""

    tokens: int  # batch * seq_len: the M of every forward GEMM
    d_model: int
    q_width: int
    kv_width: int
    d_ff: int
    vocab_size: int
    up_factor: int  # mlp_up outputs 2 * d_ff when gated (gate and up fused)
    n_layers: int

    @classmethod
    def of(cls, cfg: ArchConfig, batch: int) -> GemmWidths:
        return cls(
            tokens=batch * cfg.seq_len, d_model=cfg.d_model, q_width=cfg.q_dim, kv_width=cfg.kv_dim,
            d_ff=cfg.d_ff, vocab_size=cfg.vocab_size, up_factor=2 if cfg.gated else 1,
            n_layers=cfg.n_layers,
        )  # fmt: skip

    def gemms(self) -> tuple[Gemm, ...]:
        """Forward, dgrad and wgrad of every projection, the LM head last."""
        M, d, L = self.tokens, self.d_model, self.n_layers
        return (
            *_linear("qkv", M, d, self.q_width + 2 * self.kv_width, L),
            *_linear("attn_out", M, self.q_width, d, L),
            *_linear("mlp_up", M, d, self.up_factor * self.d_ff, L),
            *_linear("mlp_down", M, self.d_ff, d, L),
            *_linear("lm_head", M, d, self.vocab_size, 1),
        )


def step_kernels(
    cfg: ArchConfig, batch: int, dtype: str = "bf16", memory_ops: tuple[MemoryOp, ...] | None = None
) -> StepKernels:
    """The kernel inventory of one training step on `batch` sequences of `cfg.seq_len` tokens.

    Its memory-bound kernels are `memory_ops` where given (an eager step's, counted:
    `counting.eager_memory_ops`), else estimated here from the widths: the bytes a fused step would
    move, about a third of what PyTorch's eager step moves (autocast's casts, copies, the rotary
    embedding's and the loss's passes).

    Raises:
        ConfigError: batch is not a whole number in 1..2**31 - 1 (`space.serve.check_count`).
        UnknownNameError: unknown dtype.
    """
    check_count("batch", batch)
    size = DTYPE_BYTES[dtype]
    M, d, L = batch * cfg.seq_len, cfg.d_model, cfg.n_layers
    gemms = GemmWidths.of(cfg, batch).gemms()
    attention = [
        AttentionCall(name, batch, cfg.n_heads, cfg.n_kv_heads, cfg.seq_len, cfg.head_dim, L)
        for name in ("sdpa.fwd", "sdpa.bwd")
    ]
    # Bytes moved, forward + backward: an elementwise op reading r tensors and writing w reads
    # about r+w in its backward too (the gradient in, the saved input, the gradient out).
    act = M * d * size  # one residual-stream-sized tensor
    norms_per_layer = cfg.placement.norms_per_layer(cfg.parallel_block)
    n_norms = L * norms_per_layer + int(cfg.placement.final)
    norm_rw = 2 + (1 if NORMS[cfg.norm].has_bias and cfg.bias else 0)  # x in, y out (+ stats)
    mlp_act = M * cfg.d_ff * size
    estimated = [
        MemoryOp("norms", n_norms * act * (norm_rw + 3)),
        MemoryOp("activation", L * mlp_act * ((3 if cfg.gated else 2) + (5 if cfg.gated else 3))),
        MemoryOp("residual_add", L * 2 * act * (3 + 2)),
        # Logits are upcast to fp32 for the loss: softmax + cross-entropy read and write them.
        MemoryOp("cross_entropy", M * cfg.vocab_size * (size + 4 * 3), row=cfg.vocab_size),
        MemoryOp("embedding", act * 3 + (act * 3 if POSITIONS[cfg.pos_embedding].learned_table else 0)),
        # AdamW on fp32 parameters: read param, grad, m, v; write param, m, v.
        MemoryOp("optimizer", param_counts(cfg).total * 4 * 7),
    ]
    if POSITIONS[cfg.pos_embedding].rotary:
        qk = M * (cfg.q_dim + cfg.kv_dim) * size
        estimated.append(MemoryOp("rope", L * qk * (2 + 2)))
    if cfg.qk_norm:
        qk = M * (cfg.q_dim + cfg.kv_dim) * size
        estimated.append(MemoryOp("qk_norm", L * qk * (2 + 3)))
    memory = tuple(estimated) if memory_ops is None else memory_ops
    return StepKernels(cfg, batch, dtype, gemms, tuple(attention), memory)


# --- timing reports: the same shape whether measured (profiler) or modelled (hardware) ---
@dataclass(frozen=True)
class KernelRow:
    """One GEMM or SDPA call of the step and its measured time.

    GEMM rows are `(m x k) @ (k x n)`. SDPA rows put batch * n_heads in `m`, seq_len in `n` and
    head_dim in `k`; `shape` keeps the full (batch, n_heads, n_kv_heads, seq_len, head_dim).

    Attributes:
        flops: FLOPs of one call; causal (lower triangle) for SDPA, which is what it computes.
        time_s: median seconds of one call.
    """

    name: str
    kind: str  # "gemm", "sdpa.fwd" or "sdpa.bwd": the cache's kernel kind
    m: int
    n: int
    k: int
    count: int  # calls per step
    dtype: str
    shape: tuple[int, ...]
    flops: int
    time_s: float

    @property
    def total_s(self) -> float:
        """Seconds all `count` calls take in one step."""
        return self.time_s * self.count

    @property
    def tflops(self) -> float:
        """Achieved TFLOP/s (1e12 FLOP/s) of one call."""
        return self.flops / self.time_s / 1e12

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "m": self.m,
            "n": self.n,
            "k": self.k,
            "count": self.count,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "flops": self.flops,
            "time_s": self.time_s,
            "total_s": self.total_s,
            "tflops": self.tflops,
        }


@dataclass(frozen=True)
class MemoryRow:
    """A memory-bound op, estimated: its bytes (all calls of one step) over the measured bandwidth."""

    name: str
    bytes: int
    time_s: float  # seconds for the whole step's share of this op

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.bytes, "time_s": self.time_s}


@dataclass(frozen=True)
class ProfileReport:
    """How long one training step of `config` takes on `device`, kernel by kernel.

    `kernel_sum_s` is the sum of every kernel's `count * time_s` plus the memory ops' estimates: a
    serial sum, as one stream runs them. A real eager step was measured 1.4-5.6x longer on an H100
    (docs/explanations/hardware-costs.md): kernel launches, framework overhead, elementwise ops
    below peak bandwidth, the optimizer.
    So when the real step was measured (`measured_step_s`, the trainer's median step), it is the
    step time and the kernels are its breakdown: `residual_s` (measured minus the kernel sum) is
    the line that makes the parts add up to it. A modelled step adds the framework overhead the
    device model predicts for the `launches` kernels an eager step runs (`overhead_s`, fitted to
    real steps where `catalogue.FITTED` has a fit for the device). A bare kernel profile's step
    time is the kernel sum.
    """

    config: ArchConfig
    device: dict[str, Any]  # at least "name" and "fingerprint": DeviceInfo.to_dict() when measured
    dtype: str
    batch: int
    tokens: int  # per step: batch * seq_len
    kernels: tuple[KernelRow, ...]
    memory_ops: tuple[MemoryRow, ...]
    bandwidth_bytes_per_s: float
    min_run_time: float
    modelled: bool = False  # measured by the profiler; predicted by the hardware model
    measured_step_s: float | None = None  # the real training step (median), when one was timed
    measured_steps: int = 0  # how many steady-state steps that median is of
    launches: int = 0  # kernels the eager step launches (modelled steps)
    host_ops: int = 0  # its launches and autograd nodes: what the host is charged for
    overhead_s: float = 0.0  # modelled framework overhead of those launches

    @property
    def kernel_time_s(self) -> float:
        return sum(row.total_s for row in self.kernels)

    @property
    def memory_time_s(self) -> float:
        return sum(row.time_s for row in self.memory_ops)

    @property
    def kernel_sum_s(self) -> float:
        """GEMMs and attention as timed, plus memory-bound ops at the copy bandwidth."""
        return self.kernel_time_s + self.memory_time_s

    @property
    def residual_s(self) -> float | None:
        """Measured step minus the kernel sum: launches and framework overhead, elementwise ops,
        the optimizer. Can be negative when the memory ops' estimate overshoots a short step."""
        return None if self.measured_step_s is None else self.measured_step_s - self.kernel_sum_s

    @property
    def step_time_s(self) -> float:
        return (
            self.measured_step_s if self.measured_step_s is not None else self.kernel_sum_s + self.overhead_s
        )

    def with_measured_step(self, seconds: float, steps: int) -> ProfileReport:
        """This breakdown of a real step measured at `seconds` (the median of `steps` steps)."""
        if not (seconds > 0 and math.isfinite(seconds)):
            raise ValueError(f"a measured step must be a positive number of seconds, got {seconds}")
        return dataclasses.replace(self, measured_step_s=seconds, measured_steps=steps)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.step_time_s

    @property
    def step_source(self) -> str:
        """Where `step_time_s` comes from, in words."""
        if self.measured_step_s is not None:
            return f"measured training step, median of {self.measured_steps}"
        if self.overhead_s:
            return f"modelled eager step: the kernels plus the overhead of {self.launches} launches"
        return "sum of the kernels" + ("" if self.modelled else "; real step not measured")

    def breakdown(self) -> tuple[tuple[str, float, str | None], ...]:
        """The parts that add up to `step_time_s`: (what, seconds, what else it holds or None).
        The residual is a part only when the real step was measured."""
        parts: list[tuple[str, float, str | None]] = [
            ("matmuls and attention", self.kernel_time_s, None),
            ("memory-bound ops", self.memory_time_s, None),
        ]
        if self.residual_s is not None:
            holds = "launches, framework overhead, elementwise ops, optimizer"
            parts.append(("residual", self.residual_s, holds))
        elif self.overhead_s:
            nodes = self.host_ops - self.launches
            holds = (
                f"{self.launches} eager kernel launches"
                + (f" and {nodes} autograd nodes" if nodes > 0 else "")
                + " at their fitted GPU and host times"
            )
            parts.append(("framework overhead", self.overhead_s, holds))
        return tuple(parts)

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready object."""
        return {
            "device": dict(self.device),
            "modelled": self.modelled,
            "dtype": self.dtype,
            "batch": self.batch,
            "tokens": self.tokens,
            "step_time_s": self.step_time_s,
            "tokens_per_second": self.tokens_per_second,
            "kernel_time_s": self.kernel_time_s,
            "memory_time_s": self.memory_time_s,
            "kernel_sum_s": self.kernel_sum_s,
            "measured_step_s": self.measured_step_s,
            "measured_steps": self.measured_steps,
            "residual_s": self.residual_s,
            "launches": self.launches,
            "host_ops": self.host_ops,
            "overhead_s": self.overhead_s,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "min_run_time": self.min_run_time,
            "kernels": [row.to_dict() for row in self.kernels],
            "memory_ops": [row.to_dict() for row in self.memory_ops],
            "config": self.config.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProfileReport:
        """The report `to_dict` wrote (as stored with a trial's profile); the derived numbers in it
        (step_time_s, the sums, each kernel's total_s and tflops) are computed again, not read.

        Raises:
            KeyError: a field without a default is missing.
        """
        kernel_fields = ("name", "kind", "m", "n", "k", "count", "dtype", "flops", "time_s")
        return cls(
            config=ArchConfig.from_dict(data["config"]),
            device=dict(data["device"]),
            dtype=data["dtype"],
            batch=int(data["batch"]),
            tokens=int(data["tokens"]),
            kernels=tuple(
                KernelRow(**{f: row[f] for f in kernel_fields}, shape=tuple(row["shape"]))
                for row in data["kernels"]
            ),
            memory_ops=tuple(MemoryRow(r["name"], r["bytes"], r["time_s"]) for r in data["memory_ops"]),
            bandwidth_bytes_per_s=float(data["bandwidth_bytes_per_s"]),
            min_run_time=float(data["min_run_time"]),
            modelled=bool(data.get("modelled", False)),
            measured_step_s=data.get("measured_step_s"),
            measured_steps=int(data.get("measured_steps", 0)),
            launches=int(data.get("launches", 0)),
            host_ops=int(data.get("host_ops", data.get("launches", 0))),  # before 2026-11-28: launches
            overhead_s=float(data.get("overhead_s", 0.0)),
        )
