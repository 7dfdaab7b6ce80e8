"""A BPE-tokenized corpus for GPU-scale proxy runs, built offline from the bundled corpus's text.

The bundled corpus (`evaluators.data.stdlib_corpus`: the running Python's standard-library
sources, on every machine, no network) is byte-level: at vocab 256 a GPU-sized model spends its
capacity spelling. This script trains a byte-level BPE vocabulary (the `tokenizers` package,
`pip install archsearch[corpus]`) on that corpus's training documents only, encodes both splits
with it, and writes the nanoGPT layout a search's `[proxy] data` reads:

    OUT/train.bin, OUT/val.bin   little-endian ids, uint16 (uint32 past 65,536 ids or with --dtype)
    OUT/tokenizer.json           the vocabulary, to decode or tokenize more text the same way
    OUT/meta.json                vocab_size, dtype, token counts, bytes per token, the source

The split is the bundled corpus's own (by file: the validation documents are never trained on,
not even by the vocabulary), each document ends with `<|endoftext|>` (id 0). The same Python
version and `tokenizers` release give the same bytes; a different Python gives another corpus,
as the bundled corpus does, and the data fingerprint every trial stores tells them apart. Nothing
is downloaded, and nothing large is committed or carried: a lent GPU builds it in seconds.

    python benchmarks/gpu_corpus.py                     # into .corpus/bpe8k (git-ignored)
    python benchmarks/gpu_corpus.py --vocab 4096 --out /tmp/bpe4k
    python benchmarks/gpu_corpus.py --smoke             # 200 kB of text, vocab 512, uint32: seconds

A folder already holding the same build (meta.json's recipe) is left as it is.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / ".corpus" / "bpe8k"
# About 8.4 MB of training text: 8,192 merges keep each id seen often (a few hundred times at the
# median) and the embedding a small share of a 5-50M shape, where 32k would make it most of one.
DEFAULT_VOCAB = 8192
EOT = "<|endoftext|>"
RECIPE = 1  # bump when the build changes: an old folder is rebuilt
# Of the files, to validation: the bundled corpus's 2% is 7 files and 22k tokens here, fewer than
# one evaluation of a GPU proxy reads (8 batches of 4 x 1024); 5% is about 75 files, 100k tokens.
VAL_FRACTION = 0.05
SMOKE = {"vocab": 512, "max_bytes": 200_000, "dtype": "uint32"}


def documents(span: Any) -> list[str]:
    """A split of the bundled corpus as its documents' text (they end with `DOC_SEPARATOR`)."""
    from archsearch.evaluators.data import DOC_SEPARATOR

    raw = span.open().tobytes()
    return [d.decode("utf-8", errors="replace") for d in raw.split(DOC_SEPARATOR) if d]


def train_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """A byte-level BPE (GPT-2's pre-tokenizer, every byte in the alphabet: any text encodes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )  # fmt: skip
    bpe.train_from_iterator(texts, trainer)
    return bpe


def encode(bpe: Any, texts: list[str]) -> Any:
    """The documents' ids, each followed by `EOT`'s."""
    import numpy as np

    eot = bpe.token_to_id(EOT)
    parts = [np.append(np.asarray(e.ids, dtype=np.int64), eot) for e in bpe.encode_batch(texts)]
    return np.concatenate(parts)


def build(
    out: Path, vocab: int = DEFAULT_VOCAB, max_bytes: int | None = None, dtype: str | None = None
) -> dict:
    """Build the corpus into `out` (kept when it holds this recipe's build); its meta.json's data."""
    from archsearch.evaluators.data import (
        DEFAULT_CORPUS_BYTES,
        TOKEN_DTYPES,
        default_token_dtype,
        stdlib_corpus,
    )

    max_bytes = max_bytes or DEFAULT_CORPUS_BYTES
    recipe = {"recipe": RECIPE, "vocab_requested": vocab, "max_bytes": max_bytes, "dtype_requested": dtype,
              "val_fraction": VAL_FRACTION}  # fmt: skip
    source = stdlib_corpus(max_bytes=max_bytes, val_fraction=VAL_FRACTION)
    recipe |= {"source": source.name, "source_fingerprint": source.fingerprint}
    meta_path = out / "meta.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if {k: meta.get(k) for k in recipe} == recipe and (out / "train.bin").exists():
            return meta
    t0 = time.perf_counter()
    train_text, val_text = documents(source.train), documents(source.val)
    bpe = train_tokenizer(train_text, vocab)
    vocab_size = bpe.get_vocab_size()  # fewer than asked when the text runs out of merges
    ids_dtype = dtype or default_token_dtype(vocab_size)
    splits = {"train": encode(bpe, train_text), "val": encode(bpe, val_text)}
    tmp = Path(tempfile.mkdtemp(prefix=".corpus.", dir=out.parent if out.parent.exists() else None))
    try:
        for name, ids in splits.items():
            ids.astype(TOKEN_DTYPES[ids_dtype]).tofile(tmp / f"{name}.bin")
        bpe.save(str(tmp / "tokenizer.json"))
        text_bytes = source.n_train_tokens + source.n_val_tokens
        tokens = sum(len(ids) for ids in splits.values())
        meta = recipe | {
            "vocab_size": vocab_size, "dtype": ids_dtype, "train_tokens": len(splits["train"]),
            "val_tokens": len(splits["val"]), "documents": [len(train_text), len(val_text)],
            "text_bytes": text_bytes, "bytes_per_token": round(text_bytes / tokens, 4),
            "python": ".".join(map(str, sys.version_info[:3])), "tokenizers": _tokenizers_version(),
            "build_s": round(time.perf_counter() - t0, 2),
        }  # fmt: skip
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return meta


def _tokenizers_version() -> str:
    import tokenizers

    return str(tokenizers.__version__)


def describe(meta: dict, out: Path) -> str:
    size = sum((out / f"{s}.bin").stat().st_size for s in ("train", "val"))
    return (
        f"{out}: {meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens, vocab "
        f"{meta['vocab_size']:,} ({meta['dtype']}, {size / 1e6:.1f} MB), {meta['bytes_per_token']:.2f} bytes "
        "of text a token, from "
        f"{meta['source']} ({meta['text_bytes'] / 1e6:.1f} MB), built in {meta['build_s']:.1f} s"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help=f"folder (default {DEFAULT_OUT.relative_to(ROOT)})")
    parser.add_argument("--vocab", type=int, help=f"BPE vocabulary, EOT included ({DEFAULT_VOCAB})")
    parser.add_argument("--max-bytes", type=int, help="cap on the bundled corpus's text (its default)")
    parser.add_argument("--dtype", choices=["uint16", "uint32"], help="ids' type (default: by vocabulary)")
    parser.add_argument("--smoke", action="store_true", help="200 kB, vocab 512, uint32, a temporary folder")
    args = parser.parse_args(argv)
    temporary = None
    if args.smoke:
        temporary = Path(tempfile.mkdtemp(prefix="gpu_corpus_smoke."))
        args.out = args.out or temporary / "bpe"
        args.vocab = args.vocab or SMOKE["vocab"]
        args.max_bytes = args.max_bytes or SMOKE["max_bytes"]
        args.dtype = args.dtype or SMOKE["dtype"]
    out = (args.out or DEFAULT_OUT).absolute()
    try:
        meta = build(out, args.vocab or DEFAULT_VOCAB, args.max_bytes, args.dtype)
        print(describe(meta, out), flush=True)
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


if __name__ == "__main__":
    main()
