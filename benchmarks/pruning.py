"""What multi-objective successive halving saves, and whether it changes the Pareto front.

The same search runs twice on a fixed seed: without pruning, then with it. A seeded random
sampler proposes the same shapes in the same order in both runs (it does not look at results),
and one worker keeps the order of rung decisions fixed, so the only difference is pruning.
Printed: training compute (tokens x training FLOPs per token) and wall time of each run, the
share saved, and both fronts (loss against forward FLOPs per token), with any member of the
unpruned front that pruning stopped.

    python benchmarks/pruning.py [--trials 16] [--tokens 60000] [--sampler random]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import tempfile
import time
from pathlib import Path

from archsearch.search.driver import SearchOptions, run_search
from archsearch.search.pool import start_local_ray
from archsearch.search.spec import parse_spec
from archsearch.storage import Storage

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny.toml"


def _run(url: str, text: str, trials: int, prune: bool, sampler: str) -> dict:
    spec = parse_spec(text, "tiny.toml", base_dir=EXAMPLE.parent)
    start = time.perf_counter()
    with Storage.open(url) as db:
        options = SearchOptions(study="bench", trials=trials, workers=1, sampler=sampler, prune=prune)
        summary = run_search(spec, db, options)
        records = [r for r in db.trials("bench") if r.status in ("complete", "pruned", "failed")]
    wall = time.perf_counter() - start
    compute = sum((r["tokens_trained"] or 0) * r["flops_train_per_token"] for r in records)
    return dict(
        wall=wall,
        compute=compute,
        counts=summary.progress.counts,
        front={
            r.number: (r["loss"], r["flops_forward_per_token"])
            for r in (summary.front.records if summary.front else ())
        },
        status={r.number: r.status for r in records},
        rung={r.number: r["pruned_rung"] for r in records},
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=60_000, help="proxy tokens per trial")
    parser.add_argument("--sampler", default="random", help="random keeps both runs on the same shapes")
    parser.add_argument("--min-trials", type=int, default=4, help="trials at a rung before it prunes")
    parser.add_argument("--smoke", action="store_true", help="a tiny run that checks the script works")
    parser.add_argument(
        "--address", help="a Ray cluster both runs join (default: each starts its own; --smoke starts one)"
    )
    args = parser.parse_args()
    if args.smoke:
        # Two steps of 4 sequences (a quarter of the example's batch): a check that the script
        # runs, not a measure of what pruning saves.
        args.trials, args.tokens, args.min_trials = 2, 1024, 1

    text = EXAMPLE.read_text()
    text = re.sub(r"(?m)^tokens = .*$", f"tokens = {args.tokens}", text)
    text = re.sub(r"(?m)^prune_min_trials = .*$", f"prune_min_trials = {args.min_trials}", text)
    # Without the example's promotion and its warm-up in tokens: this measures the first pass, as it did.
    text = re.sub(r"(?m)^(promote|warmup_tokens) = .*$", "", text)
    # One precision for both runs: "auto" measures bf16 against fp32 per process, and a busy
    # machine could tip that choice between the runs.
    precision = "fp32" if args.smoke else "bf16"  # the smoke run on any CPU, bf16-native or not
    text = re.sub(r"(?m)^device = .*$", 'device = "cpu"', text, count=1)
    text, pinned = re.subn(r'(?m)^precision = "\w+"', f'precision = "{precision}"', text, count=1)
    assert pinned, f"{EXAMPLE} pins no [proxy] precision"
    if args.smoke:  # no kernel profiling: the smoke run checks the script, not the times
        text = re.sub(r"(?m)^local = .*$", "local = false", text)
        # One held-out batch per evaluation: at two training steps, the default 8 are most of the work.
        text = re.sub(r"(?m)^tokens = .*$", r"\g<0>\neval_batches = 1", text, count=1)
        text = re.sub(r"(?m)^batch_size = .*$", "batch_size = 4", text)
    print(
        f"{args.trials} trials of examples/tiny.toml, {args.tokens:,} tokens, {args.sampler} sampler, seed 0"
    )
    with contextlib.ExitStack() as stack:
        if args.address:
            __import__("ray").init(address=args.address, log_to_driver=False)
            stack.callback(__import__("ray").shutdown)
        elif args.smoke:  # one Ray for both runs (each search joins it): the smoke run times nothing
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            start_local_ray(2, log_to_driver=False)
            stack.callback(__import__("ray").shutdown)
        compare(text, args.trials, args.sampler)


def compare(text: str, trials: int, sampler: str) -> dict:
    """Run the space file `text` without pruning, then with it, and print what pruning saved and
    whether the front changed; returns the figures (search_quality.py calls it too)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with tempfile.TemporaryDirectory() as tmp:
        runs = {
            prune: _run(f"sqlite:///{Path(tmp) / f'p{int(prune)}.db'}", text, trials, prune, sampler)
            for prune in (False, True)
        }
    off, on = runs[False], runs[True]
    for name, run in (("no pruning", off), ("pruning", on)):
        print(f"  {name:<11} compute {run['compute']:.3e} FLOP, wall {run['wall']:6.1f} s, {run['counts']}")
    saved, faster = 1 - on["compute"] / off["compute"], 1 - on["wall"] / off["wall"]
    print(f"  compute saved: {saved:.1%}; wall time saved: {faster:.1%}")
    same_shapes = off["status"].keys() == on["status"].keys()
    print(f"  same trial numbers in both runs: {same_shapes}")
    for name, run in (("no pruning", off), ("pruning", on)):
        points = ", ".join(
            f"#{n} ({loss:.3f}, {flops:.3g})" for n, (loss, flops) in sorted(run["front"].items())
        )
        print(f"  front, {name:<11} {points}")
    lost = sorted(n for n in off["front"] if on["status"].get(n) == "pruned")
    changed = set(off["front"]) != set(on["front"])
    print(f"  front changed: {changed}" + (f"; pruned members of the unpruned front: {lost}" if lost else ""))
    for n in lost:
        print(f"    #{n} pruned at rung {on['rung'][n]}")
    return dict(
        compute_saved=saved, wall_saved=faster, front_changed=changed, pruned_front_members=lost,
        counts={"no pruning": off["counts"], "pruning": on["counts"]},
    )  # fmt: skip


if __name__ == "__main__":
    main()
