"""Where the proxy trainer's tokens come from: the bundled corpus, user text, pre-tokenized files.

`load_dataset(path)` is the one entry point. It returns a `Dataset`: plain, picklable facts (a
fingerprint, token counts, where the tokens live) and never the tokens themselves, which stay on
disk and are memory-mapped per batch, so a worker can receive it cheaply and a 20 GB token file
costs no RAM.

Sources, by what `path` is:
- None: the bundled corpus, byte-level text (vocab 256) built from the running Python's own
  standard-library sources (code and docstring prose, present on every machine, no network).
  Built once (a fraction of a second), cached under `cache_dir()`, memory-mapped afterwards.
- a folder holding `train.bin` and `val.bin`: pre-tokenized ids, the nanoGPT layout.
- a `.bin` file: pre-tokenized ids; the last `val_fraction` of them is the validation split.
- any other file: byte-level text; the last `val_fraction` of its bytes is the validation split.
- any other folder: byte-level text from every non-hidden, non-empty, non-binary file under it,
  recursively (binary: a NUL byte in its first 8000 bytes, git's test), concatenated once into
  the cache like the bundled corpus. Folders on another file system (`find -xdev`) are left out,
  and more than `MAX_TEXT_FILES` files is an error.

Splits. Folders of text (the bundled corpus too) are split by file: a stable hash of each file's
relative path sends about `val_fraction` of the files to validation, so the validation text is
documents the model never trains on, not the tail of a document it has half seen. When that
leaves a split empty (a folder of very few files) the concatenation is split by bytes instead,
like a single file. Either way the validation tokens are a range of the corpus file after the
training range (or `val.bin`, apart from `train.bin`): the two never overlap.

Fingerprint. `Dataset.fingerprint` is `"<16 hex digits>-v<vocab_size>"`: a sha256 over the exact
stored token bytes of each source file, the token dtype and where the split falls. Losses are
comparable only between runs with the same fingerprint. The bundled corpus follows the Python
version (each release changes its standard library), so its fingerprint does too, by design.

What a loaded dataset is, and the batches drawn from it, is `evaluators.dataset`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import stat
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from archsearch.errors import EnvironmentFailure, quoted
from archsearch.evaluators.dataset import TOKEN_DTYPES, DataError, Dataset, TokenSpan, check_positive
from archsearch.fileio import owned, sweep_orphans, write_atomic

logger = logging.getLogger(__name__)

# Bump when the corpus recipe, cache layout or fingerprint recipe changes: old caches are ignored
# and every fingerprint changes, so results built on the old recipe stop comparing as equal.
FORMAT_VERSION = 1
BYTE_VOCAB = 256  # byte-level text: every byte value is a token
VAL_FRACTION = 0.02  # of the files: in Python 3.11's stdlib 7 files, 90 KB, 350 windows of 256
DEFAULT_CORPUS_BYTES = 32 * 2**20  # cap on the bundled corpus; Python 3.11's filtered stdlib is ~8.6 MB
# A text folder of more files is refused: a proxy trains on megabytes, and `data = "/"` (or a home
# folder) would otherwise be read whole before the first step. Bigger corpora come as train.bin.
MAX_TEXT_FILES = 100_000
# Ends every document of a text folder, as GPT-2's <|endoftext|> does. Text files never contain
# NUL (a file with one is skipped as binary), so the separator is unambiguous.
DOC_SEPARATOR = b"\x00"

_BINARY_SNIFF = 8000  # git's heuristic: a NUL byte in the first 8000 bytes means a binary file
_READ_CHUNK = 1 << 20  # bytes per read while copying text files; more than _BINARY_SNIFF
_SCAN_CHUNK = 1 << 24  # tokens per chunk while scanning a token file: bounded memory at any size

# Standard-library trees left out of the bundled corpus, with why:
_STDLIB_SKIP_DIRS = frozenset(
    {
        "site-packages",  # third-party code: differs per machine, would break determinism
        "dist-packages",  # Debian's site-packages
        "__pycache__",
        # Tests: deliberately malformed or oddly encoded fixtures and generated tables; Debian
        # ships them in a separate package, so they would make the corpus depend on the distro.
        "test",
        "tests",
        "idle_test",
        # Trees distributions split into optional packages (Debian: idle, python3-tk,
        # python3-distutils, python3-lib2to3) or removed in later Pythons; left out so one Python
        # version gives one corpus wherever possible.
        "idlelib",
        "tkinter",
        "turtledemo",
        "distutils",
        "lib2to3",
        "ensurepip",
        "encodings",  # ~1.4 MB of generated charmap tables: hex, neither code nor prose
    }
)


def default_token_dtype(vocab_size: int | None) -> str:
    """The ids' type of a `.bin` file whose dtype is not given: nanoGPT's uint16 where the
    vocabulary fits it, else uint32. A search's `[proxy] data` names no dtype, and current
    tokenizers' vocabularies (cl100k's 100,277, Llama 3's 128,256) cannot be uint16 ids."""
    fits = vocab_size is None or vocab_size <= np.iinfo(TOKEN_DTYPES["uint16"]).max + 1
    return "uint16" if fits else "uint32"


