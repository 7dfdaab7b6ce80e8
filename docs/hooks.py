"""MkDocs hook: the generated reference pages (archsearch.cli.reference) are written into the
site at build time, so the CLI and space-file references always match the code."""

from __future__ import annotations

GENERATED = {
    "<!-- generated: cli -->": "cli_markdown",
    "<!-- generated: space-keys -->": "space_markdown",
}


def on_page_markdown(markdown: str, page, config, files) -> str:
    from archsearch.cli import reference

    for marker, name in GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, getattr(reference, name)())
    return markdown
