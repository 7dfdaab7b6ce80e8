"""The local profiler: device description, timing through the cache, the report's arithmetic.

Times on these shared CPUs are noise, so nothing here asserts a speed: only that times are positive
and finite, that each distinct kernel is timed exactly once, and that the report adds up.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re

import pytest
import torch

from archsearch.errors import ArchsearchError
from archsearch.evaluators import profiler
from archsearch.evaluators.device import DeviceError, detect_device
from archsearch.evaluators.profiler import (
    InMemoryCache,
    JsonFileCache,
    MeasurementCache,
    MeasurementKey,
    ProfilerError,
    measure_bandwidth,
    profile_step,
    time_gemm,
)
from archsearch.evaluators.step_kernels import step_kernels
from archsearch.space import ArchConfig

TINY = ArchConfig(
    vocab_size=64, seq_len=32, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128
)
BATCH = 2
MIN_RUN = 0.002  # seconds: enough to exercise the Timer, short enough for a 2-core CI box
PROJECTIONS = ("qkv", "attn_out", "mlp_up", "mlp_down", "lm_head")
PASSES = ("fwd", "dgrad", "wgrad")


@pytest.fixture
def timed(monkeypatch) -> list[object]:
    """Every real timing call `profile_step` makes, recorded, still timed for real."""
    calls: list[object] = []
    real = profiler._median_seconds

    def spy(fn, info, min_run_time):
        calls.append(fn)
        return real(fn, info, min_run_time)

    monkeypatch.setattr(profiler, "_median_seconds", spy)
    return calls


def distinct_shapes(cfg: ArchConfig, batch: int) -> set[tuple[str, tuple[int, ...]]]:
    """The (kind, shape) pairs of a step, worked out from the inventory, not from the profiler."""
    step = step_kernels(cfg, batch)
    gemms = {("gemm", g.shape) for g in step.gemms}
    sdpa = {(a.name, (a.batch, a.n_heads, a.n_kv_heads, a.seq_len, a.head_dim)) for a in step.attention}
    return gemms | sdpa


def profile(cache: MeasurementCache | None = None, **kwargs) -> profiler.ProfileReport:
    kwargs = {"dtype": "fp32", "min_run_time": MIN_RUN, **kwargs}
    return profile_step(TINY, BATCH, cache=cache, **kwargs)


# --- the device ---------------------------------------------------------------------------------


def test_cpu_device_info():
    info = detect_device("cpu")
    assert info.type == "cpu"
    assert info.index is None
    assert info.name and info.name != "unknown cpu"
    assert info.units == os.cpu_count()
    assert info.threads == torch.get_num_threads()
    assert info.capability == info.cpu_capability == torch.backends.cpu.get_cpu_capability()
    assert info.torch_version == torch.__version__
    assert info.cuda_version == torch.version.cuda
    assert info.memory_bytes > 0  # Linux reports physical pages
    assert info.torch_device == torch.device("cpu")
    assert re.fullmatch(r"[0-9a-f]{16}", info.fingerprint)
    assert detect_device("cpu").fingerprint == info.fingerprint  # stable
    as_json = json.loads(json.dumps(info.to_dict()))
    assert as_json["fingerprint"] == info.fingerprint
    assert as_json["name"] == info.name


def test_fingerprint_tracks_what_changes_speed():
    info = detect_device("cpu")
    # A capability other than the host's: a fixed one ("AVX2") is no change on an AVX2-only host.
    other_capability = "AVX512" if info.capability != "AVX512" else "AVX2"
    for change in ({"threads": info.threads + 1}, {"name": "other cpu"}, {"capability": other_capability}):
        assert dataclasses.replace(info, **change).fingerprint != info.fingerprint, change
    for change in ({"memory_bytes": 1}, {"index": 3}):
        assert dataclasses.replace(info, **change).fingerprint == info.fingerprint, change


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_without_cuda_is_a_clear_error(device):
    with pytest.raises(DeviceError, match="no CUDA device"):
        detect_device(device)
    with pytest.raises(ArchsearchError, match="no CUDA device"):
        profile_step(TINY, BATCH, device=device)


@pytest.mark.parametrize("device", ["tpu", "not a device", "meta"])
def test_other_devices_are_refused(device):
    with pytest.raises(DeviceError, match=re.escape(repr(device))):
        detect_device(device)


@pytest.mark.parametrize("dtype", ["fp8", "fp64"])
def test_dtypes_the_profiler_cannot_time(dtype):
    with pytest.raises(ProfilerError, match=f"dtype '{dtype}' cannot be profiled; profiled dtypes: fp32"):
        profile(dtype=dtype)


def test_min_run_time_must_be_positive():
    with pytest.raises(ProfilerError, match="min_run_time"):
        profile(min_run_time=0.0)


# --- the report ----------------------------------------------------------------------------------


def test_report_adds_up():
    report = profile(dtype="bf16")
    data = json.loads(json.dumps(report.to_dict()))
    assert {"device", "modelled", "step_time_s", "tokens_per_second", "kernels"} <= set(data)
    assert data["modelled"] is False
    assert data["device"]["fingerprint"] == detect_device("cpu").fingerprint
    assert data["tokens"] == BATCH * TINY.seq_len
    assert data["dtype"] == "bf16"

    for row in data["kernels"]:
        assert {"name", "m", "n", "k", "count", "dtype", "time_s", "tflops"} <= set(row)
        assert row["dtype"] == "bf16"
        assert 0 < row["time_s"] < math.inf
        assert row["tflops"] == pytest.approx(row["flops"] / row["time_s"] / 1e12)
    assert data["bandwidth_bytes_per_s"] > 0
    for op in data["memory_ops"]:
        assert op["time_s"] == pytest.approx(op["bytes"] / data["bandwidth_bytes_per_s"])

    rows_total = sum(r["count"] * r["time_s"] for r in data["kernels"])
    memory_total = sum(op["time_s"] for op in data["memory_ops"])
    assert data["step_time_s"] == pytest.approx(rows_total + memory_total, rel=1e-12)
    assert data["tokens_per_second"] == pytest.approx(data["tokens"] / data["step_time_s"], rel=1e-12)
    assert report.step_time_s == data["step_time_s"]


def test_kernel_rows_cover_the_step():
    report = profile()
    names = [row.name for row in report.kernels]
    expected = [f"{p}.{s}" for p in PROJECTIONS for s in PASSES] + ["sdpa.fwd", "sdpa.bwd"]
    assert names == expected

    step = step_kernels(TINY, BATCH)
    for row, gemm in zip(report.kernels[: len(step.gemms)], step.gemms, strict=True):
        assert (row.kind, row.m, row.n, row.k, row.count) == ("gemm", gemm.m, gemm.n, gemm.k, gemm.count)
        assert row.flops == 2 * gemm.m * gemm.n * gemm.k
    for row, call in zip(report.kernels[-2:], step.attention, strict=True):
        # SDPA rows: batch * n_heads in m, seq_len in n, head_dim in k; the full shape alongside.
        assert (row.m, row.n, row.k) == (BATCH * TINY.n_heads, TINY.seq_len, TINY.head_dim)
        assert row.shape == (BATCH, TINY.n_heads, TINY.n_kv_heads, TINY.seq_len, TINY.head_dim)
        assert row.flops == call.causal_flops // call.count  # causal: what the kernel computes
    assert [op.name for op in report.memory_ops] == [op.name for op in step.memory_ops]


# --- timing each kernel once ---------------------------------------------------------------------


def test_identical_shapes_in_a_step_are_timed_once(timed):
    report = profile()
    shapes = distinct_shapes(TINY, BATCH)
    # The tiny config repeats shapes: attn_out.fwd and .dgrad are both 64x64x64 per 64 tokens...
    assert len(shapes) < len(report.kernels)
    assert len(timed) == len(shapes) + 1  # + the bandwidth copy
    by_shape: dict[tuple[str, tuple[int, ...]], set[float]] = {}
    for row in report.kernels:
        by_shape.setdefault((row.kind, row.shape), set()).add(row.time_s)
    assert all(len(times) == 1 for times in by_shape.values())  # ...and share one measurement


def test_cache_prevents_retiming(timed):
    cache = InMemoryCache()
    seen = []
    first = profile(cache, progress=lambda done, total, label: seen.append((done, total, label)))
    assert seen[0][:2] == (0, len(distinct_shapes(TINY, BATCH)) + 1) and seen[-1][0] == seen[-1][1]
    assert [done for done, _, _ in seen] == sorted(done for done, _, _ in seen)
    assert len(timed) == len(distinct_shapes(TINY, BATCH)) + 1
    assert len(cache) == len(timed)

    timed.clear()
    second = profile(cache)
    assert timed == []
    assert second.kernels == first.kernels
    assert second.bandwidth_bytes_per_s == first.bandwidth_bytes_per_s

    # Another dtype is another measurement.
    profile(cache, dtype="bf16")
    assert len(timed) == len(distinct_shapes(TINY, BATCH))  # the bandwidth copy is dtype-free


def test_bandwidth_measured_once_per_device(timed):
    cache = InMemoryCache()
    first = measure_bandwidth("cpu", cache, MIN_RUN, nbytes=1 << 20)
    again = measure_bandwidth("cpu", cache, MIN_RUN, nbytes=1 << 20)
    assert len(timed) == 1
    assert first == again > 0


def test_time_gemm_is_positive_and_finite():
    seconds = time_gemm(64, 32, 16, "cpu", "fp32", min_run_time=MIN_RUN)
    assert 0 < seconds < math.inf


# --- the JSON cache ------------------------------------------------------------------------------


def test_caches_implement_the_protocol(tmp_path):
    assert isinstance(InMemoryCache(), MeasurementCache)
    assert isinstance(JsonFileCache(tmp_path / "cache.json"), MeasurementCache)


def test_json_cache_round_trip(tmp_path, timed):
    path = tmp_path / "nested" / "cache.json"
    cache = JsonFileCache(path)  # a missing file is an empty cache
    assert len(cache) == 0
    first = profile(cache)
    n_timed = len(timed)

    reopened = JsonFileCache(path)
    assert len(reopened) == n_timed
    for row in first.kernels:
        key = MeasurementKey(first.device["fingerprint"], "fp32", row.kind, row.shape)
        assert reopened.get(key) == row.time_s

    timed.clear()
    second = profile(reopened)
    assert timed == []
    assert second.step_time_s == first.step_time_s

    data = json.loads(path.read_text())
    assert data["version"] == 1
    entry = next(iter(data["entries"].values()))
    assert entry["device"]["fingerprint"] == first.device["fingerprint"]
    assert os.listdir(path.parent) == ["cache.json"]  # no temporary file left behind


def test_json_cache_writers_merge(tmp_path):
    path = tmp_path / "cache.json"
    info = detect_device("cpu")
    one, two = JsonFileCache(path), JsonFileCache(path)
    key_a = MeasurementKey(info.fingerprint, "bf16", "gemm", (8, 8, 8))
    key_b = MeasurementKey(info.fingerprint, "bf16", "gemm", (16, 16, 16))
    one.put(key_a, 1e-6, info)
    two.put(key_b, 2e-6, info)
    merged = JsonFileCache(path)
    assert (merged.get(key_a), merged.get(key_b)) == (1e-6, 2e-6)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", ": invalid JSON at line 1 column 2"),
        ("[]", "is not a version-1 archsearch cache"),
        ('{"version": 2, "entries": {}}', "is not a version-1 archsearch cache"),
        ('{"version": 1, "entries": {"k": {"seconds": -1}}}', "is not a version-1 archsearch cache"),
        ('{"version": 1, "entries": {"k": {"seconds": "fast"}}}', "is not a version-1 archsearch cache"),
    ],
    ids=["bad-json", "not-an-object", "wrong-version", "negative-time", "not-a-number"],
)
def test_corrupt_json_cache_is_a_clear_error(tmp_path, text, match):
    path = tmp_path / "cache.json"
    path.write_text(text)
    with pytest.raises(ProfilerError, match=match):
        JsonFileCache(path)


# --- memory --------------------------------------------------------------------------------------


def test_oversized_kernel_is_refused_before_timing(timed):
    with pytest.raises(
        ProfilerError,
        match=r"kernel qkv\.fwd \(gemm 64x128x64\) needs about 80\.0 KiB .* limit of 1000 bytes",
    ):
        profile(max_bytes=1000)
    assert timed == []


def test_default_limit_follows_free_memory(timed):
    # A billion sequences: the inventory is pure arithmetic, and the guard stops it before torch.
    with pytest.raises(ProfilerError, match=r"kernel qkv\.fwd .* above the limit of"):
        profile_step(TINY, 10**9, dtype="fp32")
    assert timed == []


def test_allocation_failure_names_the_kernel(monkeypatch):
    def out_of_memory(fn, info, min_run_time):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(profiler, "_median_seconds", out_of_memory)
    with pytest.raises(ProfilerError, match=r"kernel qkv\.fwd .* does not fit in cpu memory"):
        profile()


def test_other_runtime_errors_are_not_disguised(monkeypatch):
    def bug(fn, info, min_run_time):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(profiler, "_median_seconds", bug)
    with pytest.raises(RuntimeError, match="cannot be multiplied") as excinfo:
        profile()
    assert not isinstance(excinfo.value, ProfilerError)


def test_device_info_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        detect_device("cpu").threads = 1  # type: ignore[misc]
