"""Measured serving time on the CPU: what `measure_serve` returns beside the times."""

from __future__ import annotations

import pytest

from archsearch.evaluators.serve_profiler import measure_serve
from archsearch.space.config import ArchConfig

TINY = ArchConfig(
    vocab_size=64, seq_len=32, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64
)


def test_the_decode_parts_split_the_measured_step_by_op_class():
    measured = measure_serve(TINY, "cpu", batch=2, context=16, dtype="fp32", min_run_time=0.01, parts=True)
    parts = measured.decode_parts
    assert set(parts) == {"gemm", "attention", "other"} and all(v > 0 for v in parts.values())
    assert sum(parts.values()) == pytest.approx(measured.decode_time_s)
    plain = measure_serve(TINY, "cpu", batch=2, context=16, dtype="fp32", min_run_time=0.01)
    assert plain.decode_parts is None and plain.to_dict()["decode_parts"] is None
