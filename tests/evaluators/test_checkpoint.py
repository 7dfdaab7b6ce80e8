"""A run with a checkpoint, stopped and started again, ends where one run never stopped ends."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from archsearch.evaluators.data import load_dataset
from archsearch.evaluators.trainer import Checkpoint, TrainError, TrainSettings, train
from archsearch.space import ArchConfig

TINY = ArchConfig(
    vocab_size=256, seq_len=32, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64
)
# 60 steps of 4 x 32 tokens, evaluated 3 times; one thread and fp32, so two runs agree to the bit.
SETTINGS = TrainSettings(
    tokens=60 * 128, batch_size=4, evals=3, eval_batches=2, precision="fp32", threads=1, schedule="cosine"
)


@pytest.fixture(scope="module")
def corpus():
    return load_dataset(None, max_corpus_bytes=300_000)


@pytest.fixture(scope="module")
def whole(corpus):
    return train(TINY, corpus, SETTINGS)


def stop_after(tokens: int):
    """A progress callback that stops the run once it has trained `tokens` (as Ctrl-C would)."""

    def progress(done: int, total: int, loss: float, rate: float) -> None:
        if done >= tokens:
            raise KeyboardInterrupt

    return progress


@pytest.mark.parametrize("stop_at", [25 * 128, 45 * 128])  # before and after an evaluation
def test_a_stopped_run_goes_on_to_the_same_losses(corpus, whole, tmp_path, stop_at):
    keep = Checkpoint(tmp_path / "run.pt", every_s=0)  # written at every sync (10 steps)
    with pytest.raises(KeyboardInterrupt):
        train(TINY, corpus, SETTINGS, progress=stop_after(stop_at), checkpoint=keep)
    assert keep.path.exists()
    resumed = train(TINY, corpus, SETTINGS, checkpoint=keep)
    assert resumed.status == "complete"
    assert (resumed.steps, resumed.tokens) == (whole.steps, whole.tokens)
    assert resumed.val_curve == whole.val_curve
    assert resumed.loss_curve == whole.loss_curve
    assert resumed.val_loss == whole.val_loss
    assert not keep.path.exists()  # the run ended: its state is gone, its result is the caller's


def test_another_runs_checkpoint_is_set_aside(corpus, whole, tmp_path, caplog):
    keep = Checkpoint(tmp_path / "run.pt", every_s=0)
    other = dataclasses.replace(SETTINGS, seed=7)
    with pytest.raises(KeyboardInterrupt):
        train(TINY, corpus, other, progress=stop_after(30 * 128), checkpoint=keep)
    with caplog.at_level(logging.WARNING):
        result = train(TINY, corpus, SETTINGS, checkpoint=keep)
    assert "belongs to another run" in caplog.text
    assert result.val_curve == whole.val_curve


def test_an_unreadable_checkpoint_is_set_aside(corpus, whole, tmp_path, caplog):
    keep = Checkpoint(tmp_path / "run.pt")
    keep.path.write_bytes(b"not a checkpoint")
    with caplog.at_level(logging.WARNING):
        result = train(TINY, corpus, SETTINGS, checkpoint=keep)
    assert "cannot be read" in caplog.text
    assert result.val_curve == whole.val_curve and not keep.path.exists()


def test_a_failed_run_leaves_no_checkpoint(corpus, tmp_path):
    keep = Checkpoint(tmp_path / "run.pt", every_s=0)
    result = train(TINY, corpus, dataclasses.replace(SETTINGS, lr=1e9), checkpoint=keep)
    assert result.status == "failed" and "non-finite" in result.reason
    assert not keep.path.exists()


@pytest.mark.parametrize("every", [-1.0, float("nan"), float("inf")])
def test_a_bad_interval_is_refused(tmp_path, every):
    with pytest.raises(TrainError, match="checkpoint interval"):
        Checkpoint(tmp_path / "run.pt", every_s=every)


# The constant schedule with a warm-up in tokens: the rate at each step is the same at any budget.
FREE = dataclasses.replace(SETTINGS, schedule="constant", warmup_tokens=10 * 128)


def test_a_kept_run_resumed_to_twice_the_budget_ends_as_one_long_run(corpus, tmp_path):
    longer = dataclasses.replace(FREE, tokens=2 * FREE.tokens)
    straight = train(TINY, corpus, longer)
    keep = Checkpoint(tmp_path / "run.pt", keep=True)
    short = train(TINY, corpus, FREE, checkpoint=keep)
    assert short.status == "complete" and keep.path.exists()  # the final state stays
    resumed = train(TINY, corpus, longer, checkpoint=keep)
    assert (resumed.steps, resumed.tokens) == (straight.steps, straight.tokens)
    assert (resumed.resumed_tokens, short.resumed_tokens, straight.resumed_tokens) == (short.tokens, 0, 0)
    assert resumed.val_loss == pytest.approx(straight.val_loss, rel=1e-6, abs=0)
    assert resumed.val_loss != short.val_loss
    # The short run's evaluations stay on the curve; the long run's points after them follow.
    assert resumed.val_curve[: len(short.val_curve)] == short.val_curve
    assert resumed.val_curve[-1] == pytest.approx(straight.val_curve[-1], rel=1e-6)
    assert [t for t, _ in resumed.val_curve] == sorted({t for t, _ in resumed.val_curve})


def test_a_kept_final_state_rerun_at_its_budget_gives_its_result(corpus, tmp_path):
    keep = Checkpoint(tmp_path / "run.pt", keep=True)
    first = train(TINY, corpus, FREE, checkpoint=keep)
    again = train(TINY, corpus, FREE, checkpoint=keep)
    assert again.val_curve == first.val_curve and again.steps == first.steps


def test_a_state_past_the_budget_is_set_aside(corpus, tmp_path, caplog):
    keep = Checkpoint(tmp_path / "run.pt", keep=True)
    train(TINY, corpus, dataclasses.replace(FREE, tokens=2 * FREE.tokens), checkpoint=keep)
    with caplog.at_level(logging.WARNING):
        result = train(TINY, corpus, FREE, checkpoint=keep)
    assert "past this run's" in caplog.text
    assert result.val_curve == train(TINY, corpus, FREE).val_curve and result.resumed_tokens == 0


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_a_decaying_run_is_not_resumed_to_another_budget(corpus, tmp_path, caplog, schedule):
    settings = dataclasses.replace(FREE, schedule=schedule)
    assert not settings.budget_free
    keep = Checkpoint(tmp_path / "run.pt", keep=True)
    train(TINY, corpus, settings, checkpoint=keep)
    longer = dataclasses.replace(settings, tokens=2 * settings.tokens)
    with caplog.at_level(logging.WARNING):
        resumed = train(TINY, corpus, longer, checkpoint=keep)
    assert "belongs to another run" in caplog.text  # trained afresh
    assert resumed.val_curve == train(TINY, corpus, longer).val_curve


def test_a_fractional_warmup_is_not_budget_free():
    assert not dataclasses.replace(SETTINGS, schedule="constant").budget_free
    assert dataclasses.replace(SETTINGS, schedule="constant", warmup=0.0).budget_free
    assert FREE.budget_free


def test_a_kept_state_costs_twelve_bytes_per_parameter(corpus, tmp_path):
    wide = dataclasses.replace(TINY, d_model=128, n_heads=8, n_kv_heads=8, d_ff=512)
    keep = Checkpoint(tmp_path / "run.pt", keep=True)
    result = train(wide, corpus, dataclasses.replace(FREE, tokens=10 * 128, evals=1), checkpoint=keep)
    per_param = keep.path.stat().st_size / result.params
    assert 12 <= per_param < 12.5  # weights and two AdamW moments in fp32, plus a little bookkeeping
