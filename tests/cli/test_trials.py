"""`archsearch trials`: hostile filters fail cleanly and leave the database byte-identical; the
file formats round-trip through pandas."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.cli import results as results_cli
from archsearch.storage import Storage, trials_frame
from tests.storage.test_query import fill_study

runner = CliRunner()


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    """A SQLite trial database with study "s", every connection closed (no WAL left)."""
    path = tmp_path_factory.mktemp("db") / "trials.db"
    with Storage.open(f"sqlite:///{path}") as storage:
        fill_study(storage)
    return path


def _files(folder: Path) -> dict[str, str]:
    """sha256 of every file beside the database, its -wal and -shm included when present."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def trials(db: Path, *args: str):
    return runner.invoke(app, ["trials", "--study", "s", "--storage", f"sqlite:///{db}", *args])


def _one_error_line(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


HOSTILE = [
    ("drop-table", "d_model = 1; DROP TABLE archsearch_trials", "unexpected character ';'"),
    ("or-1-eq-1-comment", "status = 'x' OR 1=1 --", "expected a column name at position 16, found '1'"),
    ("sql-comment", "d_model = 1 -- and status = complete", "unexpected character '-'"),
    ("block-comment", "d_model = 1 /* x */", "unexpected character '/'"),
    ("union-select", "d_model = 1 union select * from archsearch_studies", "found 'union'"),
    ("subquery", "d_model in (select d_model from archsearch_trials)", "numeric column"),
    ("string-breakout", "activation = 'x'' or ''1''=''1'", "found the string ' or '"),
    ("python-import", "__import__('os').system('x')", "unknown column '__import__'"),
    ("pandas-at-local", "@pd.io.common.os.system('x')", "unexpected character '@'"),
    ("dunder-attribute", "d_model.__class__ = 1", "unknown column 'd_model.__class__'"),
    ("backtick-command", "`rm -rf /`", "unexpected character '`'"),
    ("backtick-column", "`d_model` = 1", "unexpected character '`'"),
    ("percent-format", "activation = %s", "unexpected character '%'"),
    ("concat-operator", "d_model = 1 || 1", "unexpected character '|'"),
    ("sql-function", "length(reason) > 1", "unknown column 'length'"),
    ("pragma", "PRAGMA writable_schema = 1", "unknown column 'PRAGMA'"),
    ("unbalanced-open", "(d_model = 1 and (n_layers = 2)", "'(' at position 0 is never closed"),
    ("unbalanced-close", "d_model = 1)", "')' at position 11 closes nothing"),
    ("empty-parens", "()", "expected a column name at position 1, found ')'"),
    ("unknown-column", "dmodel >= 512", "unknown column 'dmodel' at position 0 (did you mean 'd_model'?)"),
    ("json-column", "config_json = '{}'", "unknown column 'config_json'"),
    ("column-vs-column", "d_model = n_layers", "'d_model' is a numeric column"),
    ("number-vs-word", "d_model >= swiglu", "'d_model' is a numeric column"),
    ("string-order", "activation < 'x'", "operator '<' at position 11 does not apply to the string column"),
    ("bool-vs-number", "bias = 1", "'bias' is a boolean column"),
    ("string-vs-number", "activation = 1", "'activation' is a string column"),
    ("empty", "", "empty filter"),
    ("blank", "   ", "empty filter"),
    ("huge", "d_model = 1 or " * 200 + "d_model = 1", "filter is 3,011 characters long"),
    ("deep-parens", "(" * 100 + "d_model = 1" + ")" * 100, "nested deeper than 32 levels"),
    ("deep-not", "not " * 100 + "d_model = 1", "nested deeper than 32 levels"),
    ("100k-parens", "(" * 100_000, "filter is 100,000 characters long; the limit is 2,000"),
    ("unicode-column", "d_modèl = 1", "unexpected character 'è' at position 5"),
    ("homoglyph", "d_m\u043edel = 1", "unexpected character '\u043e' at position 3"),
    ("fullwidth-digit", "d_model = \uff11", "unexpected character '\uff11'"),
    ("null-byte", "d_model = 1\x00; drop table x", "control character '\\x00' at position 11"),
    ("null-byte-in-string", "activation = 'a\x00b'", "control character '\\x00' at position 15"),
    ("terminal-escape", "\x1b[2Jd_model = 1", "control character '\\x1b' at position 0"),
    ("bidi-override", "activation = '\u202eulgiws'", "control character '\\u202e'"),
    ("newline-statement", "d_model = 1\n; DROP TABLE x", "unexpected character ';' at position 12"),
    ("unterminated-string", "activation = 'swiglu", "unterminated string starting at position 13"),
    ("missing-value", "d_model >=", "expected a value after '>=' at position 10, found the end"),
    ("missing-operator", "d_model 512", "expected an operator"),
    ("dangling-and", "d_model = 1 and", "expected a column name at position 15, found the end"),
    ("double-operator", "d_model == = 1", "expected a value after '=='"),
    ("empty-in-list", "d_model in ()", "expected a value after '('"),
    ("in-without-parens", "d_model in 1, 2", "expected '(' after 'in'"),
    ("bad-suffix", "params < 2m", "malformed number '2m'"),
    ("hex-number", "d_model = 0x200", "malformed number '0x200'"),
    ("out-of-range", "loss < 1e999", "out of range"),
    ("equals-null", "reason = null", "compare with null using 'is null'"),
    ("is-value", "reason is 'x'", "expected 'null' after 'is'"),
]


@pytest.mark.parametrize(("where", "message"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_a_hostile_or_malformed_filter_exits_2_and_changes_nothing(db, where, message):
    before = _files(db.parent)
    error = _one_error_line(trials(db, "--where", where, "--format", "csv"))
    assert message in error, error
    assert _files(db.parent) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--study", "nope"], "error: unknown study 'nope' in sqlite:///"),
        (["--study", "x'\n; DROP TABLE archsearch_trials"],
         r"""error: unknown study "x'\n; DROP TABLE archsearch_trials" in sqlite:///"""),
        (["--format", "xml"], "error: unknown format 'xml'; valid: table, csv, json, parquet"),
        (["--format", "parquet"], "error: --format parquet is binary: give --output FILE"),
        (["--output", "x.txt"], "error: --output needs --format csv, json or parquet"),
        (["--sort", "-dmodel"], "error: unknown sort column '-dmodel' (did you mean 'd_model'?)"),
        (["--sort", "loss desc"], "error: unknown sort column 'loss desc'"),
        (["--limit", "-1"], "error: limit must be 0 or more, not -1"),
    ],
    ids=["unknown-study", "hostile-study", "unknown-format", "parquet-to-stdout", "table-to-file",
         "sort-typo", "sort-sql", "negative-limit"],
)  # fmt: skip
def test_bad_options_exit_2_and_change_nothing(db, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    before = _files(db.parent)
    assert _one_error_line(trials(db, *args)).startswith(message)
    assert _files(db.parent) == before and list(tmp_path.iterdir()) == []


def test_an_unwritable_output_is_one_line(db, tmp_path):
    (tmp_path / "file").write_text("")
    result = trials(db, "--format", "csv", "--output", str(tmp_path / "file" / "x.csv"))
    assert _one_error_line(result).startswith(f"error: cannot write {tmp_path / 'file' / 'x.csv'}: ")


def test_a_missing_database_is_an_error_and_is_not_created(tmp_path):
    path = tmp_path / "none.db"
    result = runner.invoke(app, ["trials", "--study", "s", "--storage", f"sqlite:///{path}"])
    assert _one_error_line(result) == f"error: no database at {path}\n"
    assert list(tmp_path.iterdir()) == []


# --- output ----------------------------------------------------------------------------------------
WHERE = "d_model >= 256 or status = rejected"


def _normalised(frame: pd.DataFrame) -> pd.DataFrame:
    """Dtype-tolerant: every missing marker None, values as Python objects."""
    return frame.astype(object).where(frame.notna(), None)


def _read(fmt: str, path: Path) -> pd.DataFrame:
    if fmt == "csv":
        return pd.read_csv(path)
    if fmt == "json":  # not read_json: it would guess that the *_at columns (unix seconds) are dates
        return pd.DataFrame.from_records(json.loads(path.read_text()))
    return pd.read_parquet(path)


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_each_format_round_trips_through_pandas(db, tmp_path, fmt):
    out = tmp_path / "sub" / f"trials.{fmt}"
    result = trials(db, "--where", WHERE, "--sort", "-loss", "--format", fmt, "--output", str(out))
    assert result.exit_code == 0, result.output
    assert result.stdout == "" and result.stderr == f"wrote 6 trials to {out}\n"
    with Storage.open(f"sqlite:///{db}", create=False) as storage:
        expected = trials_frame(storage, "s", WHERE, sort="-loss", ranked=fmt == "json")
    got = _read(fmt, out)
    assert list(got["number"]) == [3, 1, 2, 4, 5, 6]
    pd.testing.assert_frame_equal(
        _normalised(got), _normalised(expected), check_dtype=False, check_exact=True
    )
    if fmt == "parquet":  # parquet keeps the nullable dtypes themselves
        pd.testing.assert_frame_equal(got, expected, check_dtype=False, check_column_type=False)


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_text_formats_go_to_stdout_without_output(db, tmp_path, fmt):
    out = tmp_path / f"t.{fmt}"
    assert trials(db, "--format", fmt, "--output", str(out)).exit_code == 0
    result = trials(db, "--format", fmt)
    assert result.exit_code == 0 and result.stdout == out.read_text()


def test_json_is_a_list_of_records_with_exact_values(db):
    result = trials(db, "--where", "trial = 2", "--format", "json")
    [record] = json.loads(result.stdout)
    assert (record["number"], record["activation"], record["loss"], record["reason"]) == (
        2,
        "swiglu",
        1.5,
        None,
    )
    assert record["step_time_s"] == 3e-3 and record["bias"] is False
    # The loss objective a front ranks (this study's is the plain loss), at the proxy's tokens: no
    # trial was promoted.
    assert (record["objective"], record["budget_tokens"]) == (1.5, record["tokens_trained"])


def test_the_table_shows_a_readable_subset(db):
    result = trials(db, "--where", "activation = swiglu", "--sort", "-d_model")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert (
        "3 trials of 's'" in lines[0] and "activation" in result.stdout and "config_json" not in result.stdout
    )
    rows = [line for line in lines if "swiglu" in line]
    assert [row.split("│")[1].strip() for row in rows] == ["4", "2", "0"]
    assert "out of memory" in rows[0]


def test_a_long_table_shows_its_first_rows_and_says_more_match(db, monkeypatch):
    monkeypatch.setattr(results_cli, "TABLE_ROWS", 2)
    result = trials(db)
    assert result.exit_code == 0 and "first 2 trials of 's'" in result.stdout
    assert result.stderr == "more trials match: use --limit N, --sort or --format csv\n"
    assert "more" not in trials(db, "--limit", "3").stderr  # an explicit limit is shown whole


def test_an_empty_table_says_so(db):
    result = trials(db, "--where", "d_model > 1G")
    assert result.exit_code == 0 and result.stdout == "no trials of 's' match\n"


def test_the_console_script_reports_a_bad_filter_in_one_line(db):
    exe = [sys.executable, "-m", "archsearch", "trials", "--study", "s", "--storage", f"sqlite:///{db}"]
    bad = subprocess.run([*exe, "--where", "d_model = 1; DROP TABLE archsearch_trials"], capture_output=True,
                         text=True)  # fmt: skip
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr == "error: unexpected character ';' at position 11\n"
    good = subprocess.run(
        [*exe, "--format", "csv", "--limit", "1"], capture_output=True, text=True, check=True
    )
    assert good.stdout.startswith("number,status,reason,attempts,vocab_size,")


def test_the_table_shows_every_searched_knob_head_layout_and_norm_placement_included(tmp_path):
    from archsearch.space import ArchConfig
    from tests.storage.test_query import SPEC

    def shape(n_kv_heads: int, norm_placement: str) -> ArchConfig:
        return ArchConfig(
            vocab_size=256, seq_len=64, d_model=128, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads,
            head_dim=32, d_ff=256, norm_placement=norm_placement,
        )  # fmt: skip

    path = tmp_path / "knobs.db"
    with Storage.open(f"sqlite:///{path}") as storage:
        storage.create_study("s", **SPEC)
        storage.add_trials(
            "s",
            [
                {"number": 0, "status": "complete", "config": shape(4, "pre"), "loss": 2.0},
                {"number": 1, "status": "complete", "config": shape(2, "post"), "loss": 2.1},
                {"number": 2, "status": "complete", "config": shape(1, "sandwich"), "loss": 2.2},
                {"number": 3, "status": "rejected", "reason": "params above the budget"},
            ],
        )
    result = trials(path)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("┃"))
    assert [c.strip() for c in header.strip("┃").split("┃")] == [
        "trial", "status", "d_model", "layers", "heads", "attention", "d_ff", "activation", "norm",
        "params", "FLOPs/token", "loss", "step time", "reason",
    ]  # fmt: skip
    rows = [[c.strip() for c in line.strip("│").split("│")] for line in lines if line.startswith("│")]
    assert [(r[0], r[4], r[5], r[8]) for r in rows] == [
        ("0", "4x32", "mha", "pre"), ("1", "4x32", "gqa:2", "post"), ("2", "4x32", "mqa", "sandwich"),
        ("3", "-", "-", "-"),
    ]  # fmt: skip
