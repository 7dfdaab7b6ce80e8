"""README stays true: its commands are the ones CI runs, and every CLI command is documented."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def code_lines() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", README)


def test_readme_opens_with_the_two_fresh_machine_commands():
    main_job, tests = code_lines()[:2]
    assert "pip install -e ." in main_job and "archsearch " in main_job
    assert 'pip install -e ".[test]"' in tests and tests.endswith("python -m pytest -q -n 2 --dist loadgroup")


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "ci:test-command" in ci
    marker = README.index("<!-- ci:test-command")
    assert README[marker:].split("\n")[2] == code_lines()[1]


def test_the_readme_is_a_front_door():
    assert len(README.splitlines()) <= 200
    assert "docs/images/front.png" in README and (ROOT / "docs" / "images" / "front.png").exists()


def test_every_command_option_and_space_key_is_documented():
    from archsearch.cli.reference import cli_markdown, commands, space_markdown
    from archsearch.search.spec import KEY_DOCS, key_reference

    names = [path for path, _ in commands()]
    assert "archsearch config new" in names and "archsearch search" in names
    undocumented = [path for path, command in commands() if not (command.help or "").strip()]
    undocumented += [
        f"{path} {param.opts[0] if param.param_type_name == 'option' else param.name}"
        for path, command in commands()
        for param in command.params
        if not (getattr(param, "help", None) or "").strip() and not getattr(param, "hidden", False)
    ]
    assert not undocumented, f"no help text: {undocumented}"
    reference = cli_markdown()
    assert all(f"## `{path}`" in reference for path in names)
    keys = key_reference()
    assert not [f"[{t}] {k}" for t, k, _, meaning in keys if not meaning], "space-file keys without a meaning"
    assert {f"{t}.{k}" for t, k, _, _ in keys} == set(KEY_DOCS), "KEY_DOCS names keys the schema lacks"
    assert all(f"| `{k}` |" in space_markdown() for _, k, _, _ in keys)


def test_every_page_in_the_site_navigation_exists():
    import yaml

    def files(node) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [f for item in node for f in files(item)]
        return [f for value in node.values() for f in files(value)]

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = files(config["nav"])
    assert pages and all((ROOT / "docs" / page).exists() for page in pages), pages
    on_disk = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert on_disk == set(pages), on_disk ^ set(pages)  # no page left out of the site