def cache_dir() -> Path:
    """Where built corpora and file scans are cached: `$ARCHSEARCH_CACHE`, else `~/.cache/archsearch`."""
    env = os.environ.get("ARCHSEARCH_CACHE")
    # Absolute: the spans of a cached corpus point into it, and a worker may run elsewhere.
    return Path(env).expanduser().absolute() if env else Path.home() / ".cache" / "archsearch"


class CacheError(EnvironmentFailure):
    """The cache folder cannot be made: no trial could build its corpus there (exit 1)."""


def check_cache_dir() -> None:
    """Refuse, before any trial runs, a cache folder that cannot exist: `$ARCHSEARCH_CACHE` below a
    regular file, or missing below a folder that cannot be written. Every trial failed on it, and
    a search of one trial would then exit 0. An existing folder is left to the trials: a
    read-only one serves corpora already built there.

    Raises:
        CacheError: naming the folder and what is in its way.
    """
    folder = cache_dir()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    why = None
    if not existing.is_dir():
        why = f"{existing} is not a folder"
    elif existing != folder and not os.access(existing, os.W_OK | os.X_OK):
        why = f"{existing} is not writable"
    if why is not None:
        raise CacheError(
            f"cannot make the cache folder {folder}: {why}; set ARCHSEARCH_CACHE to a writable folder"
        )


def load_dataset(
    path: str | Path | None = None,
    vocab_size: int | None = None,
    dtype: str | None = None,
    *,
    seq_len: int | None = None,
    val_fraction: float = VAL_FRACTION,
    max_corpus_bytes: int = DEFAULT_CORPUS_BYTES,
) -> Dataset:
    """Open a dataset, checking it is usable before any training starts.

    Args:
        path: None for the bundled corpus; else a text file, a folder of text files, a `.bin`
            token file or a folder with `train.bin` and `val.bin` (see the module docstring).
        vocab_size: required for `.bin` files (the tokenizer's vocabulary, e.g. 50257 for GPT-2);
            for text it must be None or 256.
        dtype: the ids' type in `.bin` files, a TOKEN_DTYPES name (None: `default_token_dtype`,
            uint16 or, for a vocabulary past 65,536 ids, uint32); refused for text, where it would
            do nothing and `train --token-dtype` would seem to apply it.
        seq_len: when given, both splits must hold at least `seq_len + 1` tokens; otherwise 2.
        val_fraction: share of the files (text folders) or tokens (single files) held out.
            Ignored for `train.bin`/`val.bin`, which are split already.
        max_corpus_bytes: cap on the bundled corpus, in bytes.

    Returns:
        The `Dataset`, its tokens left on disk.

    Raises:
        DataError: the path is missing or unreadable, a file is empty or malformed, a token id is
            at least `vocab_size`, an argument is invalid or a split is too small for `seq_len`.
        UnknownNameError: `dtype` is not a TOKEN_DTYPES name.
    """
    if not 0 < val_fraction < 1:
        raise DataError(f"val_fraction must be between 0 and 1, got {val_fraction}")
    if path is None:
        _check_byte_vocab(vocab_size, dtype, "the bundled corpus")
        dataset = stdlib_corpus(max_bytes=max_corpus_bytes, val_fraction=val_fraction)
    else:
        p = Path(path).expanduser()
        if not p.exists():
            raise DataError(f"data path not found: {p}")
        if not (p.is_dir() or p.is_file()):  # a FIFO or a device: a read could wait or never end
            raise DataError(f"data path {p} is neither a file nor a folder")
        ids = dtype or default_token_dtype(vocab_size)
        if p.is_dir() and ((p / "train.bin").exists() or (p / "val.bin").exists()):
            dataset = _split_token_files(p, _check_token_vocab(vocab_size, ids, p), ids)
        elif p.is_dir():
            _check_byte_vocab(vocab_size, dtype, str(p))
            dataset = _text_folder(p, val_fraction)
        elif p.suffix == ".bin":
            dataset = _token_file(p, _check_token_vocab(vocab_size, ids, p), ids, val_fraction)
        else:
            _check_byte_vocab(vocab_size, dtype, str(p))
            dataset = _text_file(p, val_fraction)
    dataset.check_seq_len(1 if seq_len is None else seq_len)
    logger.info(
        "dataset %s: %d train + %d val tokens, vocab %d, fingerprint %s",
        dataset.name,
        dataset.n_train_tokens,
        dataset.n_val_tokens,
        dataset.vocab_size,
        dataset.fingerprint,
    )
    return dataset


