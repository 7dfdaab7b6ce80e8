"""The layout rules a newcomer relies on to find and trust code, held by tests.

- No module of `archsearch/` over `MAX_MODULE_LINES` lines (the CLI's tighter limit is held beside
  it, in `tests/cli/test_module_size.py`): a file that long holds several concerns.
- No import cycle between archsearch modules. Every `import` counts, wherever it sits: a lazy
  import inside a function still ties the two modules together, and only hides the cycle from the
  interpreter until some call order trips it.
- No private name (one leading underscore) imported from another archsearch package: a name that
  crosses packages is public, so it is named as such.
- No comment or docstring that cites a document or tracker outside the repository: the reason is
  written where it applies, and background lives in `docs/explanations/`.
- No two modules of one name in different packages unless they are one thing seen from two layers
  (`cli/report.py` is the command line of `results/report.py`), and then each one's docstring names
  the other's dotted path: a reader who opens one learns where the other half is, and two different
  things under one name get a name each instead.
- No test module imports a private name of another test module: what tests share lives in
  `tests/helpers.py` (and the other helper modules beside it) under a public name.
- `docs/explanations/code-layout.md` names every module of `archsearch/` (in backticks, by its name,
  its path or a dotted name in it): the page a newcomer reads first does not miss a room.

No rule has an allow-list: an exception is fixed, not listed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "archsearch"
MAX_MODULE_LINES = 800

CITATION = re.compile(r"BRIEF\.md|\b(issue|probe)s?\s+#?\d", re.IGNORECASE)


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


PATHS = sorted(PACKAGE.rglob("*.py"))
MODULES = {_module_name(path): path for path in PATHS}


def _package_of(module: str) -> str:
    """The package a module belongs to: itself for a package's `__init__`."""
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _imports(module: str) -> list[tuple[str, str]]:
    """(imported module, name or "") for every import statement of `module`, at any depth.

    `from pkg import name` imports the submodule `pkg.name` when there is one, else the name from
    `pkg`; relative imports are resolved against the module's package."""
    found = []
    for node in ast.walk(ast.parse(MODULES[module].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name in MODULES]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = _package_of(module).split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    found.append((f"{base}.{alias.name}", ""))
                elif base in MODULES:
                    found.append((base, alias.name))
    return found


GRAPH = {module: {imported for imported, _ in _imports(module)} - {module} for module in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_the_package_has_modules_to_check():
    assert len(PATHS) >= 50 and "archsearch.search.driver" in MODULES  # a wrong root passes vacuously


@pytest.mark.parametrize("path", PATHS, ids=_relative)
def test_no_module_is_over_the_line_limit(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{_relative(path)} has {lines} lines; split it by concern"


def test_the_cycle_finder_finds_a_cycle_and_only_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_imports_resolve_submodules_and_relative_names():
    assert "archsearch.space.config" in GRAPH["archsearch.space"]  # `from archsearch.space.config import`
    assert "archsearch.cli.shape" in GRAPH["archsearch.cli"]  # `from archsearch.cli import shape`
    assert "archsearch.version" in GRAPH["archsearch.space.export"]  # a function-level import counts


def test_no_import_cycle_between_modules():
    assert _cycles(GRAPH) == []


def _private_imports() -> set[tuple[str, str, str]]:
    return {
        (module, imported, name)
        for module in MODULES
        for imported, name in _imports(module)
        if name.startswith("_")
        and not name.startswith("__")
        and imported.startswith("archsearch.")
        and _package_of(imported) != _package_of(module)
    }


def test_no_private_name_is_imported_across_packages():
    assert sorted(_private_imports()) == []


def _private_test_imports() -> list[str]:
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests"):
                found += [
                    f"{_relative(path)}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    return found


def test_no_test_module_imports_another_s_private_names():
    assert _private_test_imports() == []


def test_the_citation_pattern_matches_what_it_is_for():
    for text in (
        "see BRIEF.md section 8",
        "(issue 26 probe 6)",
        "Issue 11's target",
        "probes 5, 7",
        "issue #3",
    ):
        assert CITATION.search(text), text
    for text in ("attached to an issue or", "a tissue 3", "the probe answered"):
        assert not CITATION.search(text), text


@pytest.mark.parametrize("path", PATHS, ids=_relative)
def test_no_comment_cites_an_outside_document_or_tracker(path):
    text = path.read_text(encoding="utf-8")
    cited = [f"{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if CITATION.search(line)]
    assert cited == [], "write the reason itself; background goes in docs/explanations/"


def _namesakes(modules: list[str]) -> list[list[str]]:
    """The groups of modules (not packages) that share a last name across different packages."""
    by_name: dict[str, list[str]] = {}
    for module in modules:
        by_name.setdefault(module.rpartition(".")[2], []).append(module)
    return [sorted(group) for _, group in sorted(by_name.items()) if len(group) > 1]


def _docstring(module: str) -> str:
    return ast.get_docstring(ast.parse(MODULES[module].read_text(encoding="utf-8"))) or ""


def test_the_namesake_finder_groups_modules_by_their_last_name_only():
    modules = ["a.cli.report", "a.results.report", "a.cli.shape", "a.space.shape_costs", "a.errors"]
    assert _namesakes(modules) == [["a.cli.report", "a.results.report"]]


def test_modules_that_share_a_name_name_each_other():
    modules = [name for name, path in MODULES.items() if path.name != "__init__.py"]
    unnamed = [
        f"{module} does not name {other}"
        for group in _namesakes(modules)
        for module in group
        for other in group
        if other != module and not re.search(rf"`{re.escape(other)}[`.]", _docstring(module))
    ]
    assert unnamed == [], (
        "modules of one name are one thing seen from two layers, each docstring naming the other's "
        "dotted path (`archsearch.results.report`); rename the ones that are different things:\n"
        + "\n".join(unnamed)
    )


LAYOUT_PAGE = ROOT / "docs" / "explanations" / "code-layout.md"


def _named_on(page: str, path: Path) -> bool:
    """Whether `page` names the module at `path` in backticks: `name`, `pkg/name.py`, `name.Thing`."""
    return re.search(r"`(?:\w+[/.])*" + re.escape(path.stem) + r"(?:\.\w+)*`", page) is not None


def test_the_module_finder_reads_names_paths_and_dotted_names_in_backticks():
    page = "the driver (`driver`), `search/spec.py`, `options.SearchOptions`; plain store, `stores`"
    found = [
        p.stem
        for p in map(Path, ["a/driver.py", "a/spec.py", "a/options.py", "a/store.py"])
        if _named_on(page, p)
    ]
    assert found == ["driver", "spec", "options"]


def test_the_code_layout_page_names_every_module():
    page = LAYOUT_PAGE.read_text(encoding="utf-8")
    missing = [_relative(p) for p in PATHS if p.name != "__init__.py" and not _named_on(page, p)]
    assert not missing, f"docs/explanations/code-layout.md does not name {missing}"
