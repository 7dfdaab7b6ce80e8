"""Search quality: hypervolume against trials for each sampler on the tiny space, and pruning's saving.

Each sampler runs `--seeds` searches of `examples/tiny.toml` (its proxy cut to `--tokens`, a
quarter by default) through the real driver (Ray workers, the trial database, rejected and
duplicate samples as in any search), without pruning, to `--trials` finished trials (random to
twice that: the target compares it at 2N). A proxy run is deterministic on the CPU (same shape,
same settings, same losses), so the workers of every search share one cache of outcomes keyed by
the shape and the proxy settings (`--cache`, JSON lines, kept between runs): a sampler is told
exactly what an uncached search would tell it, and each distinct shape is trained once.

Hypervolume: of the study's own objectives (the size-credited loss and forward FLOPs per token,
log-scaled, as `archsearch pareto` ranks them), against one reference point for all runs (the
worst of every complete trial of every run, plus the usual margin), after each finished trial in
the order the sampler asked for them. Printed per sampler: the mean and range over seeds at a few
trial counts; then how many trials random needs, on the mean, to reach the default sampler's
hypervolume at N (target: at least 2N).

Pruning (`--pruning`, the default): the random sampler on seed 0 with and without pruning at the
example's own proxy and rungs (`benchmarks/pruning.py`'s comparison: the same shapes in the same
order, so the only difference is pruning): the training compute saved (target at least 40%) and
whether the front changed.

    python benchmarks/search_quality.py [--trials 20] [--seeds 3] [--samplers tpe,nsga2,gp,random]
        [--workers 2] [--cache PATH] [--save results.json] [--no-pruning]
    python benchmarks/search_quality.py --smoke   # tiny runs that check the script works
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from archsearch.search.driver import SearchOptions, run_search
from archsearch.search.pareto import pareto_front, reference_point
from archsearch.search.pool import start_local_ray
from archsearch.search.samplers import SAMPLERS
from archsearch.search.spec import parse_spec
from archsearch.search.worker import TrialRequest, evaluate
from archsearch.storage import Storage
from archsearch.trial import COMPLETE, FINISHED, TrialOutcome

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pruning import compare as compare_pruning

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny.toml"
CACHE_ENV = "ARCHSEARCH_BENCH_OUTCOMES"
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "archsearch-search-quality-outcomes.jsonl"


def _key(request: TrialRequest) -> str:
    """What decides a proxy run's result: the shape, the proxy settings and the corpus."""
    text = json.dumps([request.config.to_json(indent=None), repr(request.proxy), request.data])
    return hashlib.sha256(text.encode()).hexdigest()


def _cached(path: Path, key: str) -> dict[str, Any] | None:
    if not path.exists():
        return None
    with path.open() as f:
        for line in f:
            if key in line:  # parse only the line that holds it: outcomes are kilobytes each
                entry = json.loads(line)
                if entry["key"] == key:
                    return entry["outcome"]  # type: ignore[no-any-return]
    return None


def cached_evaluate(request: TrialRequest, known: Any = None, board: Any = None) -> TrialOutcome:
    """`worker.evaluate` through the shared outcome cache (complete outcomes only: a failure is
    tried again). Unpruned searches only: a pruned outcome depends on the other trials."""
    path = Path(os.environ[CACHE_ENV])
    key = _key(request)
    hit = _cached(path, key)
    if hit is not None:
        return TrialOutcome.from_dict(hit)
    outcome = evaluate(request, known, board)
    if outcome.status == COMPLETE:
        line = json.dumps({"key": key, "outcome": outcome.to_dict()}) + "\n"
        with path.open("a") as f:  # one line per write, under a lock: workers append side by side
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(line)
    return outcome


