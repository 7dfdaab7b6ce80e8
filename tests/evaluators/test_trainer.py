from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from archsearch.errors import ArchsearchError
from archsearch.evaluators import trainer
from archsearch.evaluators.data import load_dataset
from archsearch.evaluators.model import ProxyLM
from archsearch.evaluators.settings import choose_threads
from archsearch.evaluators.trainer import TrainError, TrainSettings, param_groups, train
from archsearch.space import ArchConfig, flop_counts, param_counts, preset

TINY = ArchConfig(
    vocab_size=256, seq_len=32, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64
)
FAST = dict(batch_size=4, evals=2, eval_batches=2)


@pytest.fixture(scope="module")
def corpus():
    return load_dataset(None, max_corpus_bytes=300_000)


def test_training_lowers_the_loss_and_reports_everything(corpus):
    result = train(TINY, corpus, TrainSettings(tokens=20_000, **FAST))
    assert result.status == "complete" and result.reason is None
    assert result.val_loss < math.log(256) - 1.0  # well below uniform bytes
    assert result.bits_per_byte == pytest.approx(result.val_loss / math.log(2))
    steps = math.ceil(20_000 / 128)  # 4 sequences of 32 tokens per step
    assert (result.steps, result.tokens) == (steps, steps * 128)
    assert [t for t, _ in result.val_curve] == [math.ceil(steps / 2) * 128, steps * 128]
    assert result.loss_curve[0][1] > result.loss_curve[-1][1]
    assert result.precision in ("bf16", "fp32")
    assert result.corpus_fingerprint == corpus.fingerprint
    assert result.tokens_per_second > 0 and result.achieved_flops_per_second > 0
    expected = flop_counts(TINY).train_causal * result.tokens / result.achieved_flops_per_second
    assert expected <= result.wall_time_s  # training time is part of the wall time
    assert 0 < result.mfu == pytest.approx(result.achieved_flops_per_second / result.peak_flops_per_second)
    assert result.params == param_counts(TINY).total
    assert ArchConfig.from_dict(result.config) == TINY


def test_same_seed_same_loss(corpus):
    settings = TrainSettings(tokens=8_000, precision="fp32", **FAST)
    a, b = train(TINY, corpus, settings), train(TINY, corpus, settings)
    assert a.val_loss == pytest.approx(b.val_loss, abs=1e-4)
    assert a.loss_curve == b.loss_curve
    c = train(TINY, corpus, dataclasses.replace(settings, seed=1))
    assert c.val_loss != a.val_loss


def test_bf16_is_reported_when_asked(corpus):
    result = train(TINY, corpus, TrainSettings(tokens=2_000, precision="bf16", **FAST))
    assert result.status == "complete" and result.precision == "bf16"


def test_flops_budget_becomes_tokens(corpus):
    per_token = flop_counts(TINY).train
    result = train(TINY, corpus, TrainSettings(flops=per_token * 4_096, **FAST))
    assert result.tokens == 4_096


def test_flops_budget_below_one_step_runs_one_step(corpus):
    result = train(TINY, corpus, TrainSettings(flops=1.0, **FAST))
    assert (result.status, result.steps, result.tokens) == ("complete", 1, 128)


def test_seconds_budget_stops_on_time(corpus):
    result = train(TINY, corpus, TrainSettings(seconds=1.0, **FAST))
    assert result.status == "complete"
    assert result.tokens > 0
    assert result.tokens / result.tokens_per_second == pytest.approx(1.0, abs=0.5)


def test_nan_loss_fails_the_run_not_the_process(corpus):
    # An absurd learning rate blows the weights up; the loss turns to inf / NaN within steps.
    result = train(TINY, corpus, TrainSettings(tokens=40_000, lr=1e30, precision="fp32", **FAST))
    assert result.status == "failed"
    assert re.search(r"(training|validation) loss is (nan|inf)", result.reason)
    assert result.val_loss is None


def test_config_too_large_fails_before_allocating(corpus):
    huge = dataclasses.replace(preset("llama2-13b"), vocab_size=256, seq_len=256)
    result = train(huge, corpus, TrainSettings(tokens=1_000, **FAST))
    assert result.status == "failed"
    too_large = r"config too large for (cpu|cuda:\d+): needs ~\d+\.\d GiB, has \d+\.\d GiB"
    assert re.match(too_large, result.reason)
    assert result.tokens == 0


def test_out_of_memory_fails_the_run(corpus, monkeypatch):
    def oom(self, idx):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(ProxyLM, "forward", oom)
    result = train(TINY, corpus, TrainSettings(tokens=1_000, **FAST))
    assert result.status == "failed"
    assert result.reason.startswith("out of memory after 0 steps: CUDA out of memory")


def test_other_errors_propagate(corpus, monkeypatch):
    def bug(self, idx):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(ProxyLM, "forward", bug)
    with pytest.raises(ZeroDivisionError):
        train(TINY, corpus, TrainSettings(tokens=1_000, **FAST))


def test_a_run_with_one_thread_trains_on_one_and_restores_the_count(corpus, two_threads):
    seen = []
    result = train(
        TINY, corpus, TrainSettings(tokens=2_000, threads=1, **FAST),
        progress=lambda *_: seen.append(torch.get_num_threads()),
    )  # fmt: skip
    assert result.status == "complete"
    assert seen and set(seen) == {1}  # every progress report came from inside the loop
    assert result.threads == 1 and result.to_dict()["threads"] == 1
    assert torch.get_num_threads() == 2


