"""Results commands: Pareto fronts, the studies of a database, trial queries."""

from __future__ import annotations

import time
from collections import namedtuple
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from archsearch.cli.common import (
    JsonFlag,
    StorageOpt,
    StudyOpt,
    app,
    floats,
    long_cell,
    path_value,
    print_json,
    si,
    stdout,
)
from archsearch.fileio import check_writable, write_atomic

if TYPE_CHECKING:
    from archsearch.storage.query import TrialTable


@app.command()
def pareto(
    study: Annotated[list[str], typer.Option("--study", help="Study name; repeat to overlay studies.")],
    objectives: Annotated[
        str | None,
        typer.Option(help="loss,flops | loss,step_time | loss,flops,step_time (default: the study's)."),
    ] = None,
    reference: Annotated[
        str | None,
        typer.Option(
            help="Hypervolume reference point, one value per objective, e.g. 3.0,1e9 (default: the worst "
            "value over all the studies' trials plus 10%, of a decade for FLOPs and time)."
        ),
    ] = None,
    loss: Annotated[
        str | None,
        typer.Option(
            help="proxy: rank the proxy loss as stored; adjusted: the study's loss objective, "
            "loss + extrapolate x change - beta ln(params / 1M), with its \\[objectives].size_beta, else "
            'beta over the complete trials (docs/accuracy.md, "The loss objective"). Default: the '
            "study's loss objective."
        ),
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write a plot: FILE.png or FILE.html.", parser=path_value)
    ] = None,
    at_size: Annotated[
        str | None,
        typer.Option(
            help="Instead of the front: the laddered designs (`archsearch ladder`) ranked by the loss their "
            "law predicts at this many parameters (1.3B, 350M), with intervals."
        ),
    ] = None,
    tokens: Annotated[
        str | None,
        typer.Option(help="With --at-size: your training tokens (15T), for the joint law L(N, D)."),
    ] = None,
    storage: StorageOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """The Pareto front of a study: non-dominated trials along the front, the knee, the hypervolume."""
    if at_size is not None or tokens is not None:
        from archsearch.cli.predictions import pareto_at_size

        pareto_at_size(study, at_size, (objectives, reference, loss, plot), storage, as_json, tokens)
        return
    from archsearch.search.pareto import study_fronts
    from archsearch.space.objectives import parse_objectives
    from archsearch.storage import Storage, database_files

    names = parse_objectives(objectives) if objectives is not None else None  # "" is refused, not the default
    ref = floats(reference, "--reference") if reference is not None else None
    if plot is not None:
        check_writable(plot, inputs=database_files(storage))  # before the fronts are ranked and drawn
    with Storage.open(storage, read_only=True) as db:
        fronts = study_fronts(db, study, names, ref, loss)
        long = {s: db.long_run_losses(s) for s in study}
    if plot is not None:
        from archsearch.search.plots import plot_fronts

        plot_fronts(fronts, plot)
    if as_json:
        print_json([f.to_dict(long[f.study]) for f in fronts])
    else:
        from archsearch.cli.front_table import print_study_front

        for f in fronts:
            print_study_front(f, long[f.study])
    if plot is not None:
        typer.echo(f"wrote {plot}", err=True)


@app.command()
def studies(storage: StorageOpt = None, as_json: JsonFlag = False) -> None:
    """The studies in a trial database, with their trials by state."""
    from archsearch.storage import Storage
    from archsearch.trial import STATES

    with Storage.open(storage, read_only=True) as db:
        records = db.studies()
        runs = {s.name: db.search_runs(s.name) for s in records} if as_json else {}
    if as_json:
        print_json(
            [
                {
                    "name": s.name,
                    "objectives": list(s.objectives),
                    "created_at": s.created_at,
                    "trials": s.counts,
                    "runs": [asdict(r) for r in runs[s.name]],  # each driver's settings, as run
                }
                for s in records
            ]
        )
        return
    table = Table("study", "objectives", "created", *STATES)
    for s in records:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.created_at))
        table.add_row(s.name, ",".join(s.objectives), created, *(str(s.counts.get(k, 0)) for k in STATES))
    stdout().print(table if records else "no studies")


# ------------------------------------------------------------------------------------------------
TABLE_ROWS = 100  # a terminal table of a 100,000-trial study is unreadable and slow to fetch and draw


