"""Promotion replayed on public GPU runs: what it saves at equal ranking quality (Gemstones).

A search with promotion ranks every shape at a short first pass, picks the front's contenders
(`search.promotion.contenders`: the front of the loss objective against forward FLOPs, as the
examples' `minimize = ["loss", "flops"]`, the shapes within the margin of it, the knee's two
neighbours), and trains them on at 2x, 4x, ... the first pass's tokens up to the cap
(`PromoteSettings.multiples`), a rung at a time, until no two of them swap by more than the margin
between two budgets (`promotion.RULES["pasha"]`). Gemstones (22 shapes of 48M-2B, a constant
learning rate to 350B tokens, the loss every 2B tokens; `benchmarks/public_runs.py` loads them)
lets that be replayed without training: a budget's run is its curve read to that budget, so a
rung is the same run continued (resumed, as promotion does under a constant rate).

For each first pass (4B, 8B, 16B tokens), margin (0.02 nats, the public runs' seed noise, and
`AUTO_MARGIN`, the tiny CPU proxy's), cap (8x, 16x) and bound on the contenders (the default
`max_contenders`, and none), it prints the final ranking (contenders by
their loss objective at the budget promotion ranked them at, the others estimated there by their
first pass plus the contenders' median change, `PromotionRanking.place`, as the search's front
reads a promoted study) against the 350B losses: Spearman with its 95% bootstrap
interval, iso-size pairs ordered right (`public_runs.iso_pairs`), 350B-front members recalled
(`fidelity_stats.front_recall`, loss against FLOPs) and the knee's regret in nats; and the tokens
trained, beside (a) no promotion, (b) every shape at the cap's budget, (c) every shape at the
shortest budget on Gemstones' 2B grid whose ranking is as good on all three counts.

    python benchmarks/promotion_replay.py           # a few seconds on 2 CPU cores
    python benchmarks/promotion_replay.py --smoke   # seconds: one first pass, margin and cap
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from archsearch.search import fidelity_stats as fs
from archsearch.search.promotion import AUTO, HELD, PromoteSettings, climb, contenders, promotion_tokens
from archsearch.storage import PromotionRanking

sys.path.insert(0, str(Path(__file__).resolve().parent))
from public_runs import NOISE, SHIPPED, iso_pairs, load_gemstones, objective_values

OBJECTIVES = ("loss", "flops")  # the examples' front: the loss objective against forward FLOPs
FIRST_PASSES = (2, 4, 8)  # Gemstones evaluation intervals of 2B tokens: 4B, 8B, 16B
CAPS = (8.0, 16.0)
MARGINS = (NOISE, AUTO)  # the public runs' seed noise; the tiny CPU proxy's (`AUTO_MARGIN`)
BOUNDS = (PromoteSettings().max_contenders, None)  # the default bound on contenders; None: every one


@dataclass(frozen=True)
class Quality:
    """A ranking of the 22 shapes scored against their 350B losses."""

    spearman: fs.Estimate
    iso: tuple[int, int]  # iso-size pairs (ordered right, counted)
    recall: tuple[int, int]  # 350B-front members on the ranking's front (held, front size)
    regret: float  # the knee's 350B loss minus the best at its FLOPs or fewer, nats

    def at_least(self, other: Quality) -> bool:
        return (
            self.spearman.value >= other.spearman.value
            and self.iso[0] >= other.iso[0]
            and self.recall[0] >= other.recall[0]
        )


@dataclass(frozen=True)
class Replay:
    contenders: tuple[int, ...]
    budgets: tuple[int, ...]  # the rungs trained, in evaluation intervals
    ranked_at: int  # evaluation intervals every contender is ranked at
    held: bool  # PASHA's rule stopped it (else the cap did)
    values: np.ndarray  # the final ranking's loss objective per shape


class Gemstones:
    def __init__(self) -> None:
        self.shapes = load_gemstones()
        self.final = np.array([s.loss[-1] for s in self.shapes])
        self.params = np.array([s.params for s in self.shapes], float)
        self.flops = np.array([s.flops for s in self.shapes])
        self.grid = self.shapes[0].tokens  # tokens at each evaluation
        self.intervals = len(self.grid)

    def tokens(self, intervals: int) -> int:
        return int(self.grid[intervals - 1])

    @cache  # noqa: B019 - one instance per run, the values are immutable
    def objective(self, intervals: int) -> np.ndarray:
        """Every shape's loss objective from a run of `intervals` evaluation intervals."""
        return objective_values(SHIPPED, self.shapes, intervals)

    def quality(self, values: np.ndarray) -> Quality:
        return Quality(
            fs.rank_correlation(values, self.final),
            iso_pairs(values, self.final, self.params),
            fs.front_recall(values, self.final, self.flops),
            fs.knee_regret(values, self.final, self.flops),
        )

    @cache  # noqa: B019
    def uniform(self, intervals: int) -> Quality:
        return self.quality(self.objective(intervals))

    def replay(self, first: int, settings: PromoteSettings) -> Replay:
        """Promotion as the search runs it (`promote_run`), each rung read off the curves."""
        numbers = list(range(len(self.shapes)))
        values = self.objective(first)
        chosen = contenders(
            numbers, np.column_stack([values, self.flops]), OBJECTIVES, settings.margin_nats,
            settings.max_contenders,
        )  # fmt: skip

        def budget_of(multiple: float) -> int:
            budget = round(first * multiple)
            if budget > self.intervals:
                raise SystemExit(f"a {multiple:g}x rung of {first} intervals is past the 350B curves")
            return budget

        def read(budget: int) -> dict[int, float]:
            return {n: float(self.objective(budget)[n]) for n in chosen}

        done = climb(settings, {n: float(values[n]) for n in chosen}, budget_of, read)
        ranked_at = first if done.ranked_at is None else done.ranked_at
        at_budget = {n: float(self.objective(ranked_at)[n]) for n in chosen}
        placed, _ = PromotionRanking.place(dict(enumerate(map(float, values))), at_budget)
        ranked = np.array([placed[n] for n in numbers], dtype=float)
        return Replay(tuple(chosen), done.budgets, ranked_at, done.stopped == HELD, ranked)

    def promoted_tokens(self, first: int, replay: Replay, resumed: bool) -> int:
        """First pass plus promotion (`promotion.promotion_tokens`)."""
        budgets = {n: [self.tokens(b) for b in replay.budgets] for n in replay.contenders}
        extra = promotion_tokens(self.tokens(first), budgets, dict.fromkeys(replay.contenders, resumed))
        return len(self.shapes) * self.tokens(first) + extra

    def matching(self, target: Quality) -> int | None:
        """The shortest uniform budget (evaluation intervals) whose ranking is at least `target`."""
        return next((k for k in range(1, self.intervals + 1) if self.uniform(k).at_least(target)), None)


