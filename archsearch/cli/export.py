"""`archsearch export`: a trial's shape in the files a real trainer reads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from archsearch.cli.common import StorageOpt, StudyOpt, app
from archsearch.errors import ConfigError


@app.command()
def export(
    study: StudyOpt,
    fmt: Annotated[str, typer.Option("--format", help="hf, litgpt, nanogpt or json.")],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Folder to create (absent or empty); all or nothing.")
    ],
    trial: Annotated[int | None, typer.Option(help="Export trial number N.")] = None,
    knee: Annotated[bool, typer.Option("--knee", help="Export the knee of the Pareto front.")] = False,
    best_under_flops: Annotated[
        str | None,
        typer.Option(help="Export the lowest-loss trial with forward FLOPs/token <= F (e.g. 1e9 or 2G)."),
    ] = None,
    front: Annotated[
        bool, typer.Option("--front", help="Export every front member to trial-N/ folders, plus index.json.")
    ] = False,
    exportable: Annotated[
        bool,
        typer.Option(
            "--exportable",
            help="Choose among the trials the format represents: the knee, best or front of those.",
        ),
    ] = False,
    storage: StorageOpt = None,
) -> None:
    """A trial's shape for a real trainer: Hugging Face config, litgpt YAML, nanoGPT GPTConfig or JSON.

    A shape the format cannot represent exactly is refused with the reason (exit 2, nothing
    written); --exportable picks among the trials it can represent instead. With --front the
    representable members are written and the refusals listed in index.json and on stderr; exit 2
    only when none is representable.
    """
    from archsearch.fileio import write_tree
    from archsearch.search.selection import Choice, export_plan, select
    from archsearch.storage import Storage

    choice = Choice(fmt, trial, knee, best_under_flops, front, exportable)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ConfigError(f"--output {output} exists and is not an empty folder")
    with Storage.open(storage, create=False) as db:
        selection = select(db, study, choice)
    plan = export_plan(selection, choice)
    for entry in plan.index:
        if entry["refused"] is not None:
            typer.echo(
                f"refused: trial {entry['number']} cannot be exported as {fmt}: {entry['refused']}", err=True
            )
        for note in entry["notes"]:
            typer.echo(f"note: trial {entry['number']}: {note}", err=True)
    write_tree(output, plan.tree)
    for entry in plan.index:
        if entry["folder"] is not None:
            where = output / entry["folder"] if entry["folder"] else output
            typer.echo(f"{where}: trial {entry['number']} as {entry['target']}")
