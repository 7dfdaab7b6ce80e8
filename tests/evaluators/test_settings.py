"""Training settings without torch: learning-rate schedules pinned at the points that matter, and
the choice of CPU threads."""

from __future__ import annotations

import dataclasses
import re

import pytest

from archsearch.evaluators.settings import (
    GEMM_MACS_PER_THREAD,
    SCHEDULES,
    TrainError,
    TrainSettings,
    choose_threads,
    free_cores,
    largest_gemm,
)
from archsearch.space.knobs import config_from_knobs

WARMUP, FLOOR = 0.1, 0.1
PROGRESS = [i / 100 for i in range(101)]


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_every_schedule_warms_up_linearly_to_the_peak(name):
    schedule = SCHEDULES[name]
    assert schedule(0.0, WARMUP, FLOOR) == pytest.approx(0.0, abs=1e-6)
    assert schedule(WARMUP / 2, WARMUP, FLOOR) == pytest.approx(0.5)
    assert schedule(WARMUP, WARMUP, FLOOR) == pytest.approx(1.0)


@pytest.mark.parametrize(("name", "end"), [("cosine", FLOOR), ("wsd", FLOOR), ("constant", 1.0)])
def test_where_each_schedule_ends(name, end):
    assert SCHEDULES[name](1.0, WARMUP, FLOOR) == pytest.approx(end)


def test_constant_stays_at_the_peak_after_warm_up():
    after = [SCHEDULES["constant"](p, WARMUP, FLOOR) for p in PROGRESS if p >= WARMUP]
    assert after == [1.0] * len(after)


def test_constant_is_cosine_with_no_decay():
    """The fidelity benchmark's constant-rate runs were first measured as cosine with floor 1.0."""
    for p in PROGRESS:
        assert SCHEDULES["constant"](p, WARMUP, FLOOR) == SCHEDULES["cosine"](p, WARMUP, 1.0)


# --- CPU threads ---
# examples/tiny.toml's smallest shape (d_model 64, aspect 64, d_ff_ratio 2) at its proxy's batch
# of 16 x 128 tokens: the case whose thread counts were measured.
SMALLEST = config_from_knobs(d_model=64, n_layers=1, d_ff=128, head_dim=64, vocab_size=256, seq_len=128)
TOKENS = 16 * 128


def test_the_largest_gemm_is_tokens_by_d_model_by_the_widest_matrix():
    assert largest_gemm(SMALLEST, TOKENS) == 2048 * 64 * 256  # the LM head: vocab 256 > d_ff 128
    wide = dataclasses.replace(SMALLEST, d_ff=1024)
    assert largest_gemm(wide, TOKENS) == 2048 * 64 * 1024  # the MLP
    gpt2 = config_from_knobs(d_model=768, n_layers=12, head_dim=64, vocab_size=50257, seq_len=1024)
    assert largest_gemm(gpt2, 1024) == 1024 * 768 * 50257


def test_one_thread_per_gemm_share_at_most_the_free_cores():
    square = config_from_knobs(d_model=64, n_layers=1, d_ff=64, head_dim=64, vocab_size=64, seq_len=8)

    def tokens_for(shares: int) -> int:
        """The fewest tokens whose largest GEMM (tokens x 64 x 64) has `shares` threads' worth."""
        return -(-shares * GEMM_MACS_PER_THREAD // (64 * 64))

    assert choose_threads(square, 16, cores=16) == 1  # far too small to share
    assert choose_threads(square, tokens_for(2) - 1, cores=16) == 1
    assert choose_threads(square, tokens_for(2), cores=16) == 2  # enough for two shares
    assert choose_threads(square, tokens_for(7), cores=16) == 7
    assert choose_threads(square, tokens_for(1000), cores=16) == 16  # never more than the free cores
    assert choose_threads(square, tokens_for(1000), cores=1) == 1


def test_issue_9s_shape_trains_on_one_thread_on_a_busy_machine_and_two_on_an_idle_one():
    assert choose_threads(SMALLEST, TOKENS, cores=free_cores(2, load=1.0)) == 1
    assert choose_threads(SMALLEST, TOKENS, cores=free_cores(2, load=0.0)) == 2
    assert choose_threads(SMALLEST, 4 * 32, cores=2) == 1  # a micro-batch of 128 tokens: too small


def test_large_shapes_use_every_free_core():
    gpt2 = config_from_knobs(d_model=768, n_layers=12, head_dim=64, vocab_size=50257, seq_len=1024)
    assert choose_threads(gpt2, 8 * 1024, cores=64) == 64
    assert choose_threads(gpt2, 8 * 1024, cores=free_cores(64, load=40.0)) == 24


@pytest.mark.parametrize(
    ("cores", "load", "free"),
    [(2, 0.0, 2), (2, 0.2, 2), (2, 0.3, 1), (2, 1.0, 1), (2, 5.0, 1), (16, 3.7, 12), (1, 0.0, 1)],
)
def test_a_core_is_free_only_when_nearly_idle(cores, load, free):
    assert free_cores(cores, load) == free


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, "2"])
def test_threads_must_be_a_positive_integer(threads):
    with pytest.raises(TrainError, match=f"threads must be a positive integer .*, got {threads!r}"):
        TrainSettings(tokens=10, threads=threads)
    assert TrainSettings(tokens=10).threads is None and TrainSettings(tokens=10, threads=3).threads == 3


@pytest.mark.parametrize(
    "budget, message",
    [
        (
            dict(tokens=10**23),
            "tokens budget a 24-digit number is past 2**63 - 1, the most the database stores",
        ),
        (dict(tokens=10**5000), "tokens budget a 5001-digit number is past 2**63 - 1"),
        (dict(flops=1e30), "flops budget 1e+30 is past 1e27, 10x the largest training runs published"),
        (dict(seconds=1e300), "seconds budget 1e+300 is past a year"),
    ],
    ids=["tokens", "5000-digit-tokens", "flops", "seconds"],
)
def test_a_budget_that_never_ends_is_refused(budget, message):
    """`train --seconds 1e300` and `--tokens 1e23` trained until killed."""
    with pytest.raises(TrainError, match=f"^{re.escape(message)}"):
        TrainSettings(**budget)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(tokens=1000, warmup_tokens=-1), "warmup_tokens must be in 0..2**63 - 1, got -1"),
        (dict(tokens=1000, warmup_tokens=1.5), "warmup_tokens must be a whole number of tokens, got 1.5"),
        (dict(tokens=1000, warmup_tokens=True), "warmup_tokens must be a whole number of tokens, got True"),
        (dict(seconds=10.0, warmup_tokens=100), "warmup_tokens needs a tokens or flops budget, not seconds"),
    ],
    ids=["negative", "fraction", "bool", "seconds-budget"],
)
def test_a_bad_warmup_in_tokens_is_refused(settings, message):
    with pytest.raises(TrainError, match=f"^{re.escape(message)}$"):
        TrainSettings(**settings)


def test_only_the_constant_schedule_with_a_fixed_warmup_is_budget_free():
    assert TrainSettings(tokens=1000, schedule="constant", warmup_tokens=100).budget_free
    assert TrainSettings(tokens=1000, schedule="constant", warmup=0.0).budget_free
    assert not TrainSettings(tokens=1000, schedule="constant").budget_free  # warm-up a fraction
    assert not TrainSettings(tokens=1000, schedule="cosine", warmup_tokens=100).budget_free
    assert not TrainSettings(seconds=10.0, schedule="constant", warmup=0.0).budget_free
