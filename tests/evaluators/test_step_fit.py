"""The step model fitted to real H100 steps: its provenance, what it predicts, what it is made of.

The recorded run (benchmarks/gpu_model_accuracy_h100_2026-11-22.json) is the fit's data: the
catalogued constants must be what `fit-device` gets from it today, and they must predict the
run's real steps, which the bare kernel roofline misses by 11-84%.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.errors import ConfigError
from archsearch.evaluators.catalogue import FITTED
from archsearch.evaluators.counting import (
    _counts_per_step,
    _kernels_per_step,
    count_step,
    eager_host_ops,
    eager_kernel_count,
    eager_memory_ops,
)
from archsearch.evaluators.hardware import device_model, misalignment, plan_gemm, predict_step
from archsearch.evaluators.model import ProxyLM
from archsearch.evaluators.step_fit import fitted_fields, held_out_fit, refit
from archsearch.evaluators.step_kernels import step_kernels
from archsearch.space import preset
from archsearch.space.knobs import config_from_knobs

ROOT = Path(__file__).resolve().parents[2]
H100 = FITTED["h100-sxm"]


@pytest.fixture(scope="module")
def h100_refit():
    raw = json.loads((ROOT / H100.data).read_text())
    return refit(raw, "h100-sxm", eager_kernel_count)


def test_the_catalogued_h100_constants_are_a_refit_of_their_recorded_run(h100_refit):
    assert hashlib.sha256((ROOT / H100.data).read_bytes()).hexdigest() == H100.sha256
    assert H100.shapes == len(h100_refit.records) == 8
    refitted = fitted_fields(h100_refit.model)
    assert set(refitted) == {name for name, _ in H100.fields}
    for name, value in H100.fields:
        assert refitted[name] == pytest.approx(value, rel=1e-3, abs=1e-12), name


def test_the_fitted_model_predicts_the_real_steps_the_kernel_sum_misses(h100_refit):
    before = [k / r.real_step_s - 1 for k, r in zip(h100_refit.kernel_sums, h100_refit.records, strict=True)]
    after = [p / r.real_step_s - 1 for p, r in zip(h100_refit.predicted, h100_refit.records, strict=True)]
    assert max(before) < -0.10  # the bare roofline: every real step 1.12x its kernel sum or more
    assert max(abs(e) for e in after) < 0.065  # d1024-ff2750, off the 8 bytes: -6.1%
    assert statistics.median(abs(e) for e in after) < 0.04
    # The catalogue's record of the held-out errors (fit-device --holdout measures them).
    assert (H100.holdout_median, H100.holdout_worst) == (0.016, 0.073)


def test_a_refit_reports_each_fit_it_makes():
    raw = json.loads((ROOT / H100.data).read_text())
    raw["shapes"] = raw["shapes"][:3]  # three shapes: four fits with the held-out ones
    calls = []
    result = refit(raw, "h100-sxm", eager_kernel_count, holdout=True, on_progress=lambda *a: calls.append(a))
    labels = [r.label for r in result.records]
    assert calls == [
        (0, 4, "all 3 shapes"),
        *((1 + i, 4, f"all but {label}") for i, label in enumerate(labels)),
        (4, 4, "done"),
    ]
    assert [h.label for h in result.holdout] == labels


def test_a_modelled_step_adds_up_and_a_small_shape_waits_on_the_host():
    model = device_model("h100-sxm")
    cfg = preset("gpt2-small")
    report = predict_step(model, step_kernels(cfg, 8), launches=eager_kernel_count(cfg))
    assert sum(seconds for _, seconds, _ in report.breakdown()) == pytest.approx(report.step_time_s)
    assert report.breakdown()[-1][0] == "framework overhead" and report.overhead_s > 0
    assert "eager step" in report.step_source and report.to_dict()["launches"] == report.launches
    # A byte-level proxy's kernels take less than its host takes to record its graph and issue
    # its launches: host-bound.
    tiny = config_from_knobs(vocab_size=256, seq_len=256, d_model=128, n_layers=4, head_dim=64, d_ff=512)
    host_ops = eager_host_ops(tiny)
    small = predict_step(model, step_kernels(tiny, 4), launches=eager_kernel_count(tiny), host_ops=host_ops)
    assert small.step_time_s == pytest.approx(host_ops * model.host_kernel_s)
    assert small.step_time_s > 5 * small.kernel_sum_s and small.to_dict()["host_ops"] == host_ops
    assert "autograd nodes" in small.breakdown()[-1][2]
    # A call without autograd (None) is charged its launches alone.
    bare = predict_step(model, step_kernels(tiny, 4), launches=eager_kernel_count(tiny))
    assert bare.step_time_s < small.step_time_s and bare.host_ops == bare.launches
    # No launches, no overhead: the bare roofline's kernel sum.
    assert predict_step(model, step_kernels(cfg, 8)).step_time_s == report.kernel_sum_s


def test_eager_kernel_count_is_exact_in_depth_and_follows_the_structure():
    cfg = config_from_knobs(
        vocab_size=64, seq_len=16, d_model=32, n_layers=3, head_dim=8, d_ff=64, activation="swiglu"
    )
    tiny = dict(d_model=8 * cfg.n_heads, head_dim=8, d_ff=32, vocab_size=64, seq_len=16)
    assert eager_kernel_count(cfg) == _kernels_per_step(
        dataclasses.replace(cfg, **tiny)
    )  # counted at 3 layers and its own head counts
    wider = dataclasses.replace(cfg, d_model=64, d_ff=256, vocab_size=512)
    assert eager_kernel_count(wider) == eager_kernel_count(cfg)  # widths launch no more kernels
    assert eager_kernel_count(dataclasses.replace(cfg, n_layers=6)) > eager_kernel_count(cfg)
    assert eager_kernel_count(dataclasses.replace(cfg, activation="gelu")) != eager_kernel_count(cfg)


def test_an_rmsnorm_counts_as_the_one_fused_kernel_each_way_cuda_runs():
    # On CUDA `rms_norm` runs `_fused_rms_norm` (one kernel forward, one backward) when the input
    # has the weight's dtype, as a LayerNorm runs one each way; the CPU the count runs on spells it
    # out in a dozen ops. Counted as the CPU runs it, the H200 campaign's LLaMA-like shapes showed
    # 30 us of host time per launch against GPT-2's 44-53
    # (benchmarks/data/gpu_campaign_nvidia-h200_steps.json).
    base = config_from_knobs(
        vocab_size=64, seq_len=16, d_model=32, n_layers=2, head_dim=8, d_ff=64, activation="swiglu"
    )
    rms, layer = (dataclasses.replace(base, norm=n, bias=False) for n in ("rmsnorm", "layernorm"))
    assert eager_kernel_count(rms) == eager_kernel_count(layer)  # the block norms: fp32 residual stream
    # A qk-norm (queries and keys) or a sandwich norm (after attention, after the MLP) meets
    # autocast's bf16 tensors: the proxy's RMSNorm casts its weight to them so that CUDA fuses it,
    # one kernel more each way (the cast, its gradient's) where a LayerNorm takes mixed dtypes.
    for knobs in (dict(qk_norm=True), dict(norm_placement="sandwich")):
        rms_2, layer_2 = (dataclasses.replace(c, **knobs) for c in (rms, layer))
        assert eager_kernel_count(rms_2) - eager_kernel_count(layer_2) == 2 * (2 * base.n_layers), knobs


@pytest.mark.parametrize(
    ("heads", "kv_heads"),
    [(1, 1), (2, 1), (3, 1), (16, 1), (2, 2), (3, 3), (12, 12), (4, 2), (6, 3), (8, 2), (12, 4)],
    ids=lambda v: str(v),
)
def test_eager_kernel_count_is_the_real_count_at_every_head_count_of_a_layout(heads, kv_heads):
    # Counted once per kind of layout (one head, MQA, GQA, MHA), whatever the head counts: the real
    # step at these head counts launches exactly as many (one layer of this structure, measured:
    # one head 106, MQA 110, GQA and MHA 112).
    cfg = config_from_knobs(
        vocab_size=64, seq_len=16, d_model=8 * heads, n_layers=2, n_heads=heads, n_kv_heads=kv_heads,
        head_dim=8, d_ff=32, activation="swiglu",
    )  # fmt: skip
    assert eager_kernel_count(cfg) == _kernels_per_step(cfg)


@pytest.mark.parametrize(
    "knobs",
    [
        dict(activation="swiglu", n_heads=6, n_kv_heads=2),
        dict(activation="gelu", norm="layernorm", pos_embedding="learned", bias=True, tie_embeddings=True,
             n_heads=3, n_kv_heads=3),
        dict(activation="reglu", norm_placement="sandwich", qk_norm=True, n_heads=1, n_kv_heads=1),
    ],
    ids=["gqa", "gpt2-like", "one-head-sandwich-qk_norm"],
)  # fmt: skip
def test_the_host_ops_are_the_launches_and_the_autograd_graphs_nodes_of_the_real_step(knobs):
    # Counted at tiny widths and 1-2 layers, extended in depth: at 3 layers and these head
    # counts, the real step's launches plus its graph's nodes (one per differentiable op and
    # parameter; a fused norm is one).
    cfg = config_from_knobs(vocab_size=64, seq_len=16, d_model=48, n_layers=3, head_dim=8, d_ff=40, **knobs)
    real = count_step(cfg)
    parameters = sum(1 for _ in ProxyLM(cfg).parameters())
    assert real.nodes > parameters  # one AccumulateGrad per parameter, and the ops
    assert eager_host_ops(cfg) == real.kernels + real.nodes
    assert eager_kernel_count(cfg) == real.kernels
    deeper = dataclasses.replace(cfg, n_layers=6)
    assert eager_host_ops(deeper) - eager_host_ops(cfg) == 3 * (eager_host_ops(cfg) - eager_host_ops(
        dataclasses.replace(cfg, n_layers=2)))  # fmt: skip


@pytest.mark.parametrize(
    "knobs",
    [
        dict(activation="swiglu", norm_placement="sandwich", qk_norm=True, n_heads=4, n_kv_heads=2),
        dict(activation="gelu", norm="layernorm", pos_embedding="learned", bias=True, tie_embeddings=True,
             n_heads=3),
        dict(activation="reglu", n_heads=4, n_kv_heads=1),
    ],
    ids=["sandwich-gqa-qk_norm", "gpt2-like", "mqa"],
)  # fmt: skip
def test_eager_memory_bytes_are_the_dispatchers_count_at_sizes_the_fit_never_saw(knobs):
    # Fitted on tiny copies of the structure (batch 2-4, widths 8-40), evaluated at other sizes and
    # depth: the bytes each group of kernels moves, exactly as counting this very step gives them.
    cfg = config_from_knobs(vocab_size=50, seq_len=12, d_model=44, n_layers=3, head_dim=10, d_ff=56, **knobs)
    counted = count_step(cfg, batch=5).bytes
    assert {op.name: op.bytes for op in eager_memory_ops(cfg, 5)} == counted
    assert set(counted) == {"elementwise", "cross_entropy", "optimizer"}
    rows = {op.name: op.row for op in eager_memory_ops(cfg, 5)}
    assert rows == {"elementwise": 0, "cross_entropy": 50, "optimizer": 0}  # the loss streams vocab rows


def _counted_after_a_whole_step(cfg, batch: int, dtype: str):
    """The step counted as the GPU campaign's real steps run: after a whole first step."""
    import contextlib

    import torch
    import torch.nn.functional as F

    from archsearch.evaluators.counting import KernelCounter, count_norms_as_fused

    torch.manual_seed(0)
    model = ProxyLM(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    idx = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len + 1))
    counter = KernelCounter()
    count_norms_as_fused(model, counter)
    for step in range(2):
        counter.kernels, counter.bytes = 0, {}
        with counter if step else contextlib.nullcontext():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                logits = model(idx[:, :-1])
            F.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten()).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return counter


