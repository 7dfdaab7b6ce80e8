"""Promotion on calibration set 3's tiny and wide blocks, replayed from resumed runs on 2 CPU cores
(the tiny CPU regime: 0.1-2M-parameter byte-level proxies).

`benchmarks/calibration.py` measured promotion by resuming each block's stored studies, whose
first pass put its warm-up in a fraction of the budget: no final state could be resumed, so every
rung trained afresh and a rung of 8x cost 8 proxy runs. The tiny example puts its warm-up in tokens
(`warmup_tokens`) and resumes. This benchmark trains the blocks' shapes that way: each shape at each
proxy seed is one chain of runs, 1x (the first pass: the studies' proxy, its 5% warm-up fixed at
12,000 tokens, under the search's stall rule) then 2x, 4x, 8x, each resumed from the last one's
kept state (`long_run` with `keep`; a shape retried for stalling trains each rung from step 0 at
the retry's settings), so a rung's loss is the one a promotion of that shape trains. One JSON
line per rung in `data/promotion_cal3.jsonl`, written as each finishes (the last line of a key
stands); a rerun trains nothing recorded.

It then replays promotion on them (`promotion.contenders`, `promotion.stall_checked` and
`promotion.climb`, as `promote_run` runs them, a stall check at seed s being that shape's first
pass at seed s; the other shapes placed by `PromotionRanking.place`) for each `[search] promote`
setting in `PLANS`, one study per block and proxy seed, and scores each front against the blocks'
10x references (seed 0, cosine, `fidelity_cal3.json`): front recall, the knee's regret against the
references' seed noise, and the tokens trained against every shape at 10x. Where a replay needs a
rung not recorded, it says which, and `--train` trains them.

    python benchmarks/promotion_cal3.py --first-pass        # every shape at 1x, 3 seeds (~30 min)
    python benchmarks/promotion_cal3.py --train             # the rungs the plans need
    python benchmarks/promotion_cal3.py                     # the replay, from the records (seconds)
    python benchmarks/promotion_cal3.py --smoke             # one tiny shape's chain to 2x, then a replay
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import math
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from archsearch.search import fidelity_stats as fs
from archsearch.search.promotion import PromoteSettings, climb, contenders, promotion_tokens, stall_checked
from archsearch.search.spec import load_spec
from archsearch.space.objectives import curve_change
from archsearch.storage import PromotionRanking
from archsearch.trial import retried_for_stalling

HERE = Path(__file__).resolve().parent
SET = HERE / "data" / "fidelity_cal3.json"
RECORDS = HERE / "data" / "promotion_cal3.jsonl"
BLOCKS = ("tiny", "wide")
SEEDS = (0, 1, 2)
# The blocks' proxy, objectives and loss rule (benchmarks/spaces/cal-tiny.toml: the tiny example's,
# its proxy pinned to fp32; the wide block's are the same), the proxy's 5% warm-up fixed in tokens
# as the tiny example's, on one thread.
_SPEC = load_spec(HERE / "spaces" / "cal-tiny.toml")
PROXY_TOKENS = _SPEC.proxy.tokens
OBJECTIVES = _SPEC.objectives
PROXY = {
    **{k: v for k, v in dataclasses.asdict(_SPEC.proxy).items() if k not in ("tokens", "seed", "warmup")},
    "warmup_tokens": round(_SPEC.proxy.warmup * PROXY_TOKENS),
    "threads": 1,
}


# The `[search] promote` settings replayed, beside no promotion: stall checks alone (cap 1), the
# tiny example's, its cap raised to 8x under PASHA's rule, the same contenders trained to the cap
# (rule "cap") with and without stall checks (`stall_seeds`, 2 by default).
PLANS = {
    "stall checks alone": PromoteSettings(cap=1, max_contenders=4),
    "the tiny example's": PromoteSettings(cap=2, max_contenders=4),
    "cap 8": PromoteSettings(cap=8, max_contenders=4),
    "cap 4, to the cap": PromoteSettings(cap=4, max_contenders=4, rule="cap"),
    "cap 8, to the cap, no stall checks": PromoteSettings(cap=8, max_contenders=4, rule="cap", stall_seeds=0),
    "cap 8, to the cap": PromoteSettings(cap=8, max_contenders=4, rule="cap"),
    "cap 8, to the cap, 3 contenders": PromoteSettings(cap=8, max_contenders=3, rule="cap"),
}
NO_PROMOTION = PromoteSettings(cap=1, stall_seeds=0)


def key(block: str, trial: int, seed: int, multiple: float) -> str:
    return f"{block}/{trial}/{seed}/{multiple:g}"


def load_records(path: Path = RECORDS) -> dict[str, dict[str, Any]]:
    """Every recorded rung by key; read under a shared lock, as the training workers append."""
    if not path.exists():
        return {}
    with path.open() as fh:
        fcntl.flock(fh, fcntl.LOCK_SH)
        lines = fh.read().splitlines()
    return {(r := json.loads(line))["key"]: r for line in lines if line.strip()}


def _append(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.write(json.dumps(row) + "\n")


def shapes_of(block: str) -> list[dict[str, Any]]:
    return [s for s in json.loads(SET.read_text())["shapes"] if s["block"] == block]


@dataclass(frozen=True)
class Chain:
    """One shape at one proxy seed, trained to `upto` x the proxy's `tokens` a rung at a time."""

    block: str
    shape: dict[str, Any]
    seed: int
    upto: float
    state: Path  # the kept state the next rung resumes from
    tokens: int
    out: Path  # the record, one line per rung
    done: frozenset[str]  # keys recorded when the chain was planned: skipped
    records: tuple[dict[str, Any], ...] = ()  # its rungs recorded then (the first pass's reason)