def stdlib_corpus(max_bytes: int = DEFAULT_CORPUS_BYTES, val_fraction: float = VAL_FRACTION) -> Dataset:
    """The bundled byte-level corpus: the running Python's standard-library `.py` sources.

    Files are taken in sorted order of their relative path, the trees in `_STDLIB_SKIP_DIRS`
    left out, until `max_bytes` (the file that crosses it is cut); each ends with DOC_SEPARATOR.
    Built on first use and cached under `cache_dir()`.

    Raises:
        DataError: `max_bytes` is not positive or the cache cannot be written.
    """
    check_positive("max_bytes", max_bytes)
    root = Path(sysconfig.get_paths()["stdlib"])
    files = _list_files(root, _is_stdlib_source, _STDLIB_SKIP_DIRS)
    name = f"stdlib-py{sys.version_info.major}.{sys.version_info.minor}"
    return _text_corpus(name, root, files, max_bytes, val_fraction)


# --- byte-level text ---


def _is_stdlib_source(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    # _sysconfigdata records this build's compiler flags and install paths: machine-specific.
    return name.endswith(".py") and not name.startswith("_sysconfigdata") and not rel.startswith("config-")


def _is_user_file(rel: str) -> bool:
    return not rel.rsplit("/", 1)[-1].startswith(".")


def _list_files(
    root: Path, keep: Callable[[str], bool], skip_dirs: frozenset[str], max_files: int | None = None
) -> list[tuple[str, Path, int, int]]:
    """Files under `root` as (relative posix path, path, size, mtime_ns), sorted by relative path.

    Hidden folders (".git") and `skip_dirs` are pruned before descending into them, and so is
    every folder on another file system than `root` (`find -xdev`): `data = "/"` went on into
    /proc and /sys. More than `max_files` files under `root` is a DataError.
    """
    found = []
    device = root.stat().st_dev
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [
            d
            for d in dirnames
            if d not in skip_dirs and not d.startswith(".") and _same_device(dirpath, d, device)
        ]
        seen += len(filenames)
        if max_files is not None and seen > max_files:
            raise DataError(
                f"data folder {root} holds more than {max_files:,} files: give the folder of the corpus, "
                "or tokenize it into train.bin and val.bin"
            )
        for filename in filenames:
            path = Path(dirpath, filename)
            rel = path.relative_to(root).as_posix()
            if not keep(rel):
                continue
            try:
                st = path.stat()
            except OSError as exc:
                raise DataError(f"cannot read {path}: {exc.strerror}") from None
            if stat.S_ISREG(st.st_mode):  # not a FIFO or device: reading those could block
                found.append((rel, path, st.st_size, st.st_mtime_ns))
    # Sort the full list, not each folder's names: os.walk's order differs between file systems.
    return sorted(found, key=lambda f: f[0])


def _same_device(dirpath: str, name: str, device: int) -> bool:
    """Whether the folder `name` in `dirpath` is on the file system `device` (unreadable: no)."""
    try:
        return os.lstat(os.path.join(dirpath, name)).st_dev == device
    except OSError:
        return False


def _text_folder(root: Path, val_fraction: float) -> Dataset:
    files = _list_files(root, _is_user_file, frozenset({"__pycache__"}), MAX_TEXT_FILES)
    if not files:
        raise DataError(f"no files in folder {root}")
    return _text_corpus(root.name, root, files, None, val_fraction)


def _in_validation(rel: str, val_fraction: float) -> bool:
    """Whether a file goes to validation: a stable hash of its path (Python's hash() is salted)."""
    digest = hashlib.sha256(rel.encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") < val_fraction * 2**64


def _text_corpus(
    name: str, root: Path, files: list[tuple[str, Path, int, int]], max_bytes: int | None, val_fraction: float
) -> Dataset:
    """The corpus of `files` under `root`, from the cache or built into it."""
    # The cache key is computed before reading anything: the listing's sizes and mtimes stand in
    # for the content, so a changed file rebuilds the corpus.
    listing = [(rel, size, mtime) for rel, _, size, mtime in files]
    key = _digest([FORMAT_VERSION, sys.version, str(root.resolve()), max_bytes, val_fraction, listing])
    index_path = cache_dir() / "corpus" / f"{name}-{key[:24]}.json"
    index = _read_index(index_path)
    if index is None:
        index = _build_corpus(index_path, root, files, max_bytes, val_fraction)
    data_path = str(index_path.parent / index["file"])
    n_train, n_val = index["n_train"], index["n_val"]
    return Dataset(
        name=name,
        source=str(root.resolve()),
        vocab_size=BYTE_VOCAB,
        fingerprint=index["fingerprint"],
        bytes_per_token=1.0,
        train=TokenSpan(data_path, "uint8", 0, n_train),
        val=TokenSpan(data_path, "uint8", n_train, n_val),
    )


def _read_index(index_path: Path) -> dict[str, Any] | None:
    """A cached corpus's index, or None when absent or not matching its data file."""
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        size = (index_path.parent / index["file"]).stat().st_size
        if size == index["n_train"] + index["n_val"]:
            return index
    except (FileNotFoundError, NotADirectoryError):  # not built (or no cache folder: the build says why)
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("rebuilding the corpus: its cache index %s is unusable (%s)", index_path, exc)
        return None
    logger.warning("rebuilding the corpus: the data file of %s has the wrong size", index_path)
    return None


def _build_corpus(
    index_path: Path,
    root: Path,
    files: list[tuple[str, Path, int, int]],
    max_bytes: int | None,
    val_fraction: float,
) -> dict[str, Any]:
    """Concatenate the text files into one cached byte file: training files, then validation files.

    Written atomically (parts built in a scratch folder, renamed into place, the index written
    last), so a crash or a concurrent build never leaves a half-written corpus a later run trusts.

    Returns:
        The index: data file name, fingerprint, split sizes and how each file was used.

    Raises:
        DataError: a file cannot be read, nothing is left after skipping empty and binary files,
            or the cache cannot be written.
    """
    start = time.perf_counter()
    folder = index_path.parent
    manifest: list[list[Any]] = []  # [relative path, "train" or "val", bytes], to audit the split
    skipped = 0
    try:
        folder.mkdir(parents=True, exist_ok=True)
        sweep_orphans(folder, ".build-")  # what a build killed with SIGKILL left (tens of MB)
        with tempfile.TemporaryDirectory(dir=folder, prefix=owned(".build-")) as scratch:
            parts = {split: Path(scratch, f"{split}.part") for split in ("train", "val")}
            budget = max_bytes
            with open(parts["train"], "wb") as train_out, open(parts["val"], "wb") as val_out:
                for rel, path, _, _ in files:
                    if budget is not None and budget <= 0:
                        break
                    split = "val" if _in_validation(rel, val_fraction) else "train"
                    written = _copy_text(path, val_out if split == "val" else train_out, budget)
                    if written is None:
                        skipped += 1
                        continue
                    manifest.append([rel, split, written])
                    if budget is not None:
                        budget -= written
                n_train, n_val = train_out.tell(), val_out.tell()
            total = n_train + n_val
            if total == 0:
                raise DataError(f"no text in {root}: every file is empty or binary")
            # Append the validation part to the training part, hashing the result as it forms.
            sha = hashlib.sha256()
            with open(parts["train"], "r+b") as out, open(parts["val"], "rb") as val_in:
                while chunk := out.read(_READ_CHUNK):
                    sha.update(chunk)
                while chunk := val_in.read(_READ_CHUNK):
                    sha.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())  # the data must be on disk before the index vouches for it
            split_by = "file"
            if n_train == 0 or n_val == 0:
                # Too few files for both splits: split the concatenation by position instead.
                split_by = "bytes"
                n_val = _val_count(total, val_fraction)
                n_train = total - n_val
            fingerprint = _fingerprint(BYTE_VOCAB, "uint8", n_train, n_val, [sha.hexdigest()])
            data_name = f"{fingerprint}.bin"
            os.replace(parts["train"], folder / data_name)
        index = {
            "format": FORMAT_VERSION,
            "file": data_name,
            "fingerprint": fingerprint,
            "n_train": n_train,
            "n_val": n_val,
            "split_by": split_by,
            "files": manifest,
        }
        write_atomic(index_path, json.dumps(index).encode())
    except OSError as exc:
        raise DataError(
            f"cannot write the corpus cache in {folder}: {exc.strerror}; "
            "set ARCHSEARCH_CACHE to a writable folder"
        ) from None
    if skipped:
        logger.info("skipped %d empty or binary file(s) under %s", skipped, root)
    logger.info(
        "built corpus %s: %d files, %.2f MB (%d validation bytes, split by %s) in %.2f s",
        data_name,
        len(manifest),
        total / 1e6,
        n_val,
        split_by,
        time.perf_counter() - start,
    )
    return index


def _copy_text(path: Path, out: BinaryIO, budget: int | None) -> int | None:
    """Append a text file plus DOC_SEPARATOR to `out`, at most `budget` bytes in all.

    Returns:
        Bytes written, or None for an empty or binary file (nothing written).

    Raises:
        DataError: the file cannot be read.
        OSError: `out` cannot be written (the caller reports the cache as unwritable).
    """
    with contextlib.closing(_read_chunks(path)) as chunks:
        first = next(chunks, b"")
        if not first or b"\0" in first[:_BINARY_SNIFF]:
            return None
        written = 0
        for chunk in itertools.chain([first], chunks):
            if budget is not None:
                chunk = chunk[: budget - written]
            out.write(chunk)
            written += len(chunk)
            if budget is not None and written >= budget:
                return written
    separator = DOC_SEPARATOR if budget is None else DOC_SEPARATOR[: budget - written]
    out.write(separator)
    return written + len(separator)


def _read_chunks(path: Path) -> Iterator[bytes]:
    """A file's bytes in chunks, a read error turned into a DataError naming the file."""
    try:
        with open(path, "rb") as f:
            # The first chunk is at least _BINARY_SNIFF bytes (a regular file reads in full).
            while chunk := f.read(_READ_CHUNK):
                yield chunk
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror}") from None