def _search(spec_text: str, url: str, sampler: str, seed: int, trials: int, workers: int) -> dict[str, Any]:
    """One unpruned search; its finished trials in ask order as (number, status, credited loss, FLOPs)."""
    spec = parse_spec(spec_text, "tiny.toml", base_dir=EXAMPLE.parent)
    options = SearchOptions(
        study=f"{sampler}-{seed}", trials=trials, workers=workers, sampler=sampler, seed=seed, prune=False
    )
    start = time.perf_counter()
    with Storage.open(url) as db:
        summary = run_search(spec, db, options, evaluate_fn=cached_evaluate)
        records = db.trials(options.study)
    finished = []
    for r in records:
        if r.status not in FINISHED:
            continue
        loss = r["loss"] if r.status == COMPLETE else None
        if loss is not None:
            loss = spec.loss_rule.value(loss, r["loss_change"], r["params_total"])
        finished.append((r.number, r.status, loss, r["flops_forward_per_token"]))
    return dict(
        sampler=sampler, seed=seed, wall_s=time.perf_counter() - start, counts=summary.progress.counts,
        finished=finished, objectives=list(spec.objectives),
    )  # fmt: skip


def hypervolume_curve(run: dict[str, Any], reference: tuple[float, ...]) -> list[float]:
    """The hypervolume of the complete trials among the first k finished, for k = 1, 2, ..."""
    curve, numbers, values = [], [], []
    for number, status, loss, flops in run["finished"]:
        if status == COMPLETE and loss is not None:
            numbers.append(number)
            values.append((loss, flops))
        front = pareto_front(numbers, np.array(values), run["objectives"], reference) if numbers else None
        curve.append(front.hypervolume if front is not None else 0.0)
    return curve


def _at(curves: list[list[float]], k: int) -> list[float]:
    return [c[min(k, len(c)) - 1] for c in curves]


