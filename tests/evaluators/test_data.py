from __future__ import annotations

import json
import math
import os
import pickle
import re
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from archsearch.errors import ArchsearchError, UnknownNameError
from archsearch.evaluators import data
from archsearch.evaluators.data import DOC_SEPARATOR, DataError, load_dataset
from archsearch.evaluators.dataset import TokenSpan, bits_per_byte

SMALL_CORPUS = 200_000  # bytes of the bundled corpus where a test needs no more: builds in ms


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own empty cache, never the home directory's."""
    path = tmp_path / "cache"
    monkeypatch.setenv("ARCHSEARCH_CACHE", str(path))
    return path


def read(span: TokenSpan) -> bytes:
    return span.open().tobytes()


def write_tokens(path: Path, ids, dtype: str) -> Path:
    np.asarray(ids, dtype=dtype).tofile(path)
    return path


def arange_dataset(tmp_path: Path, n: int = 20_000):
    """Token i at position i: any window names its own offset, so shifts and splits are visible."""
    return load_dataset(write_tokens(tmp_path / "ramp.bin", np.arange(n), "uint32"), n, "uint32")


# --- the bundled corpus ---


def test_bundled_corpus_is_capped_byte_level_stdlib_text(cache):
    ds = load_dataset(None, max_corpus_bytes=SMALL_CORPUS)
    assert ds.name.startswith("stdlib-py3.")
    assert ds.source == str(Path(sysconfig.get_paths()["stdlib"]).resolve())
    assert (ds.vocab_size, ds.bytes_per_token) == (256, 1.0)
    assert ds.n_train_tokens + ds.n_val_tokens == SMALL_CORPUS
    assert re.fullmatch(r"[0-9a-f]{16}-v256", ds.fingerprint)
    tokens = ds.train.open()
    assert isinstance(tokens, np.memmap)
    assert tokens.dtype == np.uint8  # so every id is < 256
    assert Path(ds.train.path).parent == cache / "corpus"
    assert Path(ds.train.path).name == f"{ds.fingerprint}.bin"
    text = read(ds.train) + read(ds.val)
    assert b"\ndef " in text and b'"""' in text  # code and docstring prose
    assert text.count(DOC_SEPARATOR) >= 5  # several whole files


def test_a_build_killed_with_sigkill_leaves_nothing_the_next_build_keeps(cache):
    # A worker OOM-killed mid-build never runs its cleanup: its scratch (named with its process
    # id) is removed by the next build in the same cache, a live builder's is left alone.
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folder = cache / "corpus"
    stale = folder / f".build-{dead.pid}-abc"
    stale.mkdir(parents=True)
    (stale / "train.part").write_bytes(b"x" * 1000)
    live = folder / f".build-{os.getppid()}-def"  # pytest's parent process: alive
    live.mkdir()
    load_dataset(None, max_corpus_bytes=SMALL_CORPUS)
    assert not stale.exists() and live.exists()
    assert not [p for p in folder.iterdir() if p.name.startswith(f".build-{os.getpid()}-")]


def test_bundled_corpus_is_deterministic_and_cached(cache, tmp_path, monkeypatch):
    first = load_dataset(None, max_corpus_bytes=SMALL_CORPUS)

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the cached corpus was rebuilt")

    with monkeypatch.context() as patch:
        patch.setattr(data, "_build_corpus", no_rebuild)
        assert load_dataset(None, max_corpus_bytes=SMALL_CORPUS) == first

    monkeypatch.setenv("ARCHSEARCH_CACHE", str(tmp_path / "other-cache"))
    rebuilt = load_dataset(None, max_corpus_bytes=SMALL_CORPUS)
    assert rebuilt.train.path != first.train.path
    assert rebuilt.fingerprint == first.fingerprint
    assert read(rebuilt.train) == read(first.train) and read(rebuilt.val) == read(first.val)
    assert load_dataset(None, max_corpus_bytes=SMALL_CORPUS - 1).fingerprint != first.fingerprint


