"""The light modules stay light (the space, costs and CLI import without torch or Ray) and the rooms
import downwards only."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest


def test_space_and_cli_import_without_torch_or_ray():
    code = (
        "import sys, archsearch.space, archsearch.cli; "
        "heavy = sorted({'torch', 'ray', 'optuna', 'pandas', 'sqlalchemy'} & set(sys.modules)); "
        "print(','.join(heavy))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


ROOT = Path(__file__).resolve().parents[1] / "archsearch"
SHARED = {"errors", "fileio", "registry", "trial", "units", "version"}  # helpers every room may import
# Room -> the archsearch rooms it may import (and SHARED).
ALLOWED = {
    "space": {"space"},
    "storage": {"space", "storage"},
    "evaluators": {"space", "evaluators"},
    "search": {"space", "storage", "evaluators", "search"},
    "results": {"space", "storage", "evaluators", "search", "results"},
    "cli": {"space", "storage", "evaluators", "search", "results", "cli"},
}


def _imported_rooms(path: Path) -> set[str]:
    """The archsearch rooms a module imports, at any depth (lazy and TYPE_CHECKING imports too)."""
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        rooms |= {n.split(".")[1] for n in names if n.startswith("archsearch.") and n.count(".") >= 1}
    return rooms - SHARED


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_imports_run_down_the_house_only(room):
    wrong = {
        f"{path.relative_to(ROOT)}: {', '.join(sorted(found - ALLOWED[room]))}"
        for path in sorted((ROOT / room).glob("*.py"))
        if (found := _imported_rooms(path)) - ALLOWED[room]
    }
    assert not wrong


def test_the_cli_holds_no_sql_and_no_numerics():
    for path in sorted((ROOT / "cli").glob("*.py")):
        text = path.read_text()
        assert not re.search(r"^\s*(import|from) (sqlalchemy|numpy)\b", text, re.M), path.name


@pytest.mark.parametrize("helper", sorted(SHARED))
def test_the_shared_helpers_import_no_room(helper):
    assert not _imported_rooms(ROOT / f"{helper}.py")
