"""Which measured regime a study's proxy sits in (`results.regimes`), as `validate` and `report` say."""

from __future__ import annotations

import pytest

from archsearch.results.regimes import (
    LENT_GPU,
    PUBLIC_GPU,
    RANKED,
    REGIMES,
    TINY_CPU,
    expectation,
    median_proxy,
    params_text,
    validation_regime,
)


def test_every_regime_names_the_command_and_date_behind_its_figures():
    for regime in REGIMES:
        assert "benchmarks/" in regime.source and "2026-" in regime.source, regime.name
    assert [r.name for r in RANKED] == [PUBLIC_GPU.name, LENT_GPU.name, TINY_CPU.name]


def test_a_tiny_cpu_study_is_told_the_tiny_regime_s_figures():
    text = expectation([2e5, 5e5, 1.9e6], [240_000] * 3)
    assert text.startswith("this study's proxy (500k parameters at 0.48 tokens per parameter)")
    assert f"regime of {TINY_CPU.name}" in text and "0.787 [0.65, 0.87]" in text
    assert TINY_CPU.source in text and PUBLIC_GPU.name not in text


def test_a_gpu_scale_proxy_with_billions_of_tokens_is_told_the_public_runs_figures():
    text = expectation([5e7, 2e8, 5e8], [5e9] * 3)
    assert "200M parameters at 25 tokens per parameter" in text
    assert f"regime of {PUBLIC_GPU.name}" in text and "0.945-0.991" in text and "0.787" not in text


def test_a_gpu_scale_proxy_at_under_a_token_per_parameter_sits_in_no_measured_regime():
    # examples/gpu.toml: 50M tokens for shapes of 50M-500M
    text = expectation([5e7, 2e8, 5e8], [5e7] * 3)
    assert "sits outside the regimes where a ranking was measured" in text
    assert "public GPU runs (48M-3.2B parameters, 2-670 tokens per parameter)" in text
    assert "60k-2M parameters, 0.12-4 tokens per parameter" in text and "archsearch validate" in text
    assert "a lent GPU (5.3M-43.3M parameters, 0.018-0.15 tokens per parameter)" in text


def test_a_gpu_proxy_of_tens_of_millions_at_a_tenth_of_a_token_is_told_the_lent_gpu_figures():
    text = expectation([8e6, 2e7, 4e7], [800_000] * 3)
    assert "20M parameters at 0.04 tokens per parameter" in text
    assert f"regime of {LENT_GPU.name}" in text and "0.56 [0.16, 0.80]" in text and "4x" in text
    assert LENT_GPU.source in text and "0.787" not in text


def test_without_recorded_tokens_size_alone_places_the_study():
    assert median_proxy([3e6, 1e6, 2e6], [None] * 3) == (2e6, None)
    assert "(200M parameters) sits in the regime of public GPU runs" in expectation([2e8], [None])
    with pytest.raises(ValueError, match="no trials"):
        median_proxy([], [])


def test_the_validation_line_says_its_figures_are_the_study_s_own():
    rows = [{"params_total": 4e5, "proxy_tokens": 240_000}, {"params_total": 8e5}]  # one stored before
    line = validation_regime({"multiplier": 10.0, "rows": rows})
    assert line.startswith("regime: the figures above are this study's own, its shapes retrained at 10x")
    assert f"regime of {TINY_CPU.name}" in line
    assert validation_regime({"multiplier": 10.0, "rows": []}).startswith("regime: no trial was retrained")
    # A report stored before its rows kept the proxy's tokens: the trials' own fill them in.
    rows = [{"number": 3, "params_total": 4e5}, {"number": 5, "params_total": 8e5}]
    old = {"multiplier": 10.0, "rows": rows}
    assert "(800k parameters) sits" in validation_regime(old)
    filled = validation_regime(old, {3: 240_000, 5: 240_000})  # 0.6 and 0.3 per parameter: the upper middle
    assert "(800k parameters at 0.6 tokens per parameter)" in filled


@pytest.mark.parametrize(("n", "text"), [(60e3, "60k"), (2e6, "2M"), (3.2e9, "3.2B"), (512, "512")])
def test_parameter_counts_are_written_as_the_docs_write_them(n, text):
    assert params_text(n) == text