def test_without_threads_the_count_is_chosen_from_the_shape_and_the_free_cores(
    corpus, two_threads, monkeypatch
):
    monkeypatch.setattr(trainer, "available_cores", lambda: 2)
    result = train(TINY, corpus, TrainSettings(tokens=500, **FAST))
    assert result.threads == choose_threads(TINY, 4 * 32, cores=2) == 1  # a tiny shape: one thread
    assert torch.get_num_threads() == 2


def test_the_thread_count_is_restored_when_training_raises(corpus, two_threads, monkeypatch):
    def bug(self, idx):
        assert torch.get_num_threads() == 1
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(ProxyLM, "forward", bug)
    with pytest.raises(ZeroDivisionError):
        train(TINY, corpus, TrainSettings(tokens=1_000, threads=1, **FAST))
    assert torch.get_num_threads() == 2


def test_on_eval_can_prune(corpus):
    seen = []

    def prune(tokens: int, loss: float) -> bool:
        seen.append((tokens, loss))
        return True

    result = train(
        TINY, corpus, TrainSettings(tokens=8_192, batch_size=4, evals=4, eval_batches=2), on_eval=prune
    )
    assert result.status == "pruned"
    assert result.reason == f"pruned after 2048 tokens at val_loss {seen[0][1]:.4f}"
    assert seen == list(result.val_curve) and result.tokens == 2048
    assert result.val_loss == seen[0][1]


def test_learning_rate_scales_with_width():
    narrow, wide = ProxyLM(TINY), ProxyLM(dataclasses.replace(TINY, d_model=128, n_heads=8, n_kv_heads=4))
    n_groups = param_groups(narrow, lr=1e-3, base_width=32, weight_decay=0.1)
    w_groups = param_groups(wide, lr=1e-3, base_width=32, weight_decay=0.1)
    assert n_groups[0]["lr"] == 1e-3 and w_groups[0]["lr"] == pytest.approx(0.25e-3)
    assert n_groups[1]["lr"] == w_groups[1]["lr"] == 1e-3  # embeddings and norms keep the base rate
    assert w_groups[1]["weight_decay"] == 0.0
    hidden = {id(p) for p in w_groups[0]["params"]}
    assert id(wide.tok_emb.weight) not in hidden and id(wide.blocks[0].mlp.up.weight) in hidden
    total = sum(p.numel() for g in w_groups for p in g["params"])
    assert total == sum(p.numel() for p in wide.parameters())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "give exactly one budget"),
        ({"tokens": 10, "seconds": 1.0}, "give exactly one budget"),
        ({"tokens": 0}, "the budget must be positive"),
        ({"tokens": 10, "schedule": "linear"}, "schedule 'linear' is unknown; valid: cosine, wsd, constant"),
        ({"tokens": 10, "precision": "fp8"}, "precision 'fp8' is unknown"),
        ({"tokens": 10, "batch_size": 0}, "batch_size must be positive"),
        ({"tokens": 10, "warmup": 1.5}, "warmup must be a fraction"),
        ({"seconds": math.inf}, "seconds must be a finite number, got inf"),
        ({"flops": math.nan}, "flops must be a finite number, got nan"),
        ({"tokens": 10, "lr": math.nan}, "lr must be a finite number"),
        ({"tokens": 10, "lr": -1.0}, "lr must be positive, got -1.0"),
        ({"tokens": 10, "grad_clip": 0.0}, "grad_clip must be positive"),
        ({"tokens": 10, "min_lr": 2.0}, r"min_lr must be a fraction of the peak in \[0, 1\]"),
        ({"tokens": 10, "weight_decay": -0.1}, "weight_decay must be >= 0"),
        ({"tokens": 10, "device": "tpu"}, "device 'tpu' is unknown; valid: cpu, cuda, cuda:N, auto"),
        ({"tokens": 10, "device": "cuda:x"}, "device 'cuda:x' is unknown"),
    ],
)
def test_bad_settings(kwargs, match):
    with pytest.raises(TrainError, match=match):
        TrainSettings(**kwargs)


def test_vocab_larger_than_config_is_an_error(corpus):
    with pytest.raises(TrainError, match="data has vocab_size=256 but the config only 64"):
        train(dataclasses.replace(TINY, vocab_size=64), corpus, TrainSettings(tokens=100, **FAST))


def test_cuda_without_cuda_is_an_error(corpus):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ArchsearchError, match="no CUDA device"):
        train(TINY, corpus, TrainSettings(tokens=100, device="cuda", **FAST))


def test_a_batch_past_memory_says_how_much_in_a_short_number():
    """`train --batch-size 1e20` said `needs ~4125976562500000256.0 GiB`."""
    from archsearch.evaluators.device import DeviceInfo
    from archsearch.evaluators.trainer import too_large
    from archsearch.space import preset

    cfg = preset("byte-1m")
    info = DeviceInfo("cpu", None, "a CPU", 2, 2, "AVX2", "AVX2", "2.13.0", None, memory_bytes=2**30)
    assert re.search(r"needs ~[0-9.]+e\+[0-9]+ GiB, has 1\.0 GiB$", too_large(cfg, 10**20, cfg.seq_len, info))
