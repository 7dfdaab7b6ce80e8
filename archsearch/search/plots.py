"""Plots of Pareto fronts: loss against cost, every trial faded, the front drawn, the knee marked.

PNG through matplotlib, HTML (interactive, hover shows each trial's shape) through plotly; both
are imported only here and only when a plot is asked for. Several studies overlay in one figure.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from archsearch.errors import ArchsearchError
from archsearch.fileio import write_atomic
from archsearch.search.pareto import StudyFront

AXIS_LABELS = {"flops": "forward FLOPs per token", "step_time": "step time (s)"}
PLOT_FORMATS = (".png", ".html")


def _x_objective(front: StudyFront) -> str:
    # Cost on the x axis: FLOPs when searched, else step time. A third objective is not drawn.
    objectives = front.front.objectives
    return "flops" if "flops" in objectives else objectives[1]


def _y_label(fronts: Sequence[StudyFront]) -> str:
    # Several studies share one beta (`study_fronts`), so the first front's rule states it for all.
    rule = fronts[0].loss_rule
    if rule is None:
        return "held-out loss (nats / token)"
    return f"adjusted loss: {rule.formula()} (nats / token)"


def plot_fronts(fronts: Sequence[StudyFront], path: str | Path) -> Path:
    """Write the plot of `fronts` to `path` (.png or .html); returns the path.

    Raises:
        ArchsearchError: another suffix, or the plotting library is not installed.
    """
    path = Path(path)
    if path.suffix.lower() not in PLOT_FORMATS:
        raise ArchsearchError(f"cannot plot to {path.name!r}: use a .png or .html file")
    data = _png(fronts) if path.suffix.lower() == ".png" else _html(fronts)
    write_atomic(path, data)
    return path


def _series(front: StudyFront) -> tuple[int, list[float], list[float], list[float], list[float]]:
    j = front.front.objectives.index(_x_objective(front))
    xs_all, ys_all = list(front.trial_values[:, j]), list(front.trial_values[:, 0])
    xs_front, ys_front = list(front.front.values[:, j]), list(front.front.values[:, 0])
    return j, xs_all, ys_all, xs_front, ys_front


def _png(fronts: Sequence[StudyFront]) -> bytes:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        raise ArchsearchError("PNG plots need matplotlib: pip install 'archsearch[plots]'") from None
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    for i, front in enumerate(fronts):
        color = f"C{i}"
        j, xs_all, ys_all, xs_front, ys_front = _series(front)
        ax.scatter(xs_all, ys_all, s=14, color=color, alpha=0.2, linewidths=0)
        order = sorted(range(len(xs_front)), key=lambda k: xs_front[k])
        ax.plot(
            [xs_front[k] for k in order],
            [ys_front[k] for k in order],
            "-o",
            color=color,
            ms=5,
            label=f"{front.study}: front of {len(xs_front)} / {len(xs_all)} trials",
        )
        k = front.front.numbers.index(front.front.knee)
        ax.scatter(
            [front.front.values[k, j]],
            [front.front.values[k, 0]],
            marker="*",
            s=220,
            color=color,
            edgecolors="black",
            zorder=5,
            label=f"{front.study}: knee (trial {front.front.knee})",
        )
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # decades only: no overlapping labels
    ax.set_xlabel(AXIS_LABELS[_x_objective(fronts[0])])
    ax.set_ylabel(_y_label(fronts))
    ax.set_title("Pareto front: loss against cost (lower left is better)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _html(fronts: Sequence[StudyFront]) -> bytes:
    # The plotly library is embedded so the file opens offline.
    return front_figure(fronts).to_html(include_plotlyjs=True, full_html=True).encode("utf-8")


def front_figure(fronts: Sequence[StudyFront], labels: Mapping[str, Mapping[int, str]] | None = None) -> Any:
    """The interactive plot of `fronts` as a `plotly.graph_objects.Figure` (what `.html` writes).

    Args:
        fronts: one or more studies' fronts, overlaid.
        labels: study -> trial number -> hover text for the faded points of every complete
            trial (default: "trial N"); the front's points always show the member's shape.

    Raises:
        ArchsearchError: plotly is not installed.
    """
    try:
        import plotly.graph_objects as go
    except ImportError:
        raise ArchsearchError("HTML plots need plotly (a dependency): pip install plotly") from None
    fig = go.Figure()
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
    for i, front in enumerate(fronts):
        color = palette[i % len(palette)]
        j, xs_all, ys_all, xs_front, ys_front = _series(front)
        fig.add_trace(
            go.Scatter(
                x=xs_all,
                y=ys_all,
                mode="markers",
                name=f"{front.study}: all trials",
                marker=dict(color=color, opacity=0.25, size=6),
                text=[(labels or {}).get(front.study, {}).get(n, f"trial {n}") for n in front.trial_numbers],
            )
        )
        shapes = {r.number: r.config.describe() for r in front.records}
        order = sorted(range(len(xs_front)), key=lambda k: xs_front[k])
        fig.add_trace(
            go.Scatter(
                x=[xs_front[k] for k in order],
                y=[ys_front[k] for k in order],
                mode="lines+markers",
                name=f"{front.study}: front",
                marker=dict(color=color, size=9),
                line=dict(color=color),
                text=[
                    f"trial {front.front.numbers[k]}: {shapes.get(front.front.numbers[k], '')}" for k in order
                ],
            )
        )
        k = front.front.numbers.index(front.front.knee)
        fig.add_trace(
            go.Scatter(
                x=[front.front.values[k, j]],
                y=[front.front.values[k, 0]],
                mode="markers",
                name=f"{front.study}: knee (trial {front.front.knee})",
                marker=dict(symbol="star", size=18, color=color, line=dict(color="black", width=1)),
            )
        )
    fig.update_xaxes(type="log", title=AXIS_LABELS[_x_objective(fronts[0])])
    fig.update_yaxes(title=_y_label(fronts))
    fig.update_layout(title="Pareto front: loss against cost (lower left is better)", template="plotly_white")
    return fig