@pytest.mark.parametrize(
    ("knobs", "dtype"),
    [
        (dict(activation="swiglu", norm_placement="sandwich", qk_norm=True, n_heads=4, n_kv_heads=2), "bf16"),
        (dict(activation="gelu", norm="layernorm", pos_embedding="learned", bias=True, tie_embeddings=True,
              n_heads=3), "bf16"),
        (dict(activation="relu", norm_placement="post", pos_embedding="none", n_heads=2), "fp32"),
    ],
    ids=["sandwich-gqa-qk_norm", "gpt2-like", "post-fp32"],
)  # fmt: skip
def test_the_counted_step_is_the_step_after_a_whole_one(knobs, dtype):
    # `count_step` makes the optimizer's state with one step on zero gradients, not a whole
    # forward and backward (half the time): nothing else a first step does is lazy.
    cfg = config_from_knobs(vocab_size=40, seq_len=10, d_model=24, n_layers=2, head_dim=6, d_ff=40, **knobs)
    whole, counted = _counted_after_a_whole_step(cfg, 3, dtype), count_step(cfg, 3, dtype)
    assert (counted.kernels, counted.bytes) == (whole.kernels, whole.bytes)


def test_eager_bytes_are_counted_once_per_structure_across_processes(tmp_path, monkeypatch):
    # Kept in the cache folder: a Ray worker or a CLI call reads them instead of counting again.
    import archsearch.evaluators.counting as counting

    monkeypatch.setenv("ARCHSEARCH_CACHE", str(tmp_path))
    cfg = config_from_knobs(
        vocab_size=48, seq_len=12, d_model=40, n_layers=2, head_dim=10, activation="geglu"
    )
    counting._byte_coefficients.cache_clear()  # as a fresh process
    first = eager_memory_ops(cfg, 3)
    [kept] = (tmp_path / "eager-bytes").iterdir()
    counting._byte_coefficients.cache_clear()
    monkeypatch.setattr(counting, "count_step", lambda *a: pytest.fail("counted again"))
    assert eager_memory_ops(cfg, 3) == first
    kept.write_text("not json")  # a damaged file is counted again, not trusted
    counting._byte_coefficients.cache_clear()
    monkeypatch.undo()
    monkeypatch.setenv("ARCHSEARCH_CACHE", str(tmp_path))
    assert eager_memory_ops(cfg, 3) == first and json.loads(kept.read_text())
    counting._byte_coefficients.cache_clear()


