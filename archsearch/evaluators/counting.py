"""One eager training step of the proxy counted with PyTorch's dispatcher, as a GPU runs it: the
kernels it launches, the nodes of its autograd graph, and the bytes its memory-bound kernels move.

The device models price a step from these (`hardware.DeviceModel`): each launch the GPU's gap
between kernels, launches and nodes the host's time, the bytes at the memory's rate. Every count
is taken on the CPU on tiny copies of a config's structure (an instant, cached) and extended to
its depth and widths, which it follows exactly (tests/evaluators/test_step_fit.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import json
import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from archsearch.errors import ArchsearchError
from archsearch.evaluators.model import ProxyLM, RMSNorm
from archsearch.evaluators.step_kernels import MemoryOp
from archsearch.space.config import ArchConfig

log = logging.getLogger(__name__)


def _tensor_bytes(x: object) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, list | tuple):
        return sum(_tensor_bytes(y) for y in x)
    return 0


# ATen ops that run a GEMM or attention kernel: the device models price those from their shapes
# (`step_kernels.step_kernels`); every other kernel is memory-bound and priced by the bytes it moves.
_COMPUTE_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm"})  # matmul and linear decompose to these
# The memory-bound kernels' groups, by ATen op (the rest: "elementwise"): the loss streams rows of
# the vocabulary's width (`step_kernels.MemoryOp.row`), the fused optimizer the fp32 parameters.
_BYTE_GROUPS = {
    "_log_softmax": "cross_entropy", "_log_softmax_backward_data": "cross_entropy",
    "nll_loss_forward": "cross_entropy", "nll_loss_backward": "cross_entropy",
    "_fused_adamw_": "optimizer",
}  # fmt: skip


class KernelCounter(TorchDispatchMode):
    """Counts the ATen calls that run a kernel (views and detaches only re-label memory) and the
    bytes each memory-bound one reads and writes, by group (`_BYTE_GROUPS`)."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels = 0
        self.bytes: dict[str, int] = {}
        self.nodes = 0  # the autograd graph's, set by `count_step`
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


class FusedRMSNorm(torch.autograd.Function):
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


def count_norms_as_fused(model: nn.Module, counter: KernelCounter) -> None:
    """Make `model`'s RMSNorms count as CUDA runs them: one fused kernel each way
    (`FusedRMSNorm`), on the weight cast to the input's dtype where they differ (`RMSNorm`: the
    cast and its gradient's are counted as the dispatcher sees them)."""
    for norm in model.modules():
        if isinstance(norm, RMSNorm):
            plain = norm.forward

            def forward(x: torch.Tensor, norm: RMSNorm = norm, plain: Callable = plain) -> torch.Tensor:
                if norm.weight is None:
                    return plain(x)
                weight = norm.weight if norm.weight.dtype == x.dtype else norm.weight.to(x.dtype)
                return FusedRMSNorm.apply(x, weight, norm.eps, counter)

            norm.forward = forward


def count_step(structure: ArchConfig, batch: int = 1, dtype: str = "bf16") -> KernelCounter:
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


def _count_step_here(structure: ArchConfig, batch: int, dtype: str) -> KernelCounter:
    torch.manual_seed(0)
    model = ProxyLM(structure)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    idx = torch.randint(0, structure.vocab_size, (batch, structure.seq_len + 1))
    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype)
    counter = KernelCounter()
    count_norms_as_fused(model, counter)
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
    norm's `FusedRMSNorm` is one) and one per parameter whose gradient it accumulates."""
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
    (`count_step`)."""
    counter = count_step(structure)
    return counter.kernels, counter.nodes


def _kernels_per_step(structure: ArchConfig) -> int:
    """Kernels one steady-state bf16 training step of `structure` runs (`count_step`)."""
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
    autograd (prefill, decode) is charged its launches alone (`hardware_serving`).
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
@functools.cache
def _source_hash() -> str:
    """What counted the cached bytes (`_byte_coefficients`): the model's source (`model.py`, which
    ops a step runs) and this module's (the step it builds and how each op's bytes are counted),
    so a change to either counts anew (read once, when a count is first looked up, not at import)."""
    digest = hashlib.sha256()
    for source in (Path(inspect.getfile(ProxyLM)), Path(__file__)):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


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
    structure, the dtype, torch's version and the sources that count it (`_source_hash`: the
    model's and this module's), so a change to any counts anew; a folder that cannot be written
    only loses the saving."""
    from archsearch.evaluators.data import cache_dir
    from archsearch.fileio import write_atomic

    key = json.dumps([structure.to_dict(), dtype, torch.__version__, _source_hash()], sort_keys=True)
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
            [count_step(dataclasses.replace(variant, n_layers=n), batch, dtype).bytes for n in (1, 2)]
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
                               f"(off by {worst:.0f} bytes): extend counting._width_terms")  # fmt: skip
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
    158 GB, where `step_kernels.step_kernels` estimates 46; on the H200 (2026-11-27) that step's
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
