"""A loaded token dataset: its training and validation splits, memory-mapped, and the batches
drawn from them. Plain data, cheap to pickle across processes; `evaluators.data.load_dataset`
finds, builds and checks one.

Losses are in nats per token; `bits_per_byte` converts them for byte-level data, where bits per
byte compares across tokenizers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from archsearch.errors import ArchsearchError
from archsearch.registry import Registry

if TYPE_CHECKING:
    import torch


# Dtypes of pre-tokenized files; uint16 is nanoGPT's (GPT-2's 50257 ids fit). Little-endian
# explicitly, as nanoGPT writes them on x86 and ARM, so a file reads the same on any host.
TOKEN_DTYPES: Registry[np.dtype[Any]] = Registry("token dtype")
TOKEN_DTYPES.register("uint8", np.dtype("<u1"))
TOKEN_DTYPES.register("uint16", np.dtype("<u2"))
TOKEN_DTYPES.register("uint32", np.dtype("<u4"))


class DataError(ArchsearchError, ValueError):
    """A dataset is missing, empty, malformed or too small; the message names the file."""


def bits_per_byte(nats_per_token: float, bytes_per_token: float) -> float:
    """Convert a loss in nats per token to bits per byte of the underlying text.

    Args:
        nats_per_token: mean cross-entropy, natural log.
        bytes_per_token: text bytes one token stands for on average; 1 for byte-level data.

    Raises:
        ValueError: `bytes_per_token` is not positive.
    """
    if bytes_per_token <= 0:
        raise ValueError(f"bytes_per_token must be positive, got {bytes_per_token}")
    return nats_per_token / math.log(2) / bytes_per_token


@dataclass(frozen=True)
class TokenSpan:
    """A contiguous run of token ids in a file, memory-mapped when opened, never read whole."""

    path: str  # the file holding the ids, absolute: a worker may run in another directory
    dtype: str  # a TOKEN_DTYPES name
    offset: int  # index of the first token in the file, in tokens
    length: int  # tokens

    def open(self) -> np.memmap:
        """A read-only memory map of the span, shape (length,)."""
        dtype = TOKEN_DTYPES[self.dtype]
        return np.memmap(
            self.path, dtype=dtype, mode="r", offset=self.offset * dtype.itemsize, shape=(self.length,)
        )


@dataclass(frozen=True)
class Dataset:
    """A tokenized corpus split into training and validation tokens. Plain data: cheap to pickle.

    Build one with `evaluators.data.load_dataset`. Tokens are read by memory-mapping `train` or `val`
    per batch.
    """

    name: str  # short label: "stdlib-py3.11" or the file or folder name
    source: str  # the resolved path the tokens came from
    vocab_size: int  # token ids are in [0, vocab_size)
    fingerprint: str  # "<16 hex>-v<vocab_size>"; losses compare only on equal fingerprints
    bytes_per_token: float | None  # 1.0 for byte-level text; None when unknown (pre-tokenized)
    train: TokenSpan
    val: TokenSpan

    @property
    def n_train_tokens(self) -> int:
        return self.train.length

    @property
    def n_val_tokens(self) -> int:
        return self.val.length

    def to_dict(self) -> dict[str, Any]:
        """What a training result records about its data: plain JSON values."""
        return {
            "name": self.name,
            "source": self.source,
            "vocab_size": self.vocab_size,
            "n_train_tokens": self.n_train_tokens,
            "n_val_tokens": self.n_val_tokens,
            "fingerprint": self.fingerprint,
            "bytes_per_token": self.bytes_per_token,
        }

    def bits_per_byte(self, nats_per_token: float) -> float | None:
        """`nats_per_token` in bits per byte; None when the bytes per token are unknown."""
        if self.bytes_per_token is None:
            return None
        return bits_per_byte(nats_per_token, self.bytes_per_token)

    def unigram_loss(self) -> float:
        """The held-out loss (nats per token) of a model that learned only how often each token
        occurs: the cross-entropy of the validation split under the training split's token
        frequencies (add-one smoothed). A language model stuck at this loss has learned nothing
        of context: a stalled run, not a bad shape (`search.worker` retries such runs)."""
        counts = np.bincount(self.train.open(), minlength=self.vocab_size)[: self.vocab_size] + 1.0
        val = np.bincount(self.val.open(), minlength=self.vocab_size)[: self.vocab_size]
        log_p = np.log(counts / counts.sum())
        return float(-(val * log_p).sum() / val.sum())

    def check_seq_len(self, seq_len: int) -> None:
        """Check that both splits hold at least one window of `seq_len` inputs plus its target.

        Raises:
            DataError: `seq_len` is not a positive integer or a split has fewer than
                `seq_len + 1` tokens.
        """
        self._check_window("train", seq_len)
        self._check_window("validation", seq_len)

    def _check_window(self, split: str, seq_len: int) -> None:
        check_positive("seq_len", seq_len)
        span = self.train if split == "train" else self.val
        if span.length < seq_len + 1:
            raise DataError(
                f"{self.name}: the {split} split has {span.length} tokens, too few for "
                f"seq_len={seq_len} (needs at least {seq_len + 1}); use a shorter seq_len or more data"
            )

    def train_batches(
        self, batch_size: int, seq_len: int, seed: int, device: str | torch.device = "cpu"
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """An endless stream of random training batches, the same stream for the same seed.

        Each row is a window at a uniformly random offset of the training split; `y` is `x`
        shifted by one token. Checked here, before the first batch, so a bad size fails at once.

        Args:
            batch_size: rows per batch.
            seq_len: tokens per row.
            seed: seeds a `numpy.random.Generator` that draws the offsets.
            device: where the tensors go.

        Returns:
            An iterator of `(x, y)`, each an int64 tensor of shape (batch_size, seq_len).

        Raises:
            DataError: a size is not a positive integer or the training split is too small.
        """
        check_positive("batch_size", batch_size)
        self._check_window("train", seq_len)
        rng = np.random.default_rng(seed)
        high = self.train.length - seq_len  # last valid offset + 1: y's window must fit too

        def stream() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            while True:
                starts = rng.integers(0, high, size=batch_size)
                # Re-mapped per batch, as nanoGPT's get_batch does: pages a long-lived memmap has
                # touched keep counting as the process's memory (stackoverflow.com/q/45132940).
                yield _batch(self.train.open(), starts, seq_len, device)

        return stream()

    def val_batches(
        self, batch_size: int, seq_len: int, count: int, device: str | torch.device = "cpu"
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A fixed set of validation batches: the same tokens on every call, for every candidate.

        The `count * batch_size` windows are evenly spaced over the validation split rather
        than drawn at random: no seed is needed for determinism, and spreading them over the whole
        split (stratified sampling) gives a lower-variance loss than random offsets.

        Args:
            batch_size: rows per batch.
            seq_len: tokens per row.
            count: batches returned.
            device: where the tensors go.

        Returns:
            `count` pairs `(x, y)`, each an int64 tensor of shape (batch_size, seq_len),
            `y` being `x` shifted by one token.

        Raises:
            DataError: a size is not a positive integer or the validation split is too small.
        """
        check_positive("batch_size", batch_size)
        check_positive("count", count)
        self._check_window("validation", seq_len)
        last = self.val.length - seq_len - 1  # last valid offset
        starts = np.linspace(0, last, num=count * batch_size).round().astype(np.int64)
        tokens = self.val.open()
        return [_batch(tokens, row, seq_len, device) for row in starts.reshape(count, batch_size)]


def _batch(
    tokens: np.ndarray, starts: np.ndarray, seq_len: int, device: str | torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets for windows at `starts`: each (len(starts), seq_len) int64 on `device`."""
    import torch

    # One gather of seq_len + 1 tokens per row reads each window once; a memmap reads only the
    # pages the indices touch. int64 because embeddings and cross_entropy index with it.
    window = tokens[starts[:, None] + np.arange(seq_len + 1)].astype(np.int64)  # (B, T+1)
    x = torch.from_numpy(np.ascontiguousarray(window[:, :-1]))  # (B, T)
    y = torch.from_numpy(np.ascontiguousarray(window[:, 1:]))  # (B, T)
    target = torch.device(device)
    if target.type == "cuda":
        # Pinned host memory lets the copy run asynchronously, overlapping compute (nanoGPT).
        return x.pin_memory().to(target, non_blocking=True), y.pin_memory().to(target, non_blocking=True)
    return x.to(target), y.to(target)


def check_positive(name: str, value: Any) -> None:
    """Refuse a size that is not a positive integer (a bool is not one), naming it."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise DataError(f"{name} must be a positive integer, got {value!r}")
