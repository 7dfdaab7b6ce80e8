"""Promotion: which shapes of a finished search contend for its front, the budgets they go on to,
when their ranking holds, and how a front ranked after it reads (pure functions; `promote_run`
trains them).

A search ranks every trial at one proxy budget; where that budget is short, the order among the
best shapes is noise, and longer training reorders them. Promotion spends more only on those few:
the front, the shapes within a noise margin of it on the loss objective, and the knee's nearest
neighbours, trained on at 2x, 4x, ... the proxy's tokens, a rung at a time, until their order holds
between two budgets (PASHA's rule, Bohdal et al. 2023: grow the budget only while the ranking of
the top still changes) or the cap is reached; or, under the rule "cap", to the cap whatever the
order, for shapes whose losses cross only late (`to_the_cap`).

Seed repeats (`seeds` > 1) train each contender at more proxy seeds too: at the proxy's own budget
the first pass is one seed and the others are promotions at that budget, and every longer rung is
trained at all of them. A contender's value at a budget is then its mean over the seeds, which
PASHA's rule compares between rungs and the front ranks. Where the proxy is short, the order among
the best shapes at one seed is partly that seed's luck, and a longer run at the lucky seed keeps
it: on the tiny CPU proxy, ranking the contenders by their mean over 3 seeds at the proxy's budget
raised front recall from 29/45 to 31/45 and removed a 1.56-nat knee regret, where longer budgets at
one seed changed nothing (docs/accuracy.md, "Seed repeats, built and trained").

Stall checks (`stall_seeds`, with one seed) spend seeds only where the first pass says a shape is
fragile: a contender whose first pass stalled and trained only on the stall retry is trained at
more seeds at the proxy's budget before any contender climbs, valued at its mean over them, and
the contenders are chosen again (`stall_checked`).

The margin is the loss objective's seed noise: two losses closer than it are ties. "auto" is
`AUTO_MARGIN`, the tiny proxy's pooled within-shape standard deviation over seeds 0-2 on the
14-shape calibration set (docs/accuracy.md, "The proxy: chosen by measured fidelity"); a proxy of
another regime should set its own (public runs of 48M-2B shapes show about 0.02 nats).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from archsearch.errors import ArchsearchError
from archsearch.registry import Registry
from archsearch.search.pareto import knee_index, pareto_mask, scaled
from archsearch.trial import INTERRUPTED, retried_for_stalling
from archsearch.units import SEED_MAX

if TYPE_CHECKING:
    from archsearch.storage import PromotionRanking, PromotionRecord

AUTO = "auto"
AUTO_MARGIN = 0.063  # nats: the tiny proxy's seed noise (module docstring)
KNEE_NEIGHBOURS = 2  # shapes off the front nearest the knee that contend too
MAX_CAP = 1024.0  # 2**10 x the proxy: past any use, and far from overflowing a token count
MAX_SEEDS = 64  # seeds per contender: past any use (3 measured), and a bound on the runs planned
# How promotion ended: its order held, it reached the cap, or it was stopped (INTERRUPTED, the
# trial state of the same name).
HELD, CAPPED = "held", "cap"


class PromoteError(ArchsearchError):
    """Promotion settings that cannot be used (a cap below 1, an unknown rule)."""

    def __init__(self, detail: str, key: str) -> None:
        super().__init__(f"{key}: {detail}")
        self.detail, self.key = detail, key


def order_holds(previous: Mapping[int, float], current: Mapping[int, float], epsilon: float) -> bool:
    """PASHA's stopping test on the contenders both budgets ranked: True when no pair of them is
    ordered one way at the previous budget and the other way at the current one, each by more than
    `epsilon` (pairs closer than that at either budget are ties: PASHA's soft ranking). Lower is
    better. Fewer than two contenders in common: True (nothing left to reorder)."""
    common = sorted(set(previous) & set(current))
    for i, a in enumerate(common):
        for b in common[i + 1 :]:
            before, after = previous[a] - previous[b], current[a] - current[b]
            if abs(before) > epsilon and abs(after) > epsilon and (before > 0) != (after > 0):
                return False
    return True


def to_the_cap(previous: Mapping[int, float], current: Mapping[int, float], epsilon: float) -> bool:
    """The rule "cap": never held, so every contender trains to the cap (successive halving's
    fixed top rung). Where the shapes' losses cross late, an order that holds between two short
    budgets says nothing of a longer one: on the tiny CPU proxy a pre-norm shape hardly closes on
    a post-norm one from 1x to 2x and draws level, at lower cost, by 8x, so PASHA's rule stops at
    2x with the post-norm shape at the knee (docs/accuracy.md, "Promotion on resumed runs")."""
    return False


# name -> test(previous, current, epsilon): True once the ranking holds and promotion may stop.
RULES: Registry[Callable[[Mapping[int, float], Mapping[int, float], float], bool]] = Registry(
    "promotion rule"
)
RULES.register("pasha", order_holds)
RULES.register("cap", to_the_cap)


def _consecutive(primary: int, offsets: range) -> tuple[int, ...]:
    """The proxy seeds `primary` + each of `offsets`, wrapping past SEED_MAX to 0."""
    return tuple((primary + i) % (SEED_MAX + 1) for i in offsets)


@dataclass(frozen=True)
class PromoteSettings:
    """A space file's `[search] promote = { cap, rule, margin, max_contenders, seeds, stall_seeds }`.

    Raises:
        PromoteError: a cap that is not a number in [1, MAX_CAP], an unknown rule, a margin that
            is neither "auto" nor a finite number >= 0, a `max_contenders` that is not a whole
            number >= 2, `seeds` that is not a whole number in [1, MAX_SEEDS], `stall_seeds` that
            is not a whole number in [0, MAX_SEEDS - 1].
    """

    cap: float = 4.0  # the largest budget, a multiple of the proxy's tokens
    rule: str = "pasha"  # a name in RULES
    margin: float | str = AUTO  # nats of the loss objective; "auto": AUTO_MARGIN
    # The most shapes promoted, those nearest the knee: without a bound the front and its margin
    # took 15-20 of Gemstones' 22 shapes; 8 kept the knee's regret at 0 for 27-31% fewer tokens
    # (docs/benchmarks.md, "promotion_replay").
    max_contenders: int = 8
    # Proxy seeds each contender is trained at, at every rung (`seed_list`); 1: the first pass's
    # seed alone. 3 seeds at the proxy's budget (cap 1) is the replay that ranked best on the tiny
    # CPU proxy (module docstring), for (seeds - 1) proxy runs per contender.
    seeds: int = 1
    # Proxy seeds more at which a contender whose first pass stalled is checked, at the proxy's
    # budget, before any contender climbs (`stall_checked`); 0: none. Only with one seed (`seeds`
    # repeats already average every contender's seeds). 2 found the tiny CPU proxy's one shape that
    # trains at 1 seed in 5, which one seed ranked the knee (docs/accuracy.md, "Stall checks").
    stall_seeds: int = 2

    def __post_init__(self) -> None:
        cap = self.cap
        if isinstance(cap, bool) or not isinstance(cap, int | float) or not (1 <= cap <= MAX_CAP):
            raise PromoteError(
                f"must be a number from 1 to {MAX_CAP:g} (x the proxy's tokens), got {cap!r}", "cap"
            )
        if not isinstance(self.rule, str) or self.rule not in RULES:
            raise PromoteError(f"unknown rule {self.rule!r}; valid: {', '.join(RULES)}", "rule")
        margin = self.margin
        number = isinstance(margin, int | float) and not isinstance(margin, bool)
        if margin != AUTO and not (number and math.isfinite(margin) and margin >= 0):
            raise PromoteError(f'must be "auto" or a number of nats >= 0, got {margin!r}', "margin")
        most = self.max_contenders
        if isinstance(most, bool) or not isinstance(most, int) or most < 2:
            raise PromoteError(
                f"must be a whole number >= 2 (the most shapes promoted), got {most!r}", "max_contenders"
            )
        seeds = self.seeds
        if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= MAX_SEEDS:
            raise PromoteError(
                f"must be a whole number from 1 to {MAX_SEEDS} (the proxy seeds each contender is "
                f"trained at), got {seeds!r}",
                "seeds",
            )
        checks = self.stall_seeds
        if isinstance(checks, bool) or not isinstance(checks, int) or not 0 <= checks < MAX_SEEDS:
            raise PromoteError(
                f"must be a whole number from 0 to {MAX_SEEDS - 1} (the proxy seeds more a contender "
                f"whose first pass stalled is checked at), got {checks!r}",
                "stall_seeds",
            )
        object.__setattr__(self, "cap", float(cap))
        if number:
            object.__setattr__(self, "margin", float(margin))

    @property
    def margin_nats(self) -> float:
        return AUTO_MARGIN if self.margin == AUTO else float(self.margin)

    @property
    def multiples(self) -> tuple[float, ...]:
        """The rungs, as multiples of the proxy's tokens: 2, 4, 8, ... below the cap, then the cap
        (none for a cap of 1)."""
        out, m = [], 2.0
        while m < self.cap:
            out.append(m)
            m *= 2
        return (*out, self.cap) if self.cap > 1 else ()

    @property
    def rungs(self) -> tuple[float, ...]:
        """Every rung trained, as multiples of the proxy's tokens: the proxy's own first where
        there are seed repeats (its extra seeds), then `multiples`."""
        return ((1.0,) if self.seeds > 1 else ()) + self.multiples

    def seed_list(self, primary: int) -> tuple[int, ...]:
        """The proxy seeds each contender is trained at, the first pass's (`primary`, the study's
        `[proxy].seed`) first: primary, primary + 1, ..., `seeds` of them, wrapping past SEED_MAX
        to 0 (consecutive seeds, so a seed repeat is the trial a study at that proxy seed trains)."""
        return _consecutive(primary, range(self.seeds))

    def check_seeds(self, primary: int) -> tuple[int, ...]:
        """The proxy seeds a stall check trains a contender at (`stall_checked`): primary + 1, ...,
        `stall_seeds` of them, as `seed_list` counts on; none with seed repeats (`seeds` > 1),
        which train every contender at several seeds already."""
        return () if self.seeds > 1 else _consecutive(primary, range(1, self.stall_seeds + 1))

    def to_dict(self) -> dict[str, Any]:
        return {
            "cap": self.cap,
            "rule": self.rule,
            "margin": self.margin,
            "max_contenders": self.max_contenders,
            "seeds": self.seeds,
            "stall_seeds": self.stall_seeds,
        }


@dataclass(frozen=True)
class Climb:
    """The rungs one promotion trained: their budgets in order, the largest one every contender
    completed (None: none did), and why it stopped (HELD, CAPPED or INTERRUPTED)."""

    budgets: tuple[int, ...]
    ranked_at: int | None
    stopped: str


def climb(
    settings: PromoteSettings,
    first: Mapping[int, float],
    budget_of: Callable[[float], int],
    train: Callable[[int], Mapping[int, float] | None],
) -> Climb:
    """Promote the contenders of `first` (trial number -> loss objective at the first pass) a rung
    at a time: `train(budget)` gives the loss objectives of those that completed the budget
    `budget_of(multiple)` (None: stopped), each its mean over the settings' seeds, and the
    settings' rule, comparing each rung with the one before, says when the order holds. With seed
    repeats the first rung is the proxy's own budget at the other seeds: it is always trained, and
    the rule compares the next with its means, not with the one seed of the first pass (two values
    at one budget are not a longer budget's test). The search (`promote_run`) and its replay on
    recorded curves (benchmarks/promotion_replay.py) both run this loop."""
    previous, budgets, ranked_at = dict(first), [], None
    for multiple in settings.rungs:
        budget = budget_of(multiple)
        current = train(budget)
        if current is None:
            return Climb(tuple(budgets), ranked_at, INTERRUPTED)
        budgets.append(budget)
        if set(current) == set(first):
            ranked_at = budget
        if multiple > 1 and RULES[settings.rule](previous, current, settings.margin_nats):
            return Climb(tuple(budgets), ranked_at, HELD)
        previous = dict(current)
    return Climb(tuple(budgets), ranked_at, CAPPED)


def stall_checked(
    choose: Callable[[], Sequence[int]],
    stalled: Callable[[int], bool],
    check: Callable[[Sequence[int]], bool],
) -> tuple[int, ...] | None:
    """The contenders once every one whose first pass stalled has been stall-checked: `choose()`
    the contenders (from the first passes as they stand, a checked trial's the mean over its
    seeds), `check` those of them that `stalled` and were not checked yet (trains them at the
    settings' `check_seeds`; False: stopped, and None is returned), and choose again, until no
    contender is left to check. A shape that trains at only some seeds falls back among the others
    and a shape of the front takes its place, which is checked in turn if it stalled too.

    Why: at the proxy's short warm-up some shapes stall at most seeds and train at a few (after
    the stall retry); ranked at a lucky seed such a shape can take the knee, and a longer run at
    that seed keeps the luck. Its 10x run, at the same warm-up fraction, stalls too (on the tiny
    CPU proxy a shape stalled at 4 seeds of 5 and at 10x, and one seed put it at the knee with a
    1.56-nat regret; docs/accuracy.md, "Stall checks")."""
    checked: set[int] = set()
    while True:
        chosen = tuple(choose())
        todo = [n for n in chosen if n not in checked and stalled(n)]
        if not todo:
            return chosen
        if not check(todo):
            return None
        checked.update(todo)


def contenders(
    numbers: Sequence[int],
    values: np.ndarray,
    objectives: Sequence[str],
    margin: float,
    most: int | None = None,
) -> tuple[int, ...]:
    """The trials promotion trains on: the front of `values` (n x m, minimised, the loss objective
    first); every trial that the front would no longer dominate were its loss `margin` lower (a
    tie within the noise); and the `KNEE_NEIGHBOURS` trials nearest the knee off the front (in the
    objectives scaled to [0, 1] over all trials, log10 for FLOPs and times), which the knee, the
    default pick, must beat at the longer budget too. At most `most` of them (None: all), the knee
    and those nearest it in the same scaled units: the knee is what a user takes, and a broad front
    within a wide margin would otherwise promote nearly every shape. In `numbers` order.
    """
    values = np.asarray(values, dtype=float).reshape(len(numbers), len(objectives))
    if not len(numbers):
        return ()
    on_front = pareto_mask(values)
    front = values[on_front]
    chosen = set(np.flatnonzero(on_front).tolist())
    for i in np.flatnonzero(~on_front):
        row = values[i].copy()
        row[0] -= margin
        if not np.isnan(row).any() and not any(np.all(f <= row) and np.any(f < row) for f in front):
            chosen.add(int(i))
    knee = int(np.flatnonzero(on_front)[knee_index(front, objectives)])
    v = scaled(values, objectives)
    low, high = np.nanmin(v, axis=0), np.nanmax(v, axis=0)
    unit = (v - low) / np.where(high > low, high - low, 1.0)
    distance = np.sqrt(((unit - unit[knee]) ** 2).sum(axis=1))
    off = [i for i in np.argsort(distance, kind="stable") if not on_front[i] and not np.isnan(distance[i])]
    chosen.update(int(i) for i in off[:KNEE_NEIGHBOURS])
    if most is not None and len(chosen) > most:
        nearest = sorted(chosen, key=lambda i: (np.nan_to_num(distance[i], nan=np.inf), numbers[i]))
        chosen = set(nearest[:most])
    return tuple(numbers[i] for i in sorted(chosen))


def ranking_line(ranking: PromotionRanking) -> str:
    """What a front of a study with promotions ranks, for the reader: the budget its contenders
    are ranked at (and over how many seeds, where more than one) and how the shapes not promoted
    are placed there (`PromotionRanking.place`: their first-pass value plus the contenders' median
    change, an estimate)."""
    proxy = ranking.proxy_tokens
    at_proxy = f"the proxy's {proxy:,} tokens" if proxy else "the proxy's budget"
    numbers = ", ".join(map(str, ranking.contenders))
    n = len(ranking.contenders)
    promoted = f"the {n} promoted contender{'s' if n != 1 else ''} (trial{'s' if n != 1 else ''} {numbers})"
    checked = ""
    if ranking.checked:
        many = len(ranking.checked) != 1
        seeds = max(len(m.seeds) for m in ranking.checked.values())
        checked = (
            f"; trial{'s' if many else ''} {', '.join(map(str, ranking.checked))}, whose first pass "
            f"stalled, by {'their' if many else 'its'} mean over {seeds} seeds there (stall checks)"
        )
    if not ranking.contenders:
        return f"ranked at {at_proxy} for every trial, none promoted yet{checked}"
    if ranking.budget is None:
        which = f"at all {ranking.seeds} seeds" if ranking.seeds > 1 else "past the proxy's"
        return (
            f"ranked at {at_proxy} for every trial: no budget {which} was completed by all of {promoted}"
            f"{checked}"
        )
    multiple = f" ({ranking.budget / proxy:g}x the proxy)" if proxy else ""
    seeds = f", each the mean of {ranking.seeds} seeds," if ranking.seeds > 1 else ""
    return (
        f"ranked at {ranking.budget:,} tokens{multiple}{seeds} for {promoted}; the other trials "
        f"estimated there: their value at {at_proxy} plus the contenders' median change{checked}"
    )


TENFOLD = 10  # the longer budget promotion's cost is set against: every trial trained at 10x


def promotion_tokens(
    proxy_tokens: int, budgets: Mapping[int, Sequence[int]], resumed: Mapping[int, bool]
) -> int:
    """The tokens promotion trained: each trial's promoted budgets (trial number -> budgets
    completed, tokens) cost the tokens past its previous budget (the proxy's before the first)
    where the trial resumed from its kept state (`resumed`), else the whole budget."""
    total = 0
    for number, trained in budgets.items():
        previous = proxy_tokens
        for budget in sorted(trained):
            total += budget - previous if resumed.get(number, False) else budget
            previous = budget
    return total


@dataclass(frozen=True)
class Spent:
    """What the complete promotions trained (`spent_tokens`): tokens, and how many of them resumed
    from a kept state, trained from step 0, or are of unknown start (stored before it was)."""

    tokens: int
    resumed: int
    afresh: int
    unknown: int = 0


def spent_tokens(
    proxy_tokens: int, complete: Sequence[PromotionRecord], resumable: Mapping[int, bool]
) -> Spent:
    """The tokens the `complete` promotions trained, as they ran: each its budget less the tokens it
    took over from a kept state (`PromotionRecord.resumed_tokens`; 0 when it trained from step 0,
    as it does when the state is missing or belongs to another run). A promotion stored without it
    counts as `promotion_tokens` plans it, resumed where its trial's settings keep a state
    (`resumable`, by trial number). A seed repeat trained again for stalling (its reason starts
    with `trial.STALLED`) trained its budget twice: the stalled run, judged whole, then the retry."""
    known = [p for p in complete if p.resumed_tokens is not None]
    budgets: dict[int, list[int]] = {}
    for p in complete:
        if p.resumed_tokens is None:
            budgets.setdefault(p.trial_number, []).append(p.budget_tokens)
    planned = promotion_tokens(proxy_tokens, budgets, resumable)
    tokens = sum(p.budget_tokens - int(p.resumed_tokens or 0) for p in known) + planned
    tokens += sum(p.budget_tokens for p in complete if retried_for_stalling(p.reason))
    resumed = sum(1 for p in known if p.resumed_tokens)
    return Spent(tokens, resumed, len(known) - resumed, len(complete) - len(known))