def _text_file(path: Path, val_fraction: float) -> Dataset:
    """A single text file, memory-mapped as it is: its last `val_fraction` of bytes is validation."""
    return _tail_split(path, _scan(path, "uint8"), BYTE_VOCAB, "uint8", 1.0, val_fraction)


def _tail_split(
    path: Path, scan: _Scan, vocab_size: int, dtype: str, bytes_per_token: float | None, val_fraction: float
) -> Dataset:
    """One token file split in place: the last `val_fraction` of its tokens is validation."""
    n_val = _val_count(scan.n_tokens, val_fraction)
    n_train = scan.n_tokens - n_val
    source = str(path.resolve())
    return Dataset(
        name=path.name,
        source=source,
        vocab_size=vocab_size,
        fingerprint=_fingerprint(vocab_size, dtype, n_train, n_val, [scan.sha256]),
        bytes_per_token=bytes_per_token,
        train=TokenSpan(source, dtype, 0, n_train),
        val=TokenSpan(source, dtype, n_train, n_val),
    )


# --- pre-tokenized files ---


def _token_file(path: Path, vocab_size: int, dtype: str, val_fraction: float) -> Dataset:
    """One `.bin` token file: its last `val_fraction` of tokens is validation."""
    return _tail_split(path, _checked_scan(path, dtype, vocab_size), vocab_size, dtype, None, val_fraction)