def row(label: str, tokens: float, base: float, q: Quality) -> str:
    rho = q.spearman
    return (
        f"    {label:42s} {tokens / 1e9:8,.0f}B {tokens / base:5.2f}x  {rho.value:.3f} "
        f"[{rho.low:.3f}, {rho.high:.3f}] {q.iso[0]:>5d}/{q.iso[1]:<3d} {q.recall[0]:>3d}/{q.recall[1]:<3d}"
        f" {q.regret:6.3f}"
    )


def report(g: Gemstones, firsts: tuple[int, ...], margins, caps: tuple[float, ...]) -> None:
    print(
        f"promotion replayed on {len(g.shapes)} Gemstones shapes (constant LR, loss every "
        f"{g.grid[0] / 1e9:.0f}B tokens to {g.grid[-1] / 1e9:.0f}B): loss objective {SHIPPED.formula()}, "
        f"front against forward FLOPs; rule pasha; scored against the loss at {g.grid[-1] / 1e9:.0f}B"
    )
    print(
        "  tokens: first pass + promotion, each rung resumed (a constant-rate run continued); x: over "
        "(a). iso: iso-size pairs right; front: 350B-front members on the ranking's front; regret: "
        "the knee's, nats"
    )
    for first in firsts:
        base = len(g.shapes) * g.tokens(first)
        print(f"  first pass at {g.tokens(first) / 1e9:.0f}B tokens:")
        head = f"{'plan':42s} {'tokens':>9s} {'x':>6s}  {'Spearman [95%]':22s} {'iso':>9s} {'front':>7s}"
        print(f"    {head} {'regret':>6s}")
        print(row("(a) no promotion", base, base, g.uniform(first)))
        for cap in caps:
            capped = round(first * cap)
            print(
                row(
                    f"(b) all at the {cap:g}x cap, {g.tokens(capped) / 1e9:.0f}B",
                    base * cap,
                    base,
                    g.uniform(capped),
                )
            )
        for margin, most in ((m, k) for m in margins for k in BOUNDS):
            # Caps that PASHA's rule never reached replay alike: one row for them.
            alike: dict[tuple[int, ...], list[float]] = {}
            replays = {}
            for cap in caps:
                r = g.replay(
                    first, PromoteSettings(cap=cap, margin=margin, max_contenders=most or len(g.shapes))
                )
                alike.setdefault(r.budgets, []).append(cap)
                replays[r.budgets] = r
            for budgets, same in alike.items():
                r = replays[budgets]
                q = g.quality(r.values)
                nats = PromoteSettings(margin=margin).margin_nats
                bound = f"<= {most}" if most else "all"
                label = f"promoted {bound}, margin {nats:.3f}, cap {'/'.join(f'{c:g}' for c in same)}x"
                print(row(label, g.promoted_tokens(first, r, True), base, q))
                chosen = list(r.contenders)
                before = fs.rank_correlation(g.objective(first)[chosen], g.final[chosen]).value
                after = fs.rank_correlation(r.values[chosen], g.final[chosen]).value
                print(
                    f"      {len(chosen)} contenders (shapes {', '.join(map(str, chosen))}); rungs "
                    f"{','.join(f'{g.tokens(b) / 1e9:.0f}' for b in r.budgets)}B, "
                    f"{'held' if r.held else 'capped'}, ranked at {g.tokens(r.ranked_at) / 1e9:.0f}B; "
                    f"Spearman among them {before:.3f} at the first pass, {after:.3f} promoted; "
                    f"{g.promoted_tokens(first, r, False) / 1e9:,.0f}B tokens were each rung trained afresh"
                )
                k = g.matching(q)
                if k is None:
                    print(f"    (c) no uniform budget up to {g.grid[-1] / 1e9:.0f}B ranks as well")
                else:
                    label = f"(c) all at {g.tokens(k) / 1e9:.0f}B, as good"
                    print(row(label, len(g.shapes) * g.tokens(k), base, g.uniform(k)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="the 8B first pass, margin 0.02, cap 8x")
    args = parser.parse_args()
    start, cpu = time.perf_counter(), time.process_time()
    g = Gemstones()
    if args.smoke:
        report(g, FIRST_PASSES[1:2], MARGINS[:1], CAPS[:1])
    else:
        report(g, FIRST_PASSES, MARGINS, CAPS)
    print(f"{time.perf_counter() - start:.1f} s, {time.process_time() - cpu:.1f} s of CPU")


if __name__ == "__main__":
    main()