def report(runs: list[dict[str, Any]], trials: int, default: str) -> dict[str, Any]:
    every = [(loss, flops) for run in runs for _, s, loss, flops in run["finished"] if s == COMPLETE]
    reference = reference_point(np.array(every), runs[0]["objectives"])
    curves: dict[str, list[list[float]]] = {}
    for run in runs:
        curves.setdefault(run["sampler"], []).append(hypervolume_curve(run, reference))
    marks = sorted({max(1, trials // 4), max(1, trials // 2), trials, 2 * trials})
    print(f"hypervolume (loss credited for size x log10 FLOPs/token), reference {reference}:")
    print(f"  {'sampler':<8} {'seeds':>5}  " + "  ".join(f"{'at ' + str(k):>21}" for k in marks))
    for sampler, cs in curves.items():
        cells = []
        for k in marks:
            if min(len(c) for c in cs) < k:
                cells.append(f"{'-':>21}")
                continue
            at = _at(cs, k)
            cells.append(f"{statistics.mean(at):7.4f} ({min(at):.4f}-{max(at):.4f})")
        print(f"  {sampler:<8} {len(cs):>5}  " + "  ".join(cells))
    for run in runs:
        print(f"  {run['sampler']}, seed {run['seed']}: {run['counts']}, {run['wall_s']:.0f} s")
    result: dict[str, Any] = dict(reference=reference, curves=curves)
    if default in curves and "random" in curves:
        goal = statistics.mean(_at(curves[default], trials))
        random_mean = [statistics.mean(_at(curves["random"], k)) for k in range(1, 2 * trials + 1)]
        needed = next((k for k, hv in enumerate(random_mean, 1) if hv >= goal), None)
        said = f"{needed} trials" if needed else f"more than the {len(random_mean)} it ran"
        verdict = "met" if needed is None or needed >= 2 * trials else "not met"
        print(
            f"random needs {said} (mean over seeds) to reach {default}'s mean hypervolume at {trials} "
            f"({goal:.4f}); target at least {2 * trials}: {verdict}"
        )
        result.update(goal=goal, random_needs=needed, target_met=verdict == "met")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=20, help="N: finished trials per search (random: 2N)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--samplers", default="tpe,nsga2,gp,random")
    parser.add_argument(
        "--tokens", type=int, default=60_000,
        help="proxy tokens per trial (default a quarter of the example's 240,000: the comparison "
        "needs a few hundred shapes trained on 2 cores)",
    )  # fmt: skip
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="shared outcome cache (JSON lines)")
    parser.add_argument("--save", type=Path, help="write the runs and curves here as JSON")
    parser.add_argument("--no-pruning", dest="pruning", action="store_false")
    parser.add_argument(
        "--address", help="a Ray cluster the searches join (default: one local Ray started here)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny runs that check the script works")
    args = parser.parse_args()
    samplers = args.samplers.split(",")
    for name in samplers:
        SAMPLERS[name]  # an unknown sampler fails before any work
    text = EXAMPLE.read_text()
    # One precision everywhere (the example pins fp32: "auto" measures bf16 against fp32 in each
    # worker, and a busy machine could tip the choice between workers, mixing two objectives).
    text = re.sub(r"(?m)^device = .*$", 'device = "cpu"', text, count=1)
    text, pinned = re.subn(r'(?m)^precision = "\w+"', 'precision = "fp32"', text, count=1)
    assert pinned, f"{EXAMPLE} pins no [proxy] precision"
    if args.smoke:
        # Two steps of 4 sequences (a quarter of the example's batch) per trial; 2 trials (random 4).
        args.trials, args.seeds, args.workers, args.tokens = 2, 1, 1, 1024
        text = re.sub(r"(?m)^local = .*$", "local = false", text)
        text = re.sub(r"(?m)^batch_size = .*$", "batch_size = 4", text)
        text = re.sub(r"(?m)^prune_min_trials = .*$", "prune_min_trials = 1", text)
    text = re.sub(r"(?m)^tokens = .*$", f"tokens = {args.tokens}", text)
    # Without the example's promotion and its warm-up in tokens: this measures the first pass, as it did.
    text = re.sub(r"(?m)^(promote|warmup_tokens) = .*$", "", text)
    if args.smoke:  # one held-out batch per evaluation: at two training steps, 8 are most of the work
        text = re.sub(r"(?m)^tokens = .*$", r"\g<0>\neval_batches = 1", text, count=1)
    os.environ[CACHE_ENV] = str(args.cache)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    default = SearchOptions(study="x", trials=1).sampler
    runs = []
    with contextlib.ExitStack() as ray_up:
        if args.address:  # the cluster's workers were not started from here: they get the cache's path
            env = {"env_vars": {CACHE_ENV: os.environ[CACHE_ENV]}}
            __import__("ray").init(address=args.address, log_to_driver=False, runtime_env=env)
        else:
            start_local_ray(max(os.cpu_count() or 1, args.workers), log_to_driver=False)
        ray_up.callback(__import__("ray").shutdown)  # one Ray for every search
        with tempfile.TemporaryDirectory() as tmp:
            for sampler in samplers:
                n = 2 * args.trials if sampler == "random" else args.trials
                for seed in range(args.seeds):
                    url = f"sqlite:///{Path(tmp) / f'{sampler}-{seed}.db'}"
                    runs.append(_search(text, url, sampler, seed, n, args.workers))
                    print(f"  ran {sampler} seed {seed}: {runs[-1]['wall_s']:.0f} s", file=sys.stderr)
        if not args.smoke:  # the pruning runs start their own Ray, as benchmarks/pruning.py times them
            ray_up.close()
        print(
            f"{len(runs)} searches of examples/tiny.toml at {args.tokens:,} proxy tokens, no pruning, "
            f"{args.workers} workers; "
            f"outcome cache {args.cache}"
        )
        result = report(runs, args.trials, default)
        if args.pruning:
            print()
            trials = 2 if args.smoke else 16
            print(f"pruning: {trials} trials, random sampler, seed 0, the example's proxy and rungs")
            result["pruning"] = compare_pruning(text, trials, "random")
    if args.save:
        args.save.write_text(json.dumps({"runs": runs, **result}, indent=1))


if __name__ == "__main__":
    main()