def _split_token_files(folder: Path, vocab_size: int, dtype: str) -> Dataset:
    """A folder with `train.bin` and `val.bin`, split already (nanoGPT's prepare.py layout)."""
    paths = {split: folder / f"{split}.bin" for split in ("train", "val")}
    for split, path in paths.items():
        if not path.is_file():
            raise DataError(
                f"{folder} has no {split}.bin; a pre-tokenized folder needs train.bin and val.bin"
            )
    train, val = (_checked_scan(paths[s], dtype, vocab_size) for s in ("train", "val"))
    return Dataset(
        name=folder.name,
        source=str(folder.resolve()),
        vocab_size=vocab_size,
        fingerprint=_fingerprint(vocab_size, dtype, train.n_tokens, val.n_tokens, [train.sha256, val.sha256]),
        bytes_per_token=None,
        train=TokenSpan(str(paths["train"].resolve()), dtype, 0, train.n_tokens),
        val=TokenSpan(str(paths["val"].resolve()), dtype, 0, val.n_tokens),
    )


def _checked_scan(path: Path, dtype: str, vocab_size: int) -> _Scan:
    """Scan a token file and check every id is below `vocab_size`."""
    scan = _scan(path, dtype)
    if scan.max_id >= vocab_size:
        raise DataError(
            f"{path}: token id {scan.max_id} is >= vocab_size {vocab_size}; is vocab_size or dtype wrong?"
        )
    return scan


