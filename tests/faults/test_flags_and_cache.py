"""Options that did nothing and a cache that is not a folder:
`profile --context` without `--serve` and the timing options of a modelled profile were ignored
(exit 0); `ARCHSEARCH_CACHE=/dev/null` printed a warning line before its error line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from tests.helpers import one_line

CONFIG = {"vocab_size": 256, "seq_len": 64, "d_model": 128, "n_layers": 2, "n_heads": 4, "d_ff": 256}


@pytest.mark.parametrize(
    "args, line",
    [
        (["--device", "h100-sxm", "--context", "5"], "error: --context only goes with --serve"),
        (
            ["--device", "h100-sxm", "--cache", "c.json", "--min-run-time", "1", "--steps", "9"],
            "error: --steps, --min-run-time, --cache are for a step measured here; h100-sxm is modelled",
        ),
        (
            ["--device", "h100-sxm", "--storage", "sqlite:///x.db"],
            "error: --storage is for a step measured here",
        ),
    ],
    ids=["context-without-serve", "timing-of-a-modelled-step", "storage-of-a-modelled-step"],
)
def test_an_option_the_profile_would_ignore_is_refused(tmp_path, monkeypatch, args, line):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.json").write_text(json.dumps(CONFIG))
    result = CliRunner().invoke(app, ["profile", "ok.json", *args])
    assert one_line(result, 2).startswith(line)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.json"]


def test_a_cache_folder_that_is_a_file_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("ARCHSEARCH_CACHE", "/dev/null")
    (tmp_path / "ok.json").write_text(json.dumps(CONFIG))
    result = CliRunner().invoke(
        app, ["train", str(tmp_path / "ok.json"), "--device", "cpu", "--tokens", "2000"]
    )
    one_line(result, 2, "cannot write the corpus cache in /dev/null/corpus: Not a directory")


@pytest.mark.parametrize("data", ["text.txt", None], ids=["text-file", "bundled-corpus"])
def test_a_token_dtype_for_text_is_refused(tmp_path, data):
    """`train --token-dtype uint32` on text was ignored, exit 0 (`--vocab-size` was refused)."""
    (tmp_path / "ok.json").write_text(json.dumps(CONFIG))
    (tmp_path / "text.txt").write_text("hello world " * 500)
    where = ["--data", str(tmp_path / data)] if data else []
    args = [
        "train",
        str(tmp_path / "ok.json"),
        "--device",
        "cpu",
        "--tokens",
        "2000",
        *where,
        "--token-dtype",
        "uint32",
    ]
    one_line(
        CliRunner().invoke(app, args),
        2,
        "is byte-level text: a token dtype ('uint32') is for .bin token files",
    )
