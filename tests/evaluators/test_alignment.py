"""The alignment report: which widths suit a device's tiles, waves and alignment."""

from __future__ import annotations

import dataclasses
import json

import pytest

from archsearch.errors import UnknownNameError
from archsearch.evaluators.alignment import REPORT_DIMENSIONS, alignment_report
from archsearch.evaluators.hardware import device_model, predict_step
from archsearch.evaluators.step_kernels import step_kernels
from archsearch.space import preset

A100 = device_model("a100-80gb")


def test_alignment_report_prefers_11008_to_11000():
    odd = dataclasses.replace(preset("llama2-7b"), d_ff=11000)
    report = alignment_report(A100, odd, batch=1)
    assert [d.name for d in report.dimensions] == list(REPORT_DIMENSIONS)
    d_ff = report.dimension("d_ff")
    assert d_ff.gemm_sizes == (11000, 22000)  # down projection and fused gate+up
    assert d_ff.aligned and not d_ff.well_aligned and not d_ff.tile_friendly
    option = next(o for o in d_ff.better_options if o.value == 11008)
    assert option.step_gain_pct > 2 and option.gemm_gain_pct > 5
    # The whole-step prediction agrees: 8 more columns, a faster step.
    llama = preset("llama2-7b")
    assert (
        predict_step(A100, step_kernels(llama, 1)).step_time_s
        < predict_step(A100, step_kernels(odd, 1)).step_time_s
    )
    good = alignment_report(A100, llama, batch=1).dimension("d_ff")
    assert good.aligned and good.well_aligned and good.tile_friendly and good.wave_friendly


def test_alignment_report_flags_an_odd_vocab():
    cfg = preset("gpt2-small")  # vocab 50257: odd, the classic case for padding to 50304
    vocab = alignment_report(A100, cfg, batch=8).dimension("vocab_size")
    assert not vocab.aligned
    values = {o.value for o in vocab.better_options}
    assert {50304, 50240} <= values  # nearest multiples of 64 on each side
    assert all(o.gemm_gain_pct > 40 for o in vocab.better_options if o.value in {50304, 50240})
    report = alignment_report(A100, cfg, batch=8)
    assert json.loads(json.dumps(report.to_dict()))["dimensions"][4]["name"] == "vocab_size"
    with pytest.raises(UnknownNameError, match=r"unknown dimension 'width'; valid: d_model, d_ff"):
        report.dimension("width")