def test_bundled_corpus_splits_by_file_without_overlap(cache):
    ds = load_dataset()  # the full default corpus
    index = json.loads(next((cache / "corpus").glob("*.json")).read_text())
    assert index["split_by"] == "file"
    train_files = {rel for rel, split, _ in index["files"] if split == "train"}
    val_files = {rel for rel, split, _ in index["files"] if split == "val"}
    assert val_files and len(train_files) > 20 * len(val_files)
    assert not train_files & val_files
    assert all(rel.endswith(".py") for rel in train_files | val_files)
    assert not any(set(rel.split("/")) & {"site-packages", "test", "tests"} for rel in train_files)
    assert sum(n for _, split, n in index["files"] if split == "val") == ds.n_val_tokens
    # One file: the training range, then the validation range right after it.
    assert ds.train.path == ds.val.path
    assert (ds.train.offset, ds.val.offset) == (0, ds.n_train_tokens)
    assert Path(ds.train.path).stat().st_size == ds.n_train_tokens + ds.n_val_tokens
    train, val = read(ds.train), read(ds.val)
    first_val = sorted(val_files)[0]
    largest_val = max((n, rel) for rel, split, n in index["files"] if split == "val")[1]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    assert val.startswith((stdlib / first_val).read_bytes() + DOC_SEPARATOR)
    assert (stdlib / largest_val).read_bytes() not in train


# --- byte-level text ---


def test_text_file_is_memory_mapped_and_split_at_its_tail(tmp_path):
    content = bytes(range(256)) * 40
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    ds = load_dataset(path, vocab_size=256)
    assert (ds.name, ds.vocab_size, ds.bytes_per_token) == ("notes.txt", 256, 1.0)
    assert (ds.n_train_tokens, ds.n_val_tokens) == (10_240 - 205, 205)  # 2% held out
    assert ds.train.path == str(path.resolve())  # mapped in place, not copied
    assert read(ds.train) + read(ds.val) == content
    assert load_dataset(path).fingerprint == ds.fingerprint


def test_text_folder_splits_by_file_and_skips_hidden_empty_and_binary(tmp_path):
    root = tmp_path / "docs"
    (root / "sub" / "deep").mkdir(parents=True)
    for i in range(40):
        (root / f"doc_{i:02d}.md").write_bytes(f"<<doc {i:02d}>> ".encode() * 20)
    (root / "sub" / "deep" / "code.py").write_bytes(b"<<nested>> print('hi')\n")
    (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00<<binary>>")
    (root / "empty.txt").write_bytes(b"")
    (root / ".hidden.txt").write_bytes(b"<<hidden>>")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_bytes(b"<<git>>")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "code.txt").write_bytes(b"<<cache>>")

    ds = load_dataset(root, val_fraction=0.1)
    train, val = read(ds.train), read(ds.val)
    in_val = {i for i in range(40) if f"<<doc {i:02d}>>".encode() in val}
    in_train = {i for i in range(40) if f"<<doc {i:02d}>>".encode() in train}
    assert in_val and not in_val & in_train and in_val | in_train == set(range(40))
    assert in_val == {i for i in range(40) if data._in_validation(f"doc_{i:02d}.md", 0.1)}
    assert b"<<nested>>" in train + val
    for skipped in (b"<<binary>>", b"<<hidden>>", b"<<git>>", b"<<cache>>"):
        assert skipped not in train + val
    assert (train + val).count(DOC_SEPARATOR) == 41  # one per text file
    assert (ds.name, ds.vocab_size, ds.bytes_per_token) == ("docs", 256, 1.0)


def test_text_folder_of_one_file_splits_by_bytes(tmp_path):
    (tmp_path / "only.txt").write_bytes(b"x" * 1000)
    ds = load_dataset(tmp_path)
    assert (ds.n_train_tokens, ds.n_val_tokens) == (981, 20)  # 1000 bytes + separator, 2% held out


