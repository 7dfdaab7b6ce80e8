"""The scaled pick: closest to the target, fastest in the roofline model; alignment gains priced."""

from __future__ import annotations

import pytest

from archsearch.errors import ArchsearchError
from archsearch.evaluators.hardware import device_model
from archsearch.results.scale_ranking import ScaleRequest, alignment_gains, scale_config, score
from archsearch.space import ArchConfig, param_counts, preset

LLAMA = ArchConfig(
    vocab_size=256, seq_len=32, d_model=96, n_layers=3, n_heads=6, n_kv_heads=2, head_dim=16, d_ff=256
)


@pytest.fixture(scope="module")
def scaled():
    return scale_config(LLAMA, ScaleRequest(1_300_000_000, "h100-sxm", vocab_size=50257))


def test_the_pick_is_within_the_band_and_the_fastest_there(scaled):
    chosen = scaled.chosen
    assert abs(chosen.params / 1_300_000_000 - 1) <= 0.02
    assert chosen.config.vocab_size == 50304 and chosen.config.seq_len == 2048
    assert chosen.tokens_per_second == max(s.tokens_per_second for s in scaled.closest)
    assert scaled.considered >= len(scaled.closest) and 0 < chosen.mfu < 1


def test_alignment_gains_are_reported(scaled):
    gains = {g.dimension: g for g in scaled.gains}
    assert (gains["vocab_size"].naive, gains["vocab_size"].aligned) == (50257, 50304)
    assert gains["d_model"].aligned == scaled.chosen.config.d_model
    for gain in gains.values():  # every aligned width is faster in the model than its naive one
        assert gain.gain_pct > 0 and gain.naive_step_s > gain.aligned_step_s


def test_llamas_d_ff_gain_against_naive_rounding():
    model, cfg = device_model("h100-sxm"), preset("llama2-7b")
    request = ScaleRequest(param_counts(cfg).total, "h100-sxm", seq_len=4096)
    (gain,) = alignment_gains(model, LLAMA, score(model, cfg, 1), request, 1)  # vocab, d_model exact
    assert (gain.dimension, gain.naive, gain.aligned) == ("d_ff", 10923, 11008) and gain.gain_pct > 0


def test_a_target_nothing_reaches_is_an_error():
    with pytest.raises(ArchsearchError, match="has 1,000 parameters within 10%"):
        scale_config(LLAMA, ScaleRequest(1000, "h100-sxm"))


def test_an_unknown_device_is_refused():
    with pytest.raises(ArchsearchError, match="unknown accelerator 'tpu'; valid: a100-80gb"):
        ScaleRequest(10**9, "tpu")


def test_llama2_7b_modelled_mfu_on_one_h100():
    # Llama-2-7B at seq 4096 (the preset), MFU over causal FLOPs (what the kernels compute). The
    # bare roofline's step is the kernel sum (the eager step's memory traffic included, no launch
    # gaps or framework overhead): 42.9% at micro-batch 1, 53.3% at 4 (55% and 65.6% with the
    # fused estimate of the bytes, before 2026-11-27). With the constants fitted to real H100
    # steps (catalogue.FITTED) the modelled eager step reads 39.5% and 50.5% (44% and 59%
    # before); published H100 training of 7B models, with fused kernels, reports ~40-55%. Pinned
    # as found, not tuned.
    cfg = preset("llama2-7b")
    bare = device_model("h100-sxm", fitted=False)
    assert score(bare, cfg, 1).mfu == pytest.approx(0.429, abs=0.005)
    assert score(bare, cfg, 4).mfu == pytest.approx(0.533, abs=0.005)
    model = device_model("h100-sxm")
    assert score(model, cfg, 1).mfu == pytest.approx(0.395, abs=0.005)
    assert score(model, cfg, 4).mfu == pytest.approx(0.505, abs=0.005)


def test_mfu_counts_the_causal_flops_so_long_context_stays_under_the_peak():
    # Causal kernels skip the masked half of the attention square: at 131k tokens a 1B shape's
    # full-square count is 1.8x its causal one, and over it the modelled MFU read 114%.
    scaled = scale_config(preset("llama2-7b"), ScaleRequest(10**9, "h100-sxm", seq_len=131072))
    assert 0.3 < scaled.chosen.mfu < 1


def test_memory_notes_say_what_does_not_fit_and_what_would():
    cfg = preset("llama2-7b")
    one = scale_config(cfg, ScaleRequest(param_counts(cfg).total, "h100-sxm", seq_len=4096, batch=1))
    # 16 bytes a parameter unsharded (108 GB) is over the H100's 80 GB beside the activations.
    assert one.state_bytes == 16 * one.chosen.params > one.memory_bytes == 80 * 10**9
    free = one.memory_bytes - one.activation_bytes
    (note,) = one.memory_notes()
    assert note.endswith(f"when sharded over {-(-one.state_bytes // free)} or more GPUs (FSDP, ZeRO)")
    big = scale_config(cfg, ScaleRequest(param_counts(cfg).total, "h100-sxm", seq_len=4096, batch=64))
    (note,) = big.memory_notes()
    per_sequence = big.activation_bytes // 64
    assert f"give --batch {big.memory_bytes // per_sequence} or less" in note
    small = scale_config(cfg, ScaleRequest(10**9, "h100-sxm"))
    assert small.memory_notes() == []
