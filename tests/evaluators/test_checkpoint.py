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
