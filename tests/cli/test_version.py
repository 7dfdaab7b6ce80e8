"""`archsearch --version`: the installed version, written once (pyproject.toml), read from metadata."""

from __future__ import annotations

import tomllib
from pathlib import Path

from typer.testing import CliRunner

from archsearch.cli import app

ROOT = Path(__file__).resolve().parents[2]


def test_version_prints_the_installed_version_and_exits_0():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    written = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert result.stdout == f"archsearch {written}\n"


def test_the_package_and_the_leaf_module_agree():
    import archsearch
    from archsearch.version import __version__

    assert archsearch.__version__ == __version__
