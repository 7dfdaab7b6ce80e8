"""`archsearch report` on studies built through the storage API (no Ray needed)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.storage import Storage
from tests.results.studies import small_study


@pytest.fixture
def url(tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    with Storage.open(url) as db:
        small_study(db, "a")
        small_study(db, "b", shift=-0.1)
    return url


def _run(*args: str):
    return CliRunner().invoke(app, ["report", *args])


def test_writes_one_html_file_and_says_where(url, tmp_path):
    out = tmp_path / "report.html"
    result = _run("--study", "a", "--study", "b", "--storage", url, "-o", str(out))
    assert result.exit_code == 0, result.output
    assert result.stdout == "" and result.stderr == f"wrote {out}\n"  # data in the file, messages on stderr
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "archsearch report: a, b" in page


def test_loss_ranks_the_fronts_as_pareto_does(url, tmp_path):
    out = tmp_path / "r.html"
    assert _run("--study", "a", "--storage", url, "-o", str(out), "--loss", "adjusted").exit_code == 0
    assert "the loss is adjusted: loss - " in out.read_text()
    assert _run("--study", "a", "--storage", url, "-o", str(out), "--loss", "proxy").exit_code == 0
    assert "the loss is adjusted" not in out.read_text()


def test_max_rows_cuts_the_table(url, tmp_path):
    out = tmp_path / "r.html"
    assert _run("--study", "a", "--storage", url, "-o", str(out), "--max-rows", "3").exit_code == 0
    assert "The table shows 3 of 6 trials" in out.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--study", "nope", "-o", "r.html"), "error: unknown study 'nope' in sqlite:///"),
        (
            ("--study", "a", "-o", "r.png"),
            "error: the report is one HTML file: give an output ending in .html",
        ),
        (("--study", "a", "--study", "a", "-o", "r.html"), "error: --study a given more than once"),
        (("--study", "a", "-o", "r.html", "--max-rows", "0"), "error: --max-rows must be at least 1, got 0"),
        (("--study", "a"), "error: Missing option '--output' / '-o'."),
        (("--study", "a", "-o", "r.html", "--loss", "best"), "error: --loss must be one of proxy, adjusted"),
    ],
    ids=["unknown-study", "not-html", "twice", "no-rows", "no-output", "bad-loss"],
)
def test_bad_input_is_one_line_and_exit_2(url, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    result = _run(*args, "--storage", url)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(message), result.stderr
    assert not (tmp_path / "r.html").exists()


def test_a_missing_database_is_one_line(tmp_path):
    result = _run(
        "--study", "a", "-o", str(tmp_path / "r.html"), "--storage", f"sqlite:///{tmp_path / 'no.db'}"
    )
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
