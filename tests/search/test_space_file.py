"""A space file is checked before any compute: shapes too large to store, a corpus that is empty
or names nothing, TOML that cannot be read, numbers of too many digits, and a cache folder that
cannot exist are each one line, and nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from tests.helpers import PROXY, one_line, space_file
from tests.specs import tiny_toml

HUGE = """vocab_size = 256
seq_len = 32
d_model = [1_000_000_000]
aspect_ratio = 32
head_dim = 64"""


@pytest.mark.parametrize("command", ["check", "search"])
def test_a_shape_over_2_63_parameters_is_refused_before_anything_is_written(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    space = space_file(tmp_path, model=HUGE)
    args = ["space", "check", str(space)] if command == "check" else ["search", "--space", str(space)]
    result = CliRunner().invoke(app, args)
    one_line(result, 2, "no config in the space can be searched", "params too large to store")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.toml"]


@pytest.mark.parametrize("command", ["check", "search"])
def test_an_empty_corpus_is_refused_before_any_trial(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.txt").write_bytes(b"")
    space = space_file(tmp_path, proxy=f'{PROXY}\ndata = "empty.txt"')
    args = ["space", "check", str(space)] if command == "check" else ["search", "--space", str(space)]
    result = CliRunner().invoke(app, args)
    one_line(result, 2, "[proxy].data: ", "empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "space.toml"]


@pytest.mark.parametrize(
    ("data", "shown"), [('""', "''"), ('"a\\u0000b"', "'a\\x00b'")], ids=["empty", "nul"]
)
def test_a_corpus_path_that_names_nothing_is_refused(tmp_path, monkeypatch, data, shown):
    """`data = ""` read the space file's own folder as the corpus, exit 0; a NUL in the
    path was a ValueError traceback ('embedded null byte')."""
    monkeypatch.chdir(tmp_path)
    space = space_file(tmp_path, proxy=f"{PROXY}\ndata = {data}")
    result = CliRunner().invoke(app, ["space", "check", str(space)])
    assert one_line(result, 2) == f"error: {space}: [proxy].data: must name a file or folder, got {shown}"


def test_a_space_file_with_a_byte_order_mark_says_so(tmp_path):
    """A space saved by Notepad (UTF-8 with a BOM) was 'invalid TOML: Invalid statement (at
    line 1, column 1)'."""
    space = space_file(tmp_path)
    space.write_bytes(b"\xef\xbb\xbf" + space.read_bytes())
    result = CliRunner().invoke(app, ["space", "check", str(space)])
    assert one_line(result, 2) == (
        f"error: {space}: invalid TOML: the file starts with a byte-order mark (U+FEFF); save it without one"
    )


def test_a_space_file_nested_past_the_recursion_limit_by_dotted_keys_is_one_line(tmp_path):
    """`a.a.a...b = 1` 1000 deep: tomllib reads it, the huge-integer check recursed into a traceback."""
    space = tmp_path / "deep.toml"
    space.write_text("[model]\n" + "a." * 1000 + "b = 1\n")
    result = CliRunner().invoke(app, ["space", "check", str(space)])
    assert one_line(result, 2) == f"error: {space}: invalid TOML: nested too deeply to be a search spec"


def test_a_huge_seed_in_a_space_file_is_quoted_by_its_digits(tmp_path):
    """`[search] seed = 1e300` (a float the reader makes whole) printed all 301 digits."""
    space = tmp_path / "s.toml"
    text = (Path(__file__).parents[2] / "examples" / "tiny-hf.toml").read_text()
    space.write_text(text.replace("seed = 0", "seed = 1e300", 1))
    result = CliRunner().invoke(app, ["space", "check", str(space)])
    assert one_line(result, 2) == (
        f"error: {space}: [search].seed: must be in 0..4294967295 (Optuna's seed range), "
        "got a 301-digit number"
    )