def test_a_fit_prices_the_bytes_the_eager_step_moves_not_the_fused_estimate(h100_refit):
    # PyTorch's eager step moves about 3x the bytes a fused step would (autocast's casts, RoPE's
    # and the loss's passes, copies): on the H200 (2026-11-27) d1024 at batch 32 traced 95.8 ms
    # of kernels, where the estimate priced 58.6 ms and the counted bytes 91.8 ms.
    record = next(r for r in h100_refit.records if r.label == "d1024-ff2752")
    eager = eager_memory_ops(record.config, record.batch, record.dtype)
    assert record.kernels.memory_ops == eager
    estimate = step_kernels(record.config, record.batch, record.dtype).memory_ops
    assert sum(op.bytes for op in eager) > 2.5 * sum(op.bytes for op in estimate)  # 45.0 GB against 15.1


def test_head_counts_of_one_layout_are_counted_once():
    # What made `export --scale-to 70B` take minutes: each candidate's head count was a new step.
    base = config_from_knobs(
        vocab_size=64, seq_len=16, d_model=64, n_layers=3, head_dim=8, d_ff=64, activation="gelu"
    )
    eager_kernel_count(base)
    counted = _counts_per_step.cache_info().misses
    for heads in (2, 4, 8, 16, 32, 64):
        eager_kernel_count(dataclasses.replace(base, d_model=128 * heads, n_heads=heads, n_kv_heads=heads))
    assert _counts_per_step.cache_info().misses == counted


