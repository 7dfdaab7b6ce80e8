"""What orchestration costs per trial, and what a second worker buys.

1. Overhead: a search of trials that do no work (the worker returns at once), so the wall time per
   trial is all dispatch (Ray), sampling and bookkeeping (Optuna ask / tell) and database writes.
   The example's budget is dropped here, so no sample is rejected (a rejected sample costs an
   ask / tell and two writes too).
   The same three parts are then timed alone, side by side, on the same kind of database.
2. Speed-up: one fixed set of real trials (a seeded random sampler, so both runs train the same
   shapes) with 1 worker and then 2, on the bundled corpus.

Ray is started once, before both parts, so its start-up (printed) is not charged to any trial.

    python benchmarks/search_overhead.py [--trials 50] [--real-trials 6] [--tokens 30000]
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from pathlib import Path

from archsearch.search.driver import SearchOptions, run_search
from archsearch.search.spec import parse_spec
from archsearch.search.worker import TrialRequest
from archsearch.space import preset
from archsearch.storage import Storage
from archsearch.trial import TrialOutcome

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny.toml"


def no_work(request, known=None, board=None):
    return TrialOutcome(status="complete", train={"val_loss": 1.0 + request.number % 7 / 10})


def _spec(
    tokens: int,
    sampler: str = "random",
    budget: bool = True,
    profile: bool = True,
    eval_batches: int | None = None,
    batch_size: int | None = None,
):
    text = EXAMPLE.read_text()
    if not budget:  # every sampled point valid: no rejected samples in the overhead
        text = re.sub(r"(?m)^params = .*$", "", text)
    text = re.sub(r"(?m)^tokens = .*$", f"tokens = {tokens}", text)
    if eval_batches is not None:
        text = re.sub(r"(?m)^tokens = .*$", rf"\g<0>\neval_batches = {eval_batches}", text, count=1)
    if batch_size is not None:
        text = re.sub(r"(?m)^batch_size = .*$", f"batch_size = {batch_size}", text)
    text = re.sub(r"(?m)^sampler = .*$", f'sampler = "{sampler}"', text)
    text = re.sub(r"(?m)^prune = .*$", "prune = false", text)
    # Without the example's promotion and its warm-up in tokens: this measures the first pass, as it did.
    text = re.sub(r"(?m)^(promote|warmup_tokens) = .*$", "", text)
    if profile is False:
        text = re.sub(r"(?m)^local = .*$", "local = false", text)
    return parse_spec(text, "tiny.toml", base_dir=EXAMPLE.parent)


def _search(url: str, spec, trials: int, workers: int, evaluate_fn=None) -> float:
    start = time.perf_counter()
    with Storage.open(url) as db:
        # The spec's own `prune = false` (`_spec`): the API's default would prune, and its pruning
        # actor, a Ray worker of its own, would start in every search.
        options = SearchOptions(study="bench", trials=trials, workers=workers, sampler="random",
                                prune=spec.defaults.prune)  # fmt: skip
        run_search(spec, db, options, evaluate_fn=evaluate_fn)
    return time.perf_counter() - start


def _parts(url: str, spec, n: int) -> dict[str, float]:
    """Each part of a trial's bookkeeping alone, per trial, in seconds."""
    import optuna
    import ray

    remote = ray.remote(no_work)
    request = TrialRequest(0, preset("byte-1m"), spec.proxy, spec.profile)  # what a search sends
    ray.get(remote.remote(request))  # a warm worker, as in a search
    start = time.perf_counter()
    for _ in range(n):
        ray.get(remote.remote(request))
    dispatch = (time.perf_counter() - start) / n

    with Storage.open(url) as db:
        meta = dict(spec_fingerprint="x", spec_source="", spec={}, objectives=("loss", "flops"))
        db.create_study("parts", **meta)
        sampler = optuna.samplers.RandomSampler(seed=0)
        study = optuna.create_study(
            study_name="parts", storage=db.optuna_storage(), directions=["minimize"] * 2, sampler=sampler
        )
        cfgs, ask_tell, writes = [], 0.0, 0.0
        for _ in range(n):
            t0 = time.perf_counter()
            trial = study.ask()
            try:
                cfg = spec.space.sample(trial)
            except Exception:
                cfg = None
            study.tell(trial, [1.0, 1.0])
            t1 = time.perf_counter()
            slot = db.claim_trial("parts", 10**9, 60)
            db.assign_trial(slot, number=trial.number, optuna_trial_id=trial._trial_id, params=trial.params,
                            config=cfg)  # fmt: skip
            db.start_attempt(slot, 60)
            db.finish_trial(slot, TrialOutcome(status="complete", train={"val_loss": 1.0}))
            t2 = time.perf_counter()
            ask_tell += t1 - t0
            writes += t2 - t1
            cfgs.append(cfg)
    return {"ray dispatch": dispatch, "optuna ask+sample+tell": ask_tell / n, "archsearch writes": writes / n}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=50, help="no-work trials for the overhead")
    parser.add_argument("--real-trials", type=int, default=6, help="trials for the speed-up")
    parser.add_argument("--tokens", type=int, default=30_000, help="proxy tokens per real trial")
    parser.add_argument("--storage", default=None, help="database URL (default: a temporary SQLite file)")
    parser.add_argument("--smoke", action="store_true", help="a tiny run that checks the script works")
    parser.add_argument("--address", help="a Ray cluster to join (default: a local one started here, 2 CPUs)")
    args = parser.parse_args()
    if args.smoke:
        # One step of 4 sequences (a quarter of the example's batch) per real trial.
        args.trials, args.real_trials, args.tokens = 3, 1, 512

    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    start = time.perf_counter()
    if args.address:
        ray.init(address=args.address, log_to_driver=False, configure_logging=False)
    else:
        ray.init(
            address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False
        )
    how = "join" if args.address else "start"
    print(f"ray {how}: {time.perf_counter() - start:.2f} s (once, not charged to trials)")
    with tempfile.TemporaryDirectory() as tmp:

        def url(name: str) -> str:
            return args.storage or f"sqlite:///{Path(tmp) / name}.db"

        spec = _spec(args.tokens, budget=False)
        wall = _search(url("overhead"), spec, args.trials, 1, no_work)
        print(f"\n1. overhead: {args.trials} no-work trials, 1 worker: {wall:.2f} s, "
              f"{wall / args.trials * 1e3:.1f} ms per trial")  # fmt: skip
        parts = _parts(url("parts"), spec, args.trials)
        for name, seconds in parts.items():
            print(f"   {name:<24} {seconds * 1e3:7.1f} ms per trial")
        print(f"   {'sum of the parts':<24} {sum(parts.values()) * 1e3:7.1f} ms per trial")

        # The example as it is, budget and all; the smoke run's one training step (of 4 sequences)
        # evaluates on one held-out batch (the default 8 would be most of its work).
        smoke = dict(profile=False, eval_batches=1, batch_size=4) if args.smoke else {}
        spec = _spec(args.tokens, **smoke)
        print(f"\n2. speed-up: {args.real_trials} real trials ({args.tokens:,} tokens each, random sampler)")
        times = {w: _search(url(f"real{w}"), spec, args.real_trials, w) for w in (1, 2)}
        for w, t in times.items():
            print(
                f"   {w} worker{'s' if w > 1 else ' '}: {t:6.1f} s, {t / args.real_trials:5.1f} s per trial"
            )
        print(f"   speed-up of 2 workers over 1: {times[1] / times[2]:.2f}x (cores: {os.cpu_count()})")
    ray.shutdown()


if __name__ == "__main__":
    main()
