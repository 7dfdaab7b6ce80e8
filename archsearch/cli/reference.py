"""The generated reference pages: every command and option from the Typer app itself, every
space-file key from the spec's own schema (`search.spec.key_reference`). docs/hooks.py writes them
into the site at build time, so the reference cannot drift from the code; tests/test_docs.py fails
when a command, option or key has no help text.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer

from archsearch.cli.common import app


def commands() -> Iterator[tuple[str, Any]]:
    """Every leaf command as ("archsearch group name", its click command), in --help order.
    (Typer carries its own copy of click, so commands and parameters are told apart by what they
    have, not by click's classes.)"""

    def walk(group: Any, prefix: str) -> Iterator[tuple[str, Any]]:
        for name, command in group.commands.items():
            if hasattr(command, "commands"):  # a sub-app
                yield from walk(command, f"{prefix} {name}")
            else:
                yield f"{prefix} {name}", command

    yield from walk(typer.main.get_command(app), "archsearch")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def cli_markdown() -> str:
    """The CLI reference: per command its usage, help and a table of its options."""
    out = ["# Command-line reference", "", "Generated from the CLI itself (`archsearch COMMAND --help`).", ""]
    for path, command in commands():
        ctx = command.context_class(command, info_name=path)
        out += [f"## `{path}`", "", f"`{command.get_usage(ctx).removeprefix('Usage: ')}`", ""]
        out += [_cell(command.help or ""), ""]
        rows = []
        for param in command.params:
            if param.param_type_name != "option" or param.hidden:
                continue
            names = ", ".join(f"`{n}`" for n in (*param.opts, *param.secondary_opts))
            default = "" if param.required or param.default in (None, False, ()) else f"`{param.default}`"
            rows.append(f"| {names} | {_cell(param.help or '')} | {default} |")
        for param in command.params:
            if param.param_type_name == "argument":  # typer keeps an argument's help on it
                out.append(f"- `{param.name.upper()}`: {_cell(param.help or '')}")
        out.append("")
        if rows:
            out += ["| option | meaning | default |", "|---|---|---|", *rows, ""]
    return "\n".join(out)


def space_markdown() -> str:
    """The space-file key reference: per table, each key's type and meaning."""
    from archsearch.search.spec import key_reference

    out = ["## Every key", "", "Generated from the schema (`archsearch.search.spec.key_reference`).", ""]
    table = None
    for name, key, kind, meaning in key_reference():
        if name != table:
            table = name
            out += ["", f"### `[{name}]`", "", "| key | type | meaning |", "|---|---|---|"]
        out.append(f"| `{key}` | {kind} | {_cell(meaning)} |")
    return "\n".join(out) + "\n"