@dataclass(frozen=True)
class _Scan:
    """What one pass over a token file learns."""

    n_tokens: int
    max_id: int
    sha256: str  # of the file's bytes


def _scan(path: Path, dtype: str) -> _Scan:
    """Count, hash and find the largest id of a token file, chunk by chunk; cached.

    The cache is keyed by the file's resolved path, size and modification time, so the pass over
    a multi-gigabyte file happens once, not in every trial's worker.

    Raises:
        DataError: the file is unreadable, empty, or not a whole number of `dtype` tokens.
    """
    itemsize = TOKEN_DTYPES[dtype].itemsize
    try:
        st = path.stat()
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror}") from None
    if st.st_size == 0:
        raise DataError(f"data file is empty: {path}")
    if st.st_size % itemsize:
        raise DataError(
            f"{path} is {st.st_size} bytes, not a whole number of {dtype} tokens "
            f"({itemsize} bytes each); is dtype wrong?"
        )
    key = _digest([FORMAT_VERSION, str(path.resolve()), st.st_size, st.st_mtime_ns, dtype])
    cached = cache_dir() / "scans" / f"{key[:32]}.json"
    try:
        return _Scan(**json.loads(cached.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        pass  # not scanned yet, or an unreadable entry: scan again
    sha = hashlib.sha256()
    max_id = 0
    chunk_bytes = _SCAN_CHUNK * itemsize
    try:
        with open(path, "rb") as f:
            while chunk := f.read(chunk_bytes):
                sha.update(chunk)
                max_id = max(max_id, int(np.frombuffer(chunk, dtype=TOKEN_DTYPES[dtype]).max()))
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror}") from None
    scan = _Scan(n_tokens=st.st_size // itemsize, max_id=max_id, sha256=sha.hexdigest())
    try:
        write_atomic(cached, json.dumps(dataclasses.asdict(scan)).encode())
    except OSError as exc:  # the scan cache only saves time; the data is fine without it
        logger.warning("cannot cache the scan of %s in %s: %s", path, cached.parent, exc.strerror)
    return scan


# --- helpers ---


def _val_count(n_tokens: int, val_fraction: float) -> int:
    """Validation tokens of a split by position: at least one, so a tiny file fails the size check."""
    return max(1, round(n_tokens * val_fraction))


def _fingerprint(vocab_size: int, dtype: str, n_train: int, n_val: int, digests: list[str]) -> str:
    """`"<16 hex>-v<vocab_size>"` over the sources' sha256 digests, the dtype and the split sizes."""
    return f"{_digest([FORMAT_VERSION, dtype, n_train, n_val, digests])[:16]}-v{vocab_size}"


def _digest(parts: list[Any]) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _check_byte_vocab(vocab_size: int | None, dtype: str | None, what: str) -> None:
    """Text is bytes: no other vocabulary, and no token dtype (that is for `.bin` files)."""
    if vocab_size is not None and vocab_size != BYTE_VOCAB:
        raise DataError(
            f"{what} is byte-level text with vocab_size {BYTE_VOCAB}, got vocab_size={vocab_size}"
        )
    if dtype is not None:
        raise DataError(f"{what} is byte-level text: a token dtype ({quoted(dtype)}) is for .bin token files")


def _check_token_vocab(vocab_size: int | None, dtype: str, path: Path) -> int:
    """The vocabulary of a pre-tokenized source: given, positive and representable in `dtype`."""
    limit = np.iinfo(TOKEN_DTYPES[dtype]).max + 1
    if vocab_size is None:
        raise DataError(
            f"{path} holds pre-tokenized ids: give its vocab_size "
            "(the tokenizer's vocabulary, 50257 for GPT-2)"
        )
    check_positive("vocab_size", vocab_size)
    if vocab_size > limit:
        raise DataError(f"vocab_size {vocab_size} does not fit {dtype} ids (at most {limit}); use uint32")
    return vocab_size
