"""The CLI stays a thin layer: no module under archsearch/cli/ over `MAX_LINES` lines.
A command that outgrows its module gets one of its own, or its work moves into the library."""

from __future__ import annotations

from pathlib import Path

import pytest

import archsearch.cli

MAX_LINES = 300
CLI = Path(archsearch.cli.__file__).parent
MODULES = sorted(CLI.rglob("*.py"))


def test_the_cli_package_has_modules_to_check():
    assert len(MODULES) >= 10, MODULES  # a wrong path would pass every check below vacuously


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(CLI).as_posix())
def test_no_cli_module_is_over_the_line_limit(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(CLI)} has {lines} lines; split it by concern"