def chain(job: Chain) -> list[dict[str, Any]]:
    """Train a chain's rungs not yet recorded and append each rung's record as it ends. The first
    pass follows the search's stall rule (`long_run`'s "stall": a run still on the unigram plateau
    at half its budget is trained again with a 50% warm-up, `worker.stall_retry`); each longer rung
    resumes the last one's kept state, but a retried shape's, whose warm-up is a fraction of its
    budget, trains from step 0 at the retry's settings, as `promote_run` trains it. Returns them."""
    from archsearch.evaluators.settings import TrainSettings
    from archsearch.search.validate import long_run
    from archsearch.search.worker import stall_retry

    first = next((r for r in job.records if r["multiple"] == 1.0), None)
    retried = first is not None and retried_for_stalling(first["reason"])
    rows, multiple = [], 1.0
    while multiple <= job.upto:
        k = key(job.block, job.shape["trial"], job.seed, multiple)
        if k not in job.done:
            settings = dict(PROXY, seed=job.seed, tokens=int(job.tokens * multiple))
            request = {"config": job.shape["config"], "data": None, "cpus": 1}
            if retried:
                retry = dataclasses.asdict(stall_retry(TrainSettings(**settings)))
                request.update(settings=retry, checkpoint=False)
            else:
                request.update(settings=settings, checkpoint=str(job.state), keep=True, stall=multiple == 1.0)
            r = long_run(request)
            retried = retried or retried_for_stalling(r["reason"])
            row = {
                "key": k,
                "block": job.block,
                "trial": job.shape["trial"],
                "seed": job.seed,
                "multiple": multiple,
            }
            row.update({name: r[name] for name in ("val_loss", "val_curve", "status", "reason", "tokens")})
            row.update(resumed_tokens=r["resumed_tokens"], wall_time_s=r["wall_time_s"])
            _append(job.out, row)
            rows.append(row)
            if r["status"] != "complete":
                break
        multiple *= 2
    return rows


