"""`archsearch report`: one HTML file to share what a study found.

The command line of `archsearch.results.report`, which gathers the page's records (`results.html`
renders and writes them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from archsearch.cli.common import StorageOpt, app, path_value
from archsearch.results.report import DEFAULT_MAX_ROWS  # light: torch, plotly and SQL load on use


@app.command()
def report(
    study: Annotated[list[str], typer.Option("--study", help="Study name; repeat to overlay studies.")],
    output: Annotated[
        Path,
        typer.Option("--output", "-o", help="The HTML file to write (e.g. report.html).", parser=path_value),
    ],
    loss: Annotated[
        str | None,
        typer.Option(
            help="The loss the fronts rank: proxy (as stored) or adjusted (the study's objective: "
            "extrapolated, credited for size), as in `pareto`. Default: the studies' own loss objective."
        ),
    ] = None,
    max_rows: Annotated[
        int,
        typer.Option(
            help="At most N trials in each study's table; the front is always in (the plot has all)."
        ),
    ] = DEFAULT_MAX_ROWS,
    storage: StorageOpt = None,
) -> None:
    """One self-contained HTML report of studies: front, trials, knee and its exports, validation,
    step breakdown, settings, devices and versions. Opens with no network (plotly is embedded).
    """
    from archsearch.fileio import check_writable
    from archsearch.results.html import write_report
    from archsearch.storage import Storage, database_files

    check_writable(output, inputs=database_files(storage))  # before the studies are read
    with Storage.open(storage, read_only=True) as db:
        path = write_report(db, study, output, loss=loss, max_rows=max_rows)
    typer.echo(f"wrote {path}", err=True)