@app.command()
def trials(
    study: StudyOpt,
    where: Annotated[
        str | None,
        typer.Option(help='Filter, e.g. "activation = swiglu and d_model >= 512 and status = complete".'),
    ] = None,
    sort: Annotated[
        str | None, typer.Option(help="Column to sort by, -column for descending (default: trial number).")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="At most N trials, after filtering and sorting.")] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="table, csv, json (records) or parquet (needs --output).")
    ] = "table",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here, not stdout.", parser=path_value)
    ] = None,
    storage: StorageOpt = None,
) -> None:
    """A study's trials with their shape, costs, results, status and reason: filtered, sorted, exported.

    The filter language and the columns are in docs/guide/results.md ("archsearch trials") and
    `archsearch.storage.query`; user text is parsed, never evaluated.
    """
    from archsearch.storage import Storage, database_files
    from archsearch.storage.query import FORMATS, QueryError, trials_table

    if fmt != "table" and fmt not in FORMATS:
        raise QueryError(f"unknown format {fmt!r}; valid: table, {', '.join(FORMATS)}")
    if fmt == "table" and output is not None:
        raise QueryError("--output needs --format csv, json or parquet (the table is for the terminal)")
    if fmt != "table" and FORMATS[fmt].binary and output is None:
        raise QueryError(f"--format {fmt} is binary: give --output FILE")
    if output is not None:
        check_writable(output, inputs=database_files(storage))  # before the query runs
    # A table without --limit fetches one row more than it shows, to know whether more match.
    fetch = TABLE_ROWS + 1 if fmt == "table" and limit is None else limit
    with Storage.open(storage, read_only=True) as db:
        found = trials_table(db, study, where=where, sort=sort, limit=fetch, ranked=fmt == "json")
        long = db.long_run_losses(study) if fmt == "table" else {}
    if fmt == "table":
        more = limit is None and len(found) > TABLE_ROWS
        shown = replace(found, rows=found.rows[:TABLE_ROWS]) if more else found
        _print_trials(shown, study, more=more, long=long)
        return
    data = FORMATS[fmt].encode(found)
    if output is None:
        typer.echo(data.decode(), nl=False)
    else:
        write_atomic(output, data)  # an OSError names `output`: one line, exit 1 (cli.common)
        typer.echo(f"wrote {len(found):,} trials to {output}", err=True)


def _print_trials(
    found: TrialTable, study: str, more: bool, long: dict[int, tuple[float, float, int]] | None = None
) -> None:
    """A readable subset of the columns; csv, json and parquet carry all of them. With `long`
    (`Storage.long_run_losses`), a long-run loss column beside the proxy loss.

    The searched knobs each get a column: `heads` is n_heads x head_dim, `attention` the
    attention_layout knob as a space file writes it (mha, gqa:G, mqa), `norm` its placement.
    """
    from archsearch.space.search_space import layout_knob
    from archsearch.storage.query import missing

    def cell(*values: Any, render: Callable[..., str] = str) -> str:
        return "-" if any(missing(v) for v in values) else escape(render(*values))

    def nats(v: float) -> str:
        return f"{v:.4f}"

    # header -> the cell of a row (a namedtuple of the table's columns)
    columns: dict[str, Callable[[Any], str]] = {
        "trial": lambda r: cell(r.number), "status": lambda r: cell(r.status),
        "d_model": lambda r: cell(r.d_model), "layers": lambda r: cell(r.n_layers),
        "heads": lambda r: cell(r.n_heads, r.head_dim, render=lambda h, d: f"{h}x{d}"),
        "attention": lambda r: cell(r.n_heads, r.n_kv_heads, render=layout_knob),
        "d_ff": lambda r: cell(r.d_ff), "activation": lambda r: cell(r.activation),
        "norm": lambda r: cell(r.norm_placement),
        "params": lambda r: cell(r.params_total, render=si),
        "FLOPs/token": lambda r: cell(r.flops_forward_per_token, render=si),
        "loss": lambda r: cell(r.loss, render=nats),
        "step time": lambda r: cell(r.step_time_s, render=lambda v: si(v, "s")),
        "reason": lambda r: cell(r.reason),
    }  # fmt: skip
    if not found.rows:
        stdout().print(f"no trials of {escape(repr(study))} match")
        return
    table = Table(title=escape(f"{'first ' if more else ''}{len(found):,} trials of {study!r}"))
    left = ("status", "attention", "activation", "norm", "reason")
    for header in columns:  # on a narrow terminal the reason wraps; the numbers stay whole
        table.add_column(header, justify="left" if header in left else "right", no_wrap=header != "reason")
    if long:
        table.add_column("long loss", justify="right", no_wrap=True)
    row_type = namedtuple("Row", found.columns)  # type: ignore[misc]
    for row in map(row_type._make, found.rows):
        cells = [render(row) for render in columns.values()]
        if long:
            cells.append(long_cell(long.get(row.number)) if not missing(row.number) else "-")
        table.add_row(*cells)
    stdout().print(table)
    if more:
        typer.echo("more trials match: use --limit N, --sort or --format csv", err=True)


# ------------------------------------------------------------------------------------------------
