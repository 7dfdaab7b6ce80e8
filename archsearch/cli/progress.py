"""Progress on stderr: rich bars on a terminal, plain lines otherwise. Measurement code reports
through callbacks; only the CLI draws."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


def search_text(p: Any) -> str:
    """A search's state in one line: trials by state, the best loss, the front's size."""
    from archsearch.trial import DUPLICATE, FINISHED, REJECTED, RUNNING

    promoting = getattr(p, "promotion_line", None)  # a `PromotionProgress`: over the search's last
    if promoting is not None:
        return f"{search_text(p.search)}; {promoting}"
    best = "-" if p.best_loss is None else f"{p.best_loss:.4f}"
    ended = ", ".join(f"{p.counts.get(s, 0)} {s}" for s in (*FINISHED, REJECTED, DUPLICATE))
    return (
        f"{p.finished}/{p.target} finished: {ended}; {p.counts.get(RUNNING, 0)} running; "
        f"best loss {best}; front {p.front_size}"
    )


def search_display(
    target: int, *, console: Console | None = None, clock: Callable[[], float] = time.monotonic
) -> contextlib.AbstractContextManager[Callable[[Any], None]]:
    """A search's progress (`SearchProgress` snapshots), counted in finished trials, with the ETA
    the finished trials' wall times give (`SearchProgress.eta_s`, `driver.search_eta`); then its
    promotion's (`promote_run.PromotionProgress`), counted in trials and promotions together, with
    the ETA to the promotion cap."""
    return live_display(
        "search", search_text, lambda p: (p.finished, getattr(p, "target", target)), eta=lambda p: p.eta_s,
        console=console, clock=clock,
    )  # fmt: skip


_YEAR_S = 365 * 86400


def format_eta(seconds: float | None) -> str:
    """`200.0` -> `0:03:20`, rounded up to the second (so `0:00:00` only once nothing is left);
    None or NaN (not known yet) -> `-:--:--`, as rich writes an unknown time. From 100 hours in
    days (`12 days`), from a year `over a year`: `search --trials 1e20` counted down 10**20 trials'
    worth of hours, digit by digit."""
    if seconds is None or math.isnan(seconds):
        return "-:--:--"
    if seconds >= _YEAR_S:
        return "over a year"
    whole = math.ceil(max(0.0, seconds))
    if whole >= 100 * 3600:
        return f"{math.ceil(whole / 86400)} days"
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


class _CountdownColumn(ProgressColumn):
    """The time left to the deadline the last update set (`task.fields["deadline"]`, on `clock`),
    counting down between updates: a search's updates come when trials end, minutes apart."""

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__()
        self.clock = clock

    def render(self, task: Task) -> Text:
        deadline = task.fields.get("deadline")
        return Text(format_eta(None if deadline is None else deadline - self.clock()), "progress.remaining")


def validate_display() -> contextlib.AbstractContextManager[Callable[[Any], None]]:
    """A validation's progress (`ValidateProgress` snapshots), counted in stored long runs."""

    def text(p: Any) -> str:
        failed = f", {p.failed} failed" if p.failed else ""
        return f"{p.done}/{p.total} long runs stored{failed}; {p.last}"

    return live_display("validate", text, lambda p: (p.done, p.total))


@contextlib.contextmanager
def live_display(
    label: str,
    describe: Callable[[Any], str],
    count: Callable[[Any], tuple[int, int | None]],
    *,
    eta: Callable[[Any], float | None] | None = None,
    console: Console | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Callable[[Any], None]]:
    """Progress of a long job on stderr, fed snapshots by the library's `on_update` callback.

    On a terminal: a bar with the elapsed time and an ETA, described by `describe(snapshot)`,
    whose last description stays on screen when the job ends. Otherwise (a log, a pipe): one line
    each time the count of finished work moves, ending with the ETA when `eta` gives one.

    Args:
        label: the job's name, e.g. "search".
        describe: a snapshot -> one line of state.
        count: a snapshot -> (work done, work in all or None while unknown).
        eta: a snapshot -> seconds left (None: not known yet); the bar counts it down between
            snapshots. Without it, the bar shows rich's estimate from the rate of `count`.
        console: where to draw (default: stderr); whether it is a terminal picks bar or lines.
        clock: the bar's clock for counting the ETA down (monotonic seconds).
    """
    console = Console(stderr=True) if console is None else console
    last: dict[str, Any] = {"done": None, "text": ""}
    if not console.is_terminal:

        def log_line(p: Any) -> None:
            done, _ = count(p)
            if done != last["done"]:
                last["done"] = done
                left = "" if eta is None else f"; ETA {format_eta(eta(p))}"
                typer.echo(f"[{p.elapsed_s:6.0f} s] {describe(p)}{left}", file=console.file)

        yield log_line
        return
    remaining = TimeRemainingColumn() if eta is None else _CountdownColumn(clock)
    columns = (
        TextColumn(f"{label} "), BarColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
        TextColumn("ETA"), remaining,
    )  # fmt: skip
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("starting Ray", total=None, deadline=None)

        def update(p: Any) -> None:
            done, total = count(p)
            last["text"] = describe(p)
            left = None if eta is None else eta(p)
            deadline = None if left is None else clock() + left
            bar.update(task, completed=done, total=total, description=escape(last["text"]), deadline=deadline)

        yield update
    if last["text"]:
        console.print(f"{label}: {escape(last['text'])}")  # the final counts stay on screen


class _TokensColumn(ProgressColumn):
    """`done/total tokens`, with `?` for a total not known yet: the bar starts before the first
    step reports one (rich's TextColumn would format None with `:,` and raise TypeError)."""

    def render(self, task: Task) -> Text:
        total = "?" if task.total is None else f"{int(task.total):,}"
        return Text(f"{int(task.completed):,}/{total} tokens")


@contextlib.contextmanager
def progress_bar(label: str) -> Iterator[Callable[[int, int, float, float], None] | None]:
    """A rich progress bar on stderr when it is a terminal; yields its update callback or None.

    The ETA is rich's estimate from the recent rate of tokens; for a seconds budget the total is
    itself the trainer's estimate, so the ETA is approximate there.
    """
    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    columns = (
        TextColumn(f"{label} "), BarColumn(), _TokensColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"), TextColumn("{task.fields[rate]:,.0f} tok/s"),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
    )  # fmt: skip
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(label, total=None, loss=float("nan"), rate=0.0)

        def update(done: int, total: int, loss: float, rate: float) -> None:
            bar.update(task, completed=done, total=total, loss=loss, rate=rate)

        yield update


@contextlib.contextmanager
def steps_bar(label: str) -> Iterator[Callable[[int, int, str], None] | None]:
    """A transient bar on stderr for counted work, e.g. kernels being timed; yields its callback
    `(done, total, what is running)`, or None when stderr is not a terminal."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    columns = (TextColumn(f"{label} "), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
               TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("", total=None)

        def update(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=escape(what))

        yield update