def test_text_folder_of_too_many_files_is_refused_before_reading_them(tmp_path, monkeypatch):
    """`[proxy] data = "/"` went on to read the whole file system."""
    monkeypatch.setattr(data, "MAX_TEXT_FILES", 5)
    for i in range(3):
        (tmp_path / "a" / str(i)).mkdir(parents=True)
        for j in range(2):
            (tmp_path / "a" / str(i) / f"{j}.txt").write_text("text " * 200)
    with pytest.raises(DataError, match=f"^data folder {tmp_path} holds more than 5 files: give the folder"):
        load_dataset(tmp_path)
    monkeypatch.setattr(data, "MAX_TEXT_FILES", 6)
    assert load_dataset(tmp_path).n_train_tokens > 0


@pytest.mark.skipif(
    os.stat("/proc").st_dev == os.stat("/").st_dev, reason="/proc is not mounted apart from /"
)
def test_a_text_folder_does_not_descend_into_another_file_system():
    assert not data._same_device("/", "proc", os.stat("/").st_dev)
    assert data._same_device("/", "etc", os.stat("/").st_dev) == (
        os.stat("/etc").st_dev == os.stat("/").st_dev
    )


def test_text_folder_rebuilds_when_a_file_changes(tmp_path):
    for i in range(3):
        (tmp_path / f"{i}.txt").write_bytes(b"abc" * 100)
    before = load_dataset(tmp_path)
    (tmp_path / "1.txt").write_bytes(b"abd" * 101)
    after = load_dataset(tmp_path)
    assert after.fingerprint != before.fingerprint
    assert b"abd" in read(after.train) + read(after.val)


