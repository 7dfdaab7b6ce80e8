"""The live search display: a rich bar with the ETA on a terminal, one plain line per finished
trial otherwise. Fed fixed snapshots, drawn on a console in memory, on a clock that stands still."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from archsearch.cli.progress import format_eta, search_display
from archsearch.search.driver import SearchProgress


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(200.0, "0:03:20"), (199.2, "0:03:20"), (0.0, "0:00:00"), (-3.0, "0:00:00"), (90061.0, "25:01:01"),
     (None, "-:--:--"), (float("nan"), "-:--:--"), (100 * 3600.0, "5 days"), (364 * 86400.0, "364 days"),
     (365 * 86400.0, "over a year"), (1e300, "over a year"), (float("inf"), "over a year")],
)  # fmt: skip
def test_format_eta(seconds, text):
    assert format_eta(seconds) == text


def _snapshots() -> list[SearchProgress]:
    """A 3-trial search on 1 worker: nothing finished, then one trial of 100 s, then all three."""

    def snap(counts, walls, elapsed):
        return SearchProgress(
            target=3, counts=counts, best_loss=1.25 if walls else None, front_size=len(walls),
            elapsed_s=elapsed, workers=1, wall_times_s=walls,
        )  # fmt: skip

    return [
        snap({"running": 1}, (), 1.0),
        snap({"running": 1}, (), 2.0),  # the count did not move: no new line
        snap({"complete": 1, "running": 1}, (100.0,), 101.0),
        snap({"complete": 3}, (100.0, 50.0, 150.0), 301.0),
    ]


def test_piped_each_finished_trial_is_one_plain_line_ending_with_the_eta():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False)
    with search_display(3, console=console) as update:
        for p in _snapshots():
            update(p)
    assert out.getvalue().splitlines() == [
        "[     1 s] 0/3 finished: 0 complete, 0 pruned, 0 failed, 0 rejected, 0 duplicate; 1 running; "
        "best loss -; front 0; ETA -:--:--",
        "[   101 s] 1/3 finished: 1 complete, 0 pruned, 0 failed, 0 rejected, 0 duplicate; 1 running; "
        "best loss 1.2500; front 1; ETA 0:03:20",
        "[   301 s] 3/3 finished: 3 complete, 0 pruned, 0 failed, 0 rejected, 0 duplicate; 0 running; "
        "best loss 1.2500; front 3; ETA 0:00:00",
    ]


def _drawn(snapshots: list[SearchProgress], clock) -> str:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=220, color_system=None)
    with search_display(3, console=console, clock=clock) as update:
        for p in snapshots:
            update(p)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # cursor moves


def test_on_a_terminal_the_bar_shows_the_eta_and_the_final_counts_stay():
    now = [1000.0]
    running = _snapshots()[:3]  # the bar's last frame: 1 of 3 finished, 2 left at 100 s each
    text = _drawn(running, lambda: now[0])
    assert re.search(r"search .*1/3 finished: 1 complete.*; 1 running; .* ETA 0:03:20", text), text
    assert "[   101 s]" not in text  # a bar, not the plain lines
    last = [line for line in text.splitlines() if line.strip()][-1]
    assert last.startswith("search: 1/3 finished: 1 complete") and "ETA" not in last, text


def test_the_bar_counts_the_eta_down_between_snapshots():
    now = [1000.0]
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=220, color_system=None)
    with search_display(3, console=console, clock=lambda: now[0]) as update:
        update(_snapshots()[2])  # ETA 200 s, set at t = 1000
        now[0] = 1150.0  # 150 s on, no trial finished: the last frame reads 50 s
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    frames = [line for line in text.splitlines() if "ETA" in line]
    assert frames and frames[-1].rstrip().endswith("ETA 0:00:50"), frames


def test_before_any_trial_finished_the_eta_is_unknown():
    text = _drawn(_snapshots()[:1], lambda: 0.0)
    assert re.search(r"0/3 finished: .* ETA -:--:--", text), text


def test_while_promotion_runs_the_line_counts_promotions_with_their_eta():
    from archsearch.search.promote_run import PromotionProgress

    out = io.StringIO()
    console = Console(file=out, force_terminal=False)
    search = _snapshots()[-1]  # the first pass is over: 3 of 3 finished
    with search_display(3, console=console) as update:
        update(search)
        update(PromotionProgress(search, done=0, running=2, planned=4, budget=4096, eta_s=400.0, rungs=2))
        update(PromotionProgress(search, done=1, running=1, planned=4, budget=4096, eta_s=300.0, rungs=2))
    assert out.getvalue().splitlines()[1:] == [
        "[   301 s] 3/3 finished: 3 complete, 0 pruned, 0 failed, 0 rejected, 0 duplicate; 0 running; "
        "best loss 1.2500; front 3; promotions 1/4 done, 1 running at 4,096 tokens (rung 1 of at most 2); "
        "ETA 0:05:00",
    ]
    text = _drawn([search, PromotionProgress(search, 1, 1, 4, 4096, 300.0)], lambda: 0.0)
    assert re.search(r"search .*; promotions 1/4 done, 1 running at 4,096 tokens.* ETA 0:05:00", text), text
    checks = PromotionProgress(search, 0, 2, 6, 2048, 100.0, checking=True)
    assert checks.promotion_line == "promotions 0/6 done, 2 running at 2,048 tokens (stall checks)"