def test_alignment_penalises_n_and_k_by_how_far_off_they_are_and_leaves_m_free():
    model = device_model("h100-sxm", fitted=False)
    assert [misalignment(size, 8) for size in (4096, 4100, 4098, 4097)] == [0.0, 1 / 3, 2 / 3, 1.0]
    assert misalignment(4097, 1) == 0.0
    aligned, m_off = plan_gemm(model, 8192, 2048, 2048), plan_gemm(model, 8191, 2048, 2048)
    assert m_off.alignment_factor == aligned.alignment_factor == 1.0
    factors = [plan_gemm(model, 8192, n, 2048).alignment_factor for n in (2052, 2050, 2049)]
    assert factors == pytest.approx([0.5 ** (1 / 3), 0.5 ** (2 / 3), 0.5])
    assert plan_gemm(model, 8192, 2048, 2049).alignment_factor == 0.5


def test_fit_device_prints_the_fit_and_refuses_bad_files(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["fit-device", str(ROOT / H100.data), "--no-holdout", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["sha256"] == H100.sha256 and len(out["shapes"]) == 8
    assert all(row["holdout_s"] is None for row in out["shapes"])
    assert out["catalogued"] == {name: value for name, value in H100.fields}
    for text, message in [
        (None, "recorded run not found"),
        ("[1, 2", "invalid JSON at line 1 column 6"),
        ("[]", "not a recorded gpu_model_accuracy run"),
        ('{"shapes": [{"label": "x"}]}', "not a recorded gpu_model_accuracy run"),
    ]:
        path = tmp_path / "run.json"
        path.unlink(missing_ok=True)
        if text is not None:
            path.write_text(text)
        result = runner.invoke(app, ["fit-device", str(path)])
        assert result.exit_code == 2 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_a_held_out_fit_scores_shapes_it_never_saw():
    raw = json.loads((ROOT / H100.data).read_text())
    labels = [entry["label"] for entry in raw["shapes"]]
    fit, holdouts = held_out_fit(raw, "h100-sxm", eager_kernel_count, {"d1024-ff2760", "byte-d512"})
    assert [r.label for r in fit.records] == [x for x in labels if x not in {"d1024-ff2760", "byte-d512"}]
    assert [h.label for h in holdouts] == ["d1024-ff2760", "byte-d512"]
    assert all(h.real_step_s > 0 and h.predicted_s > 0 for h in holdouts)
    # One shape held out is fit-device's --holdout for that shape: d1024-ff2750 (its d_ff off the
    # 8 bytes) is the catalogued fit's worst held-out shape.
    _, (alone,) = held_out_fit(raw, "h100-sxm", eager_kernel_count, {"d1024-ff2750"})
    assert abs(alone.error) == pytest.approx(H100.holdout_worst, abs=5e-4)
    # Nothing held out: the fit on every shape, as `refit`.
    everything, none = held_out_fit(raw, "h100-sxm", eager_kernel_count, set())
    assert none == () and fitted_fields(everything.model) == pytest.approx(dict(H100.fields), rel=1e-3)


def test_a_held_out_fit_refuses_labels_the_run_does_not_hold():
    raw = json.loads((ROOT / H100.data).read_text())
    with pytest.raises(ConfigError, match=r"held-out shape\(s\) not in the run: gpt2-large, nope"):
        held_out_fit(raw, "h100-sxm", eager_kernel_count, {"nope", "gpt2-large", "byte-d512"})
    all_but_one = {entry["label"] for entry in raw["shapes"][1:]}
    with pytest.raises(ConfigError, match="at least 2 shapes with a real step, got 1"):
        held_out_fit(raw, "h100-sxm", eager_kernel_count, all_but_one)
