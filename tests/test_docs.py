"""README stays true: its commands are the ones CI runs, and every CLI command is documented."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from archsearch.cli import app

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def code_lines() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", README)


def test_readme_opens_with_the_two_fresh_machine_commands():
    main_job, tests = code_lines()[:2]
    assert "pip install -e ." in main_job and "archsearch " in main_job
    assert 'pip install -e ".[test]"' in tests and tests.endswith("python -m pytest -q")


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "ci:test-command" in ci
    marker = README.index("<!-- ci:test-command")
    assert README[marker:].split("\n")[2] == code_lines()[1]


def test_every_command_is_documented():
    def leaves(group, prefix: str) -> list[str]:
        names = []
        for name, command in group.commands.items():
            if hasattr(command, "commands"):  # a sub-app
                names += leaves(command, f"{prefix}{name} ")
            else:
                names.append(f"{prefix}{name}")
        return names

    names = leaves(typer.main.get_command(app), "archsearch ")
    assert "archsearch config new" in names
    for name in names:
        assert name in README, name
