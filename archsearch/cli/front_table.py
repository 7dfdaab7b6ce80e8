"""A study's Pareto front as a terminal table (`pareto`, and `search` once it ends).

A study with promotions gets a "ranked at" column and a line saying at which budget its
contenders are ranked and how the shapes not promoted are placed (`promotion.ranking_line`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from archsearch.cli.common import fmt_value, long_cell, si, stdout

EXTRA_COLUMNS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "step_time": ("step time", lambda r: si(r["step_time_s"], "s")),
    "kv_bytes": ("KV B/token", lambda r: si(r["kv_cache_bytes_per_token"], "B")),
    "prefill_time": ("prefill", lambda r: si(r["prefill_time_s"], "s")),
    "decode_time": ("decode/token", lambda r: si(r["decode_time_s"], "s")),
}


def print_study_front(f: Any, long: dict[int, tuple[float, float, int]] | None = None) -> None:
    """The front as a table; with `long` (`Storage.long_run_losses`), a long-run loss column."""
    console = stdout()
    objectives = f.front.objectives
    title = f"Pareto front of {f.study!r}: {len(f.front.numbers)} of {len(f.trial_numbers)} complete trials"
    table = Table(title=title)
    adjusted = f.loss_rule is not None  # the front ranks the adjusted loss: show it beside the loss
    columns = ("", "trial", "shape", "params", "FLOPs/token", "loss", *(("adjusted",) if adjusted else ()))
    for column in (*columns, "bits/byte", "throughput"):
        table.add_column(column, justify="left" if column in ("", "shape") else "right")
    # Cost objectives beyond FLOPs, in the study's order: (objective, header, cell of a record).
    extra = [(o, *EXTRA_COLUMNS[o]) for o in objectives if o in EXTRA_COLUMNS]
    for _, header, _ in extra:
        table.add_column(header, justify="right")
    if long:
        table.add_column("long loss", justify="right")
    if f.ranking is not None:  # a study with promotions: the tokens each row's loss is ranked at
        table.add_column("ranked at", justify="right")
    for r, values in zip(f.records, f.front.values, strict=True):
        tps = f.throughput.get(r.number)
        speed = f"{si(tps[0])} tok/s {tps[1]}{' (model)' if tps[2] else ''}" if tps else "-"
        row = [
            "knee" if r.number == f.front.knee else "", str(r.number), escape(r.config.describe()),
            si(r["params_total"]), si(r["flops_forward_per_token"]), f"{f.ranked_loss(r):.4f}",
            *((f"{values[0]:.4f}",) if adjusted else ()), fmt_value(r["bits_per_byte"], ".3f"), speed,
        ]  # fmt: skip
        row += [render(r) for _, _, render in extra]
        if long:
            row.append(long_cell(long.get(r.number)))
        if f.ranking is not None:
            tokens = f.ranked_tokens(r.number)
            row.append((f"{tokens:,}" + (" est." if f.estimated(r.number) else "")) if tokens else "-")
        table.add_row(*row)
    console.print(table)
    ref = ", ".join(f"{x:.4g}" for x in f.front.reference)
    scale = " (log10 for " + ", ".join(o for o in objectives if o != "loss") + ")"
    axes = ", ".join(("adjusted loss" if adjusted and o == "loss" else o) for o in objectives)
    console.print(f"hypervolume {f.front.hypervolume:.4g} against reference ({ref}) in ({axes}){scale}")
    # A reference no trial beats (`--reference 0,0`) gives 0, which reads as an empty front: say why.
    if f.front.hypervolume == 0 and len(f.front.values):
        typer.echo(
            "note: no trial of the front is better than the reference point in every objective, so the "
            "hypervolume is 0: give a --reference past the front (default: from the trials)",
            err=True,
        )
    if adjusted:
        rule = escape(f.beta_rule or "")
        console.print(f"adjusted loss = {f.loss_rule.formula()}, beta: {rule}")
    if f.ranking is not None:
        from archsearch.search.promotion import ranking_line

        console.print(escape(ranking_line(f.ranking)))