# --- pre-tokenized files ---


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_train_and_val_bin_are_memory_mapped(tmp_path, dtype):
    vocab = 60_000 if dtype == "uint16" else 100_000
    train_ids = np.arange(5_000) * (vocab // 5_000)
    val_ids = np.arange(500)[::-1] + vocab - 500
    write_tokens(tmp_path / "train.bin", train_ids, dtype)
    write_tokens(tmp_path / "val.bin", val_ids, dtype)
    ds = load_dataset(tmp_path, vocab_size=vocab, dtype=dtype)
    train, val = ds.train.open(), ds.val.open()
    assert isinstance(train, np.memmap) and isinstance(val, np.memmap)
    assert train.dtype == np.dtype(dtype)
    assert np.array_equal(train, train_ids) and np.array_equal(val, val_ids)
    assert (ds.n_train_tokens, ds.n_val_tokens, ds.vocab_size) == (5_000, 500, vocab)
    assert ds.bytes_per_token is None and ds.bits_per_byte(2.0) is None
    assert re.fullmatch(rf"[0-9a-f]{{16}}-v{vocab}", ds.fingerprint)


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_single_bin_is_split_at_its_tail(tmp_path, dtype):
    vocab = 60_000 if dtype == "uint16" else 90_000  # uint32: ids beyond 65535
    ids = np.arange(10_000) * (vocab // 10_000)
    ds = load_dataset(write_tokens(tmp_path / "tokens.bin", ids, dtype), vocab, dtype)
    assert isinstance(ds.train.open(), np.memmap)
    assert (ds.n_train_tokens, ds.n_val_tokens) == (9_800, 200)
    assert np.array_equal(ds.train.open(), ids[:9_800]) and np.array_equal(ds.val.open(), ids[9_800:])
    assert ds.train.path == ds.val.path == str((tmp_path / "tokens.bin").resolve())


@pytest.mark.parametrize(("vocab", "dtype"), [(65_536, "uint16"), (100_277, "uint32")])
def test_token_dtype_left_out_follows_the_vocabulary(tmp_path, vocab, dtype):
    # A search's `[proxy] data` names no dtype: ids past 65,535 (cl100k's vocabulary) are uint32.
    ids = np.arange(0, vocab, 7)
    write_tokens(tmp_path / "train.bin", ids, dtype)
    write_tokens(tmp_path / "val.bin", ids[::-1], dtype)
    ds = load_dataset(tmp_path, vocab_size=vocab)
    assert ds.train.dtype == dtype and np.array_equal(ds.train.open(), ids)
    assert ds.n_train_tokens == len(ids)


def test_a_bpe_corpus_written_as_uint32_reads_back_as_its_text(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    text = [f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(400)]
    bpe = tokenizers.Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(text, trainer)
    vocab = 100_000  # the file's ids as a large vocabulary's: uint32, the 4-byte layout
    train, val = (
        np.concatenate([e.ids for e in bpe.encode_batch(part)]) for part in (text[:360], text[360:])
    )
    write_tokens(tmp_path / "train.bin", train, "uint32")
    write_tokens(tmp_path / "val.bin", val, "uint32")
    ds = load_dataset(tmp_path, vocab_size=vocab, seq_len=16)
    assert ds.train.dtype == "uint32" and (tmp_path / "train.bin").stat().st_size == 4 * len(train)
    assert bpe.decode(ds.val.open().tolist()) == "".join(text[360:])
    x, y = next(ds.train_batches(2, 16, seed=0, device=torch.device("cpu")))
    assert x.shape == (2, 16) and torch.equal(x[:, 1:], y[:, :-1])


def test_token_id_beyond_vocab_names_the_file_and_id(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "_SCAN_CHUNK", 64)  # the bad id sits in a later chunk than the first
    write_tokens(tmp_path / "train.bin", np.arange(1_000), "uint16")
    val_ids = np.zeros(400, dtype=np.uint16)
    val_ids[300] = 1_234
    write_tokens(tmp_path / "val.bin", val_ids, "uint16")
    with pytest.raises(DataError, match=r"val\.bin: token id 1234 is >= vocab_size 1000"):
        load_dataset(tmp_path, vocab_size=1_000)
    assert load_dataset(tmp_path, vocab_size=1_235).vocab_size == 1_235


def test_vocab_check_holds_when_the_scan_is_cached(tmp_path, cache):
    path = write_tokens(tmp_path / "t.bin", np.arange(1_000), "uint16")
    first = load_dataset(path, vocab_size=1_000)
    assert list((cache / "scans").glob("*.json"))
    assert load_dataset(path, vocab_size=1_000) == first
    with pytest.raises(DataError, match=r"t\.bin: token id 999 is >= vocab_size 999"):
        load_dataset(path, vocab_size=999)  # the boundary: ids run from 0 to vocab_size - 1


# --- errors ---


def _file(name: str, content: bytes):
    """A maker for the error table: writes `tmp_path/name` and loads that file."""

    def make(tmp_path: Path) -> Path:
        path = tmp_path / name
        path.write_bytes(content)
        return path

    return make


def _in_folder(name: str, content: bytes):
    """A maker for the error table: writes `tmp_path/d/name` and loads the folder `d`."""

    def make(tmp_path: Path) -> Path:
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / name).write_bytes(content)
        return tmp_path / "d"

    return make


def _bundled(tmp_path: Path) -> None:
    return None


BAD_DATA = [
    ("missing", lambda tmp: tmp / "nope.txt", {}, r"data path not found: .*nope\.txt"),
    ("empty-text", _file("empty.txt", b""), {}, r"data file is empty: .*empty\.txt"),
    ("empty-bin", _file("empty.bin", b""), {"vocab_size": 10}, r"data file is empty: .*empty\.bin"),
    (
        "odd-bin",
        _file("odd.bin", b"abc"),
        {"vocab_size": 10},
        r"odd\.bin is 3 bytes, not a whole number of uint16",
    ),
    ("bin-no-vocab", _file("t.bin", b"ab"), {}, r"t\.bin holds pre-tokenized ids: give its vocab_size"),
    # uint16 named: left out, a vocabulary this large reads uint32 ids.
    (
        "vocab-too-big",
        _file("t.bin", b"ab"),
        {"vocab_size": 70_000, "dtype": "uint16"},
        r"vocab_size 70000 does not fit uint16",
    ),
    ("vocab-zero", _file("t.bin", b"ab"), {"vocab_size": 0}, r"vocab_size must be a positive integer, got 0"),
    ("no-val-bin", _in_folder("train.bin", b"ab"), {"vocab_size": 10}, r"d has no val\.bin"),
    ("no-train-bin", _in_folder("val.bin", b"ab"), {"vocab_size": 10}, r"d has no train\.bin"),
    ("only-hidden", _in_folder(".hidden", b"x"), {}, r"no files in folder .*d$"),
    (
        "only-binary",
        _in_folder("a.gz", b"\x1f\x8b\x00"),
        {},
        r"no text in .*d: every file is empty or binary",
    ),
    ("text-vocab", _file("a.txt", b"abc"), {"vocab_size": 1_000}, r"byte-level text with vocab_size 256"),
    ("bundled-vocab", _bundled, {"vocab_size": 50_257}, r"the bundled corpus is byte-level text"),
    ("val-fraction", _bundled, {"val_fraction": 0.0}, r"val_fraction must be between 0 and 1, got 0\.0"),
    ("corpus-cap", _bundled, {"max_corpus_bytes": 0}, r"max_bytes must be a positive integer, got 0"),
    ("one-byte", _file("one.txt", b"a"), {}, r"the train split has 0 tokens, too few for seq_len=1"),
    (
        "too-short",
        _file("short.txt", b"a" * 100),
        {"seq_len": 64},
        r"short\.txt: the validation split has 2 tokens, too few for seq_len=64 \(needs at least 65\)",
    ),
]


@pytest.mark.parametrize(("make", "kwargs", "match"), [pytest.param(*c[1:], id=c[0]) for c in BAD_DATA])
def test_bad_data_raises_one_clear_line(tmp_path, make, kwargs, match):
    with pytest.raises(DataError, match=match) as info:
        load_dataset(make(tmp_path), **kwargs)
    assert isinstance(info.value, ArchsearchError)
    assert "\n" not in str(info.value)


def test_unknown_dtype_lists_the_valid_ones(tmp_path):
    path = write_tokens(tmp_path / "t.bin", np.arange(10), "uint16")
    with pytest.raises(UnknownNameError, match=r"unknown token dtype 'int8'; valid: uint8, uint16, uint32"):
        load_dataset(path, vocab_size=10, dtype="int8")


def test_batch_sizes_are_checked_before_the_first_batch(tmp_path):
    path = tmp_path / "short.txt"
    path.write_bytes(bytes(range(100)))
    ds = load_dataset(path)
    with pytest.raises(DataError, match=r"the train split has 98 tokens, too few for seq_len=128"):
        ds.train_batches(4, 128, seed=0)  # no next(): the call itself fails
    with pytest.raises(DataError, match=r"the validation split has 2 tokens, too few for seq_len=2"):
        ds.val_batches(4, 2, count=1)
    with pytest.raises(DataError, match=r"batch_size must be a positive integer, got 0"):
        ds.train_batches(0, 8, seed=0)
    with pytest.raises(DataError, match=r"count must be a positive integer, got -1"):
        ds.val_batches(1, 1, count=-1)


# --- batches ---


def take(stream, n: int):
    return [next(stream) for _ in range(n)]


def test_train_batches_are_seeded_shifted_and_from_the_training_split(tmp_path):
    ds = arange_dataset(tmp_path)  # train ids 0..19599, val ids 19600..19999
    batches = take(ds.train_batches(8, 32, seed=0, device=torch.device("cpu")), 3)
    again = take(ds.train_batches(8, 32, seed=0), 3)
    other = take(ds.train_batches(8, 32, seed=1), 3)
    for (x, y), (x2, y2) in zip(batches, again, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not all(torch.equal(x, x2) for (x, _), (x2, _) in zip(batches, other, strict=True))
    assert not torch.equal(batches[0][0], batches[1][0])  # the stream moves on
    for x, y in batches:
        assert x.shape == y.shape == (8, 32)
        assert x.dtype == y.dtype == torch.int64 and x.is_contiguous() and y.is_contiguous()
        assert torch.equal(x - x[:, :1], torch.arange(32).expand(8, 32))  # contiguous windows
        assert torch.equal(y, x + 1)  # targets: the next token
        assert int(x.min()) >= 0 and int(y.max()) < 19_600  # never a validation token


def test_a_split_of_seq_len_plus_one_tokens_has_exactly_one_window(tmp_path):
    ds = load_dataset(write_tokens(tmp_path / "t.bin", np.arange(100), "uint16"), 100, val_fraction=0.1)
    assert (ds.n_train_tokens, ds.n_val_tokens) == (90, 10)
    for x, y in take(ds.train_batches(16, 89, seed=0), 3):
        assert torch.equal(x, torch.arange(89).expand(16, 89)) and int(y.max()) == 89
    ((x, y),) = ds.val_batches(4, 9, count=1)
    assert torch.equal(x, torch.arange(90, 99).expand(4, 9)) and int(y.max()) == 99


def test_byte_batches_are_windows_of_the_text(tmp_path):
    content = b"".join(f"line {i}: the quick brown fox\n".encode() for i in range(400))
    path = tmp_path / "fox.txt"
    path.write_bytes(content)
    ds = load_dataset(path)
    x, y = next(ds.train_batches(4, 64, seed=3))
    assert int(x.max()) < 256 and int(x.min()) >= 0
    for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True):
        assert row_x[1:] == row_y[:-1]
        assert bytes([*row_x, row_y[-1]]) in content[: ds.n_train_tokens]


def test_val_batches_are_fixed_and_cover_the_validation_split(tmp_path):
    ds = arange_dataset(tmp_path)
    first = ds.val_batches(4, 32, count=3)
    second = ds.val_batches(4, 32, count=3)
    assert len(first) == 3
    for (x, y), (x2, y2) in zip(first, second, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)
        assert x.shape == (4, 32) and x.dtype == torch.int64
        assert torch.equal(y, x + 1)
        assert int(x.min()) >= 19_600  # validation tokens only
    assert int(first[0][0][0, 0]) == 19_600  # first window at the split's start
    assert int(first[-1][1][-1, -1]) == 19_999  # last window ends on its last token


# --- records and units ---


def test_bits_per_byte():
    assert bits_per_byte(math.log(2), 1.0) == pytest.approx(1.0)
    assert bits_per_byte(4 * math.log(2), 4.0) == pytest.approx(1.0)
    assert bits_per_byte(1.0, 1.0) == pytest.approx(1.4426950408889634)
    with pytest.raises(ValueError, match="bytes_per_token must be positive"):
        bits_per_byte(1.0, 0.0)


def test_relative_paths_survive_a_change_of_directory(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    write_tokens(tmp_path / "data" / "t.bin", np.arange(1_000), "uint16")
    monkeypatch.chdir(tmp_path)
    ds = load_dataset("data/t.bin", vocab_size=1_000)
    monkeypatch.chdir(tmp_path / "data")  # a worker process may start elsewhere
    x, y = next(ds.train_batches(2, 8, seed=0))
    assert torch.equal(y, x + 1)


def test_dataset_is_plain_data(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"hello world\n" * 1_000)
    ds = load_dataset(path)
    assert ds.bits_per_byte(math.log(2)) == pytest.approx(1.0)
    blob = pickle.dumps(ds)
    assert len(blob) < 1_000  # paths and counts, not the 12 kB of tokens
    assert pickle.loads(blob) == ds
    record = json.loads(json.dumps(ds.to_dict()))
    assert record == {
        "name": "notes.txt",
        "source": str(path.resolve()),
        "vocab_size": 256,
        "n_train_tokens": 11_760,
        "n_val_tokens": 240,
        "fingerprint": ds.fingerprint,
        "bytes_per_token": 1.0,
    }


def test_the_unigram_loss_is_the_validation_cross_entropy_under_training_frequencies(tmp_path):
    # Training tokens: 0 three times for each 1; validation: 0 and 1 equally often. Vocab 4, so
    # add-one smoothing gives p = (31, 11, 1, 1) / 44 over 40 training tokens.
    train, val = [0, 0, 0, 1] * 10, [0, 1] * 5
    ds = load_dataset(write_tokens(tmp_path / "t.bin", train + val, "uint16"), 4, "uint16", val_fraction=0.2)
    assert ds.n_train_tokens == 40 and ds.n_val_tokens == 10
    expected = -(math.log(31 / 44) + math.log(11 / 44)) / 2
    assert ds.unigram_loss() == pytest.approx(expected, rel=1e-12)