@pytest.mark.parametrize("below", ["", "corpora"])
def test_a_cache_folder_that_cannot_exist_is_refused_before_any_trial(tmp_path, monkeypatch, below):
    """`ARCHSEARCH_CACHE` naming a regular file failed every trial (`cannot write the
    corpus cache`) and a search of one trial exited 0."""
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ARCHSEARCH_CACHE", str(blocker / below))
    space = tmp_path / "space.toml"
    space.write_text(tiny_toml(search="trials = 1\nprune = false"))
    db = tmp_path / "t.db"
    for args in (
        ["space", "check", str(space)],
        ["search", "--space", str(space), "--storage", f"sqlite:///{db}"],
    ):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 1, result.output
        assert result.stderr == (
            f"error: cannot make the cache folder {blocker / below}: {blocker} is not a folder; set "
            "ARCHSEARCH_CACHE to a writable folder\n"
        )
    assert not db.exists() and blocker.read_text() == "not a folder"


MOST = "[search].promote.max_contenders: must be a whole number >= 2 (the most shapes promoted)"
SEEDS = "[search].promote.seeds: must be a whole number from 1 to 64 (the proxy seeds each contender is "
SEEDS += "trained at)"


@pytest.mark.parametrize("command", ["check", "search"])
@pytest.mark.parametrize(
    ("promote", "message"),
    [
        (
            "{ cap = 0.5 }",
            "[search].promote.cap: must be a number from 1 to 1024 (x the proxy's tokens), got 0.5",
        ),
        (
            '{ cap = "4" }',
            "[search].promote.cap: must be a number from 1 to 1024 (x the proxy's tokens), got '4'",
        ),
        (
            "{ cap = nan }",
            "[search].promote.cap: must be a number from 1 to 1024 (x the proxy's tokens), got nan",
        ),
        ('{ rule = "hyperband" }', "[search].promote.rule: unknown rule 'hyperband'; valid: pasha, cap"),
        ("{ margin = -0.1 }", '[search].promote.margin: must be "auto" or a number of nats >= 0, got -0.1'),
        (
            "{ caps = 4 }",
            "[search].promote.caps: unknown key; valid: cap, rule, margin, max_contenders, seeds, "
            "stall_seeds",
        ),
        ("{ max_contenders = 1 }", f"{MOST}, got 1"),
        ("{ max_contenders = 4.5 }", f"{MOST}, got 4.5"),
        ("{ seeds = 0 }", f"{SEEDS}, got 0"),
        ("{ seeds = 1.5 }", f"{SEEDS}, got 1.5"),
        ('{ seeds = "x" }', f"{SEEDS}, got 'x'"),
        (
            "{ stall_seeds = -1 }",
            "[search].promote.stall_seeds: must be a whole number from 0 to 63 (the proxy seeds more a "
            "contender whose first pass stalled is checked at), got -1",
        ),
    ],
    ids=[
        "cap-below-1",
        "cap-text",
        "cap-nan",
        "unknown-rule",
        "negative-margin",
        "unknown-key",
        "one-contender",
        "fractional-contenders",
        "no-seeds",
        "fractional-seeds",
        "seeds-text",
        "negative-stall-seeds",
    ],
)
def test_a_bad_promotion_setting_is_refused_in_one_line(tmp_path, monkeypatch, command, promote, message):
    monkeypatch.chdir(tmp_path)
    space = space_file(tmp_path, search=f"trials = 2\npromote = {promote}")
    args = ["space", "check", str(space)] if command == "check" else ["search", "--space", str(space)]
    result = CliRunner().invoke(app, args)
    assert one_line(result, 2) == f"error: {space}: {message}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.toml"]


def test_promotion_needs_a_token_budget(tmp_path):
    space = space_file(tmp_path, proxy="seconds = 5\nbatch_size = 4\ndevice = 'cpu'", search="promote = {}")
    result = CliRunner().invoke(app, ["space", "check", str(space)])
    one_line(
        result, 2, "[search].promote: promotion multiplies the proxy's token budget: give [proxy].tokens"
    )