def train(
    wanted: Iterable[tuple[str, int, int, float]], folder: Path, workers: int = 2, out: Path = RECORDS,
    tokens: int = PROXY_TOKENS,
) -> None:  # fmt: skip
    """Train every (block, trial, seed, multiple) in `wanted` not yet recorded: one chain per shape
    and seed up to its largest multiple wanted, `workers` at a time, with progress and an ETA."""
    top: dict[tuple[str, int, int], float] = {}
    for block, trial, seed, multiple in wanted:
        top[(block, trial, seed)] = max(top.get((block, trial, seed), 0.0), multiple)
    done = load_records(out)
    todo = [
        (b, t, s, m)
        for (b, t, s), m in top.items()
        if any(key(b, t, s, x) not in done for x in _multiples(m))
    ]
    runs = sum(_cost(m, [x for x in _multiples(m) if key(b, t, s, x) in done]) for b, t, s, m in todo)
    print(f"{len(todo)} chains, {runs:g} proxy runs' tokens to train", flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    by_block = {b: {s["trial"]: s for s in shapes_of(b)} for b in {b for b, *_ in todo}}
    jobs = [
        Chain(
            b, by_block[b][t], s, m, folder / f"{b}-{t}-{s}.pt", tokens, out, frozenset(done),
            tuple(r for r in done.values() if (r["block"], r["trial"], r["seed"]) == (b, t, s)),
        )
        for b, t, s, m in todo
    ]  # fmt: skip
    start, trained = time.perf_counter(), 0.0
    with ProcessPoolExecutor(workers) as pool:
        for future in as_completed([pool.submit(chain, job) for job in jobs]):
            for r in future.result():
                trained += (r["tokens"] - (r["resumed_tokens"] or 0)) / tokens
                eta = (time.perf_counter() - start) / trained * max(0.0, runs - trained)
                print(
                    f"  {r['key']}: {r['val_loss']:.4f} ({r['status']}, {r['wall_time_s']:.0f} s); "
                    f"{trained:.0f}/{runs:g} runs, ETA {eta / 60:.0f} min",
                    flush=True,
                )


def _cost(upto: float, recorded: list[float]) -> float:
    """Proxy runs' tokens a chain to `upto` trains past the rungs `recorded` (resumed from the
    largest of them; from step 0 with none)."""
    return upto - max(recorded, default=0.0)


def _multiples(upto: float) -> list[float]:
    out, m = [], 1.0
    while m <= upto:
        out.append(m)
        m *= 2
    return out


def objective(shape: dict[str, Any], record: dict[str, Any]) -> float:
    """The blocks' loss objective of one run (their spaces' `loss_rule`)."""
    return _SPEC.loss_rule.value(record["val_loss"], curve_change(record["val_curve"]), shape["params_total"])


@dataclass(frozen=True)
class Outcome:
    recall: tuple[int, int]
    regret: float
    tokens: int  # first pass, stall checks and promotion, resumed
    contenders: tuple[int, ...]  # trial numbers
    budgets: tuple[int, ...]
    stopped: str
    checked: tuple[int, ...] = ()  # trial numbers stall-checked


class Missing(Exception):
    def __init__(self, keys: set[tuple[str, int, int, float]]) -> None:
        super().__init__(f"{len(keys)} rungs not recorded")
        self.keys = keys


def replay(block: str, seed: int, settings: PromoteSettings, records: dict[str, dict[str, Any]]) -> Outcome:
    """One study's promotion (block, proxy seed) replayed from the records, as `promote_run` runs
    it: the first pass's contenders, those whose first pass stalled checked at the settings'
    `check_seeds` (`stall_checked`: a check's record is that seed's first pass, stall rule and all)
    and the contenders chosen again, then climbed rung by rung under the settings' rule, each
    checked one shifted by its check, the others placed at the budget ranked
    (`PromotionRanking.place`). Raises `Missing` for rungs not recorded."""
    shapes = shapes_of(block)
    trials = [s["trial"] for s in shapes]
    lacking = {(block, t, seed, 1.0) for t in trials if key(block, t, seed, 1.0) not in records}
    if lacking:
        raise Missing(lacking)

    def run(i: int, at_seed: int, multiple: float) -> dict[str, Any]:
        return records[key(block, trials[i], at_seed, multiple)]

    first = np.array([objective(s, run(i, seed, 1.0)) for i, s in enumerate(shapes)])
    flops = np.array([s["flops_forward_per_token"] for s in shapes])
    target = np.array([next(r["val_loss"] for r in s["references"] if r["seed"] == 0) for s in shapes])
    numbers = list(range(len(shapes)))
    retried = [retried_for_stalling(run(i, seed, 1.0)["reason"]) for i in numbers]
    value, checks = first.copy(), settings.check_seeds(seed)
    checked: list[int] = []

    def choose() -> tuple[int, ...]:
        values_now = np.column_stack([value, flops])
        return contenders(numbers, values_now, OBJECTIVES, settings.margin_nats, settings.max_contenders)

    def check(chosen: list[int]) -> bool:
        need = {
            (block, trials[i], s, 1.0)
            for i in chosen
            for s in checks
            if key(block, trials[i], s, 1.0) not in records
        }
        if need:
            raise Missing(need)
        for i in chosen:
            value[i] = np.mean([first[i], *(objective(shapes[i], run(i, s, 1.0)) for s in checks)])
        checked.extend(chosen)
        return True

    chosen = stall_checked(choose, lambda i: bool(checks) and retried[i], check)
    assert chosen is not None  # `check` never stops
    shift = value - first

    def values(budget: int) -> dict[int, float] | None:
        m = budget / PROXY_TOKENS
        need = {(block, trials[i], seed, m) for i in chosen if key(block, trials[i], seed, m) not in records}
        if need:  # under the rule "cap" every rung to the cap is trained: ask for them at once
            raise Missing({(b, t, s, settings.cap if settings.rule == "cap" else m) for b, t, s, _ in need})
        return {i: objective(shapes[i], run(i, seed, m)) + float(shift[i]) for i in chosen}

    done = climb(settings, {i: float(value[i]) for i in chosen}, lambda m: round(PROXY_TOKENS * m), values)
    at = values(done.ranked_at) if done.ranked_at is not None else {}
    placed, _ = PromotionRanking.place(dict(enumerate(map(float, value))), at)
    ranked = np.array([placed[i] for i in numbers], dtype=float)
    # A search stops a stalled trial at half its budget and trains it again (1.5 proxy runs), and
    # promotes a retried shape from step 0 at each rung; the others resume. A stall check is judged
    # whole, as a seed repeat (`promotion.spent_tokens`): 2 proxy runs where it stalled.
    budgets = {i: list(done.budgets) for i in chosen}
    spent = promotion_tokens(PROXY_TOKENS, budgets, {i: not retried[i] for i in chosen})
    first_pass = round((len(shapes) + sum(retried) / 2) * PROXY_TOKENS)
    stalled = [retried_for_stalling(run(i, s, 1.0)["reason"]) for i in checked for s in checks]
    check_tokens = PROXY_TOKENS * (len(stalled) + sum(stalled))
    return Outcome(
        fs.front_recall(ranked, target, flops), fs.knee_regret(ranked, target, flops),
        first_pass + check_tokens + spent, tuple(trials[i] for i in chosen), done.budgets, done.stopped,
        tuple(trials[i] for i in checked),
    )  # fmt: skip


def report(
    plans: dict[str, PromoteSettings], records: dict[str, dict[str, Any]], seeds: tuple[int, ...]
) -> set:
    """Print each plan's replay; returns the rungs missing from the records."""
    data = json.loads(SET.read_text())
    shapes = data["shapes"]
    twice = [s for s in shapes if {0, 1} <= {r["seed"] for r in s["references"]}]
    noise = fs.seed_noise(
        [next(r["val_loss"] for r in s["references"] if r["seed"] == 0) for s in twice],
        [next(r["val_loss"] for r in s["references"] if r["seed"] == 1) for s in twice],
    )
    tenx = {
        b: sum(next(r["tokens"] for r in s["references"] if r["seed"] == 0) for s in shapes_of(b))
        for b in BLOCKS
    }
    print(
        f"promotion on calibration set 3 (tiny CPU regime), replayed from resumed runs; proxy seeds "
        f"{', '.join(map(str, seeds))}; knee regret against the references' seed noise {noise:.4f} nats; "
        "tokens: first pass and promotion over every shape at 10x"
    )
    missing: set = set()
    plans = {"no promotion": NO_PROMOTION, **plans}
    for name, settings in plans.items():
        recall, lines = [0, 0], []
        for block in BLOCKS:
            regrets, spent, info, held = [], [], [], [0, 0]
            for seed in seeds:
                try:
                    o = replay(block, seed, settings, records)
                except Missing as gap:
                    missing |= gap.keys
                    regrets.append(float("nan"))
                    continue
                held = [held[0] + o.recall[0], held[1] + o.recall[1]]
                regrets.append(o.regret)
                spent.append(o.tokens / tenx[block])
                checked = f"; checked {','.join(map(str, o.checked))}" if o.checked else ""
                if o.contenders and (settings.cap > 1 or o.checked):
                    rungs = ",".join(f"{b / PROXY_TOKENS:g}" for b in o.budgets) or "1"
                    chosen = ",".join(map(str, o.contenders))
                    info.append(f"seed {seed}: trials {chosen} to {rungs}x ({o.stopped}){checked}")
            regret = "/".join("?" if math.isnan(r) else f"{r:.3f}" for r in regrets)
            within = all(r <= noise for r in regrets)
            cost = f"{max(spent):.3f}" if spent else "?"
            recall = [recall[0] + held[0], recall[1] + held[1]]
            lines.append(
                f"    {block}: front recall {held[0]}/{held[1]}; knee regret by seed {regret}"
                f"{' (each within the noise)' if within else ''}; tokens <= {cost} of every shape at 10x"
            )
            lines.extend(f"      {line}" for line in info)
        complete = all("?" not in line for line in lines if line.startswith("    ") and "knee regret" in line)
        share = f"{recall[0]}/{recall[1]} ({recall[0] / recall[1]:.0%})" if complete and recall[1] else "?"
        rule = (
            ""
            if settings.cap == 1
            else f"cap {settings.cap:g}, rule {settings.rule}, at most {settings.max_contenders}; "
        ) + (f"stall checks at {settings.stall_seeds} seeds; " if settings.stall_seeds else "")
        print(f"  {name} ({rule}margin {settings.margin_nats:.3f}): front recall, blocks together, {share}")
        print("\n".join(lines))
    return missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first-pass", action="store_true", help="train every shape at 1x, every seed")
    parser.add_argument("--train", action="store_true", help="train the rungs the plans' replays need")
    parser.add_argument("--workers", type=int, default=2)
    state = Path(tempfile.gettempdir()) / "promotion_cal3"
    parser.add_argument("--state", type=Path, default=state, help="where chains keep their last state")
    parser.add_argument("--smoke", action="store_true", help="one tiny shape's chain to 2x at a tiny budget")
    args = parser.parse_args()
    start = time.perf_counter()
    if args.smoke:
        smoke()
    else:
        if args.first_pass:
            first = [(b, s["trial"], seed, 1.0) for b in BLOCKS for s in shapes_of(b) for seed in SEEDS]
            train(first, args.state, args.workers)
        records = load_records()
        missing = report(PLANS, records, SEEDS)
        while args.train and missing:
            train(sorted(missing), args.state, args.workers)
            records = load_records()
            missing = report(PLANS, records, SEEDS)
        if missing:
            print(f"{len(missing)} rungs not recorded (--train trains them): {sorted(missing)[:6]} ...")
    print(f"{time.perf_counter() - start:.1f} s")


def smoke() -> None:
    """A chain's two rungs at 1/60 of the budget into a scratch record (the second must resume the
    first's kept state), then the replay of the committed record."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "records.jsonl"
        shape = shapes_of("tiny")[0]
        train([("tiny", shape["trial"], 0, 2.0)], Path(scratch) / "state", 1, out, tokens=4096)
        one, two = sorted(load_records(out).values(), key=lambda r: r["multiple"])
        if (one["multiple"], two["multiple"]) != (1.0, 2.0) or two["resumed_tokens"] != one["tokens"]:
            raise SystemExit(f"smoke: the 2x rung did not resume the 1x state: {one}, {two}")
        print(f"smoke: trial {shape['trial']} at 1x {one['val_loss']:.4f}, 2x resumed {two['val_loss']:.4f}")
    report(PLANS, load_records(), SEEDS)


if __name__ == "__main__":
    sys.exit(main())
