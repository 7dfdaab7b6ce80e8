"""The ladder curves: each design's rungs, its fitted law and the law's 95% band, loss against size.

PNG through matplotlib, imported only here and only when a plot is asked for. The law is drawn solid
over the rungs and dashed beyond them (extrapolated), up to `reach` x the largest rung.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from archsearch.errors import ArchsearchError
from archsearch.fileio import write_atomic
from archsearch.results.ladder_fit import LadderFit

REACH = 4.0  # how far past the top rung the curves go: the distance benchmarks/ladder_accuracy.py checks


def plot_ladders(fit: LadderFit, path: str | Path, title: str = "", reach: float = REACH) -> Path:
    """Write the ladder curves of `fit` to `path` (.png); returns the path.

    Raises:
        ArchsearchError: another suffix, or matplotlib is not installed.
    """
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ArchsearchError(f"cannot plot ladders to {path.name!r}: use a .png file")
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
    except ImportError:
        raise ArchsearchError("PNG plots need matplotlib: pip install 'archsearch[plots]'") from None
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    for i, design in enumerate(fit.designs):
        color = f"C{i % 10}"
        sizes = np.array([p.n for p in fit.points if p.design == design])
        losses = np.array([p.loss for p in fit.points if p.design == design])
        ax.scatter(sizes, losses, color=color, s=22, zorder=3)
        inside = np.geomspace(sizes.min(), sizes.max(), 40)
        beyond = np.geomspace(sizes.max(), reach * sizes.max(), 20)
        ax.plot(inside, fit.loss(design, inside), "-", color=color, label=f"trial {design}")
        ax.plot(beyond, fit.loss(design, beyond), "--", color=color)
        if len(fit.boot):
            xs = np.concatenate([inside, beyond])
            bands = np.array(
                [[fit.predict(design, float(x)).low, fit.predict(design, float(x)).high] for x in xs]
            )
            ax.fill_between(xs, bands[:, 0], bands[:, 1], color=color, alpha=0.12, linewidth=0)
    ax.set_xscale("log")
    ax.set_xlabel("non-embedding parameters")
    ax.set_ylabel("held-out loss (nats / token)")
    ax.set_title(
        title or f"L(N) = {fit.e:.3f} + A_d N^-{fit.alpha:.3f}: rungs, fit (dashed: extrapolated), 95% band"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    write_atomic(path, buffer.getvalue())
    return path
