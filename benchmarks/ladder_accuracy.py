"""How well size ladders predict a design's loss 4x past their top rung (issue 23).

1. A tiny search (`archsearch search --space benchmarks/spaces/ladder-tiny-hf.toml`, examples/tiny-hf.toml
   as the committed study was searched), resumed if its study exists.
2. At least 8 designs: the study's Pareto front, then other complete trials spread over their
   parameter counts, one trial per design (`space.scale_candidates.design_choices`), each kept only when all
   its rungs and its 4x shape exist (`search.ladder_plan.rung_shape`).
3. A real run of each design at 2M parameters, its shape built as a rung's would be, at the same
   tokens per parameter, the same settings (`search.ladder_plan.ladder_settings`) and the same run
   function as a rung (`search.validate.long_run`); each run is appended to `real_runs.jsonl` in
   the work folder as it finishes, so a rerun trains only the missing ones, and keeps a checkpoint
   every 5 minutes (`checkpoints/` there), so a run stopped part-way goes on where it was.
4. Their ladders: `archsearch ladder --trial ... --top 500k --rungs 4 --tokens-per-param 20`
   (rungs of about 62k-500k parameters; 3 rungs from 125k when fewer than 8 designs can be built
   down to 62k), stored in the study's database and resumed like any ladder. `--batch-size B`
   trains the rungs and the real runs at B sequences per step instead of the proxy's;
   `--rung-batch-size R` trains the rungs at R instead (a recipe of small rungs at a smaller
   batch than the run they predict: docs/explanations/research-history.md).
5. The comparison: the law fitted over the ladders (`results.ladder.fit_study_ladders`) predicts
   each design's loss at its 2M shape; the median and worst absolute error of those predictions
   (relative to the real loss), how many real losses fall inside the 95% intervals, and the
   Spearman of the predicted ranking of the designs against the real one beside the proxy's own
   ranking (the stored proxy loss, and the study's size-adjusted loss objective), each with a 95%
   bootstrap interval over designs (`search.fidelity_stats`), and the ladder's paired difference
   against the proxy.

`--replicate TRIAL` (repeatable) also trains a second real run of that design with seed 1 (keyed
apart, appended to the same file): the seed-to-seed difference of the real loss, the noise floor
of any prediction of it, is printed and recorded beside the errors (`real_seed_noise`); the errors
stay measured against seed 0's run, as before.

Every step's command is printed; the record (commands, rungs, real runs, predictions, measures)
goes to `--out` (default benchmarks/data/ladder_accuracy.json) at the end. `--recorded-only`
trains no real run: the record measures the designs whose real runs are recorded (the ladders are
trained as usual), so a partial campaign can be read while the rest waits.

    python benchmarks/ladder_accuracy.py                 # hours on 2 cores: ~8 x 40M tokens at 2M
    python benchmarks/ladder_accuracy.py --tokens-per-param 5 --out /tmp/l5.json
    python benchmarks/ladder_accuracy.py --tokens-per-param 5 --batch-size 16 --rung-batch-size 4
    python benchmarks/ladder_accuracy.py --tokens-per-param 5 --batch-size 16 --rung-batch-size 4 \
        --designs 12 --replicate 30 --replicate 74  # their real runs' seed noise too
    python benchmarks/ladder_accuracy.py --smoke         # a toy space, tiny budgets: a minute or two
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

# Its steps run, and its Ray starts, as calibration.py's do.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration import archsearch, cpu_description, estimate, run, run_here, start_ray

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
OUT = DATA / "ladder_accuracy.json"
STUDY = "ladder-tiny-hf"
SMOKE_RESAMPLES = 50  # the bootstrap of the smoke's law: an interval to check, not to cite

# A toy space for --smoke: MHA only, so the smallest rungs of every design exist at 25k parameters.
SMOKE_SPACE = """
[model]
vocab_size = 256
seq_len = 32
d_model = [64, 128]
aspect_ratio = [32, 64]
activation = ["gelu", "swiglu", "geglu", "reglu"]
head_dim = [32]
[budget]
params = { max = 2e6 }
[proxy]
tokens = 2048
batch_size = 4
evals = 2
eval_batches = 1
device = "cpu"
precision = "fp32"
[profile]
local = false
[objectives]
minimize = ["loss", "flops"]
size_beta = 0.15
[search]
sampler = "random"
seed = 3
trials = 10
prune = false
"""


def design_key(cfg: Any) -> str:
    from archsearch.space.scale_candidates import design_choices

    return json.dumps({k: str(v) for k, v in design_choices(cfg).items()}, sort_keys=True)


def choose_designs(storage: Any, study: str, n: int, targets: tuple[int, ...], real: int) -> list[Any]:
    """`n` trials of distinct designs: the front first, then the rest spread over sizes; only those
    whose every rung and whose `real`-size shape can be built."""
    from archsearch.errors import ArchsearchError
    from archsearch.search.ladder_plan import rung_shape
    from archsearch.search.pareto import study_front
    from archsearch.trial import COMPLETE

    complete = [t for t in storage.trials(study, status=COMPLETE) if t.config is not None and t["loss"]]
    by_number = {t.number: t for t in complete}
    sf = study_front(storage, study)
    front = [by_number[m] for m in (sf.front.numbers if sf else ()) if m in by_number]
    others = sorted((t for t in complete if t not in front), key=lambda t: t["params_total"])
    # Spread: alternate from the small and the large end.
    spread = [others[i // 2] if i % 2 == 0 else others[-1 - i // 2] for i in range(len(others))]
    chosen, seen = [], set()
    for t in front + spread:
        key = design_key(t.config)
        if key in seen:
            continue
        try:
            for size in (*targets, real):
                rung_shape(t.config, size)
        except ArchsearchError as exc:
            print(f"trial {t.number}: left out: {exc}", flush=True)
            seen.add(key)
            continue
        seen.add(key)
        chosen.append(t)
        if len(chosen) == n:
            break
    return chosen


def _real_run(request: dict[str, Any]) -> dict[str, Any]:
    from archsearch.search.validate import long_run

    return long_run(request)


def real_runs(
    requests: dict[str, dict[str, Any]], cache: Path, workers: int, train: bool = True, here: bool = False
) -> dict[str, dict[str, Any]]:
    """Each request's result by key, trained unless `cache` holds it (or `train` is False);
    appended as each finishes. `here`: one after another in this process (the smoke's runs take a
    second or two each, less than a spawned worker's start, torch's import most of it)."""
    done: dict[str, dict[str, Any]] = {}
    if cache.exists():
        for line in cache.read_text().splitlines():
            entry = json.loads(line)
            done[entry["key"]] = entry["result"]
    todo = {k: r for k, r in requests.items() if k not in done}
    print(f"real runs: {len(todo)} {'to train' if train else 'left out'}, {len(requests) - len(todo)} "
          "recorded", flush=True)  # fmt: skip
    if not (todo and train):
        return done

    def record(key: str, result: dict[str, Any]) -> None:
        if result["status"] != "complete":
            print(f"real run {key[:12]} failed: {result['reason']}", flush=True)
            return
        with cache.open("a") as f:
            f.write(json.dumps({"key": key, "result": result}) + "\n")
        done[key] = result
        print(f"real run {key[:12]}: {result['val_loss']:.4f} ({result['wall_time_s']:.0f} s)", flush=True)

    if here:
        for key, request in todo.items():
            record(key, _real_run(request))
        return done
    # Spawned, not forked: a fork of a driver with Ray's threads running (the smoke's Ray, or
    # any joined here) can hang in the child on a lock one of those threads held.
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=spawn) as pool:
        futures = {pool.submit(_real_run, r): k for k, r in todo.items()}
        for future in as_completed(futures):
            record(futures[future], future.result())
    return done


def measures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Prediction errors and rank agreement with intervals; `rows` need predicted, real, proxy."""
    from archsearch.search import fidelity_stats as fs

    pred = np.array([r["predicted"] for r in rows])
    real = np.array([r["real"] for r in rows])
    err = np.abs(pred - real) / real
    inside = sum(r["low"] <= r["real"] <= r["high"] for r in rows)
    out: dict[str, Any] = {
        "designs": len(rows),
        "median_abs_error": float(np.median(err)),
        "worst_abs_error": float(np.max(err)),
        "inside_interval": [int(inside), len(rows)],
    }
    if len(rows) >= 3:
        predictors = {
            "ladder": pred,
            "proxy": np.array([r["proxy_loss"] for r in rows]),
            "proxy_adjusted": np.array([r["proxy_adjusted"] for r in rows]),
        }
        out["spearman"] = {k: fs.rank_correlation(v, real).to_dict() for k, v in predictors.items()}
        out["ladder_vs_proxy"] = fs.paired_difference(pred, predictors["proxy"], real).to_dict()
        out["ladder_vs_proxy_adjusted"] = fs.paired_difference(
            pred, predictors["proxy_adjusted"], real
        ).to_dict()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # The example as the committed study was searched (before it turned promotion on), so it resumes.
    parser.add_argument("--space", type=Path, default=ROOT / "benchmarks" / "spaces" / "ladder-tiny-hf.toml")
    parser.add_argument("--study", default=STUDY)
    parser.add_argument("--trials", type=int, default=60, help="finished trials of the search")
    parser.add_argument("--designs", type=int, default=8)
    parser.add_argument("--rungs", type=int, default=4, help="3 when fewer than --designs ladder at 4")
    parser.add_argument("--top", default="500k", help="the largest rung's parameters")
    parser.add_argument(
        "--spacing", type=float, default=2.0, help="each rung's size over the one below's (1.41421356: "
        "twice the rungs between the same sizes, with --rungs 7)"
    )  # fmt: skip
    parser.add_argument("--real", default="2M", help="the size of the real runs")
    parser.add_argument("--tokens-per-param", type=float, default=20.0)
    parser.add_argument(
        "--batch-size", type=int, default=None, help="sequences per step of every rung and real run "
        "(default: the study's proxy batch)"
    )  # fmt: skip
    parser.add_argument(
        "--rung-batch-size", type=int, default=None, help="sequences per step of every rung "
        "(default: --batch-size)"
    )  # fmt: skip
    parser.add_argument(
        "--recorded-only", action="store_true", help="train no real run; measure the recorded ones"
    )
    parser.add_argument(
        "--replicate", type=int, action="append", default=[], metavar="TRIAL",
        help="also a real run of this design with seed 1 (repeatable): the real loss's seed noise",
    )  # fmt: skip
    parser.add_argument("--workers", type=int, default=None, help="runs at once (default 2; --smoke 1)")
    parser.add_argument(
        "--address", default=None, help="a Ray cluster the search and the ladder join (default: each "
        "starts its own; --smoke starts one for both)"
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, default=None, help=f"the record (default {OUT.relative_to(ROOT)})"
    )
    parser.add_argument("--smoke", action="store_true", help="a toy space and tiny budgets")
    args = parser.parse_args()
    if args.workers is None:
        # The smoke's trials and rungs take a second each: a second worker would save little of that,
        # and its first task pays torch's import again (seconds of CPU on a shared host).
        args.workers = 1 if args.smoke else 2

    from archsearch.fileio import write_atomic
    from archsearch.results.ladder import fit_study_ladders
    from archsearch.search.ladder_plan import ladder_settings, rung_shape, rung_targets, rung_tokens
    from archsearch.space.costs import param_counts
    from archsearch.storage import Storage, shape_key
    from archsearch.units import parse_count

    work = Path(os.environ.get("ARCHSEARCH_LADDER_DIR", ROOT / ".calibration" / "ladder"))
    work.mkdir(parents=True, exist_ok=True)
    space, trials, designs, rungs = args.space, args.trials, args.designs, args.rungs
    top, real_size, ratio = (
        parse_count(args.top, "--top"),
        parse_count(args.real, "--real"),
        args.tokens_per_param,
    )
    out = args.out or OUT
    if args.smoke:
        space = work / "ladder-smoke.toml"
        space.write_text(SMOKE_SPACE)
        # The real runs at 2x the top rung, not the full mode's 4x: still past every rung, at a
        # quarter of the compute (half the parameters, half the tokens), the smoke's longest step.
        trials, designs, rungs, top, real_size, ratio = 10, 3, 3, 100_000, 200_000, 0.05
        out = args.out or work / "ladder_accuracy_smoke.json"
        args.study = "ladder-smoke"
    db = work / f"{args.study}.db"
    url = f"sqlite:///{db}"
    workers = str(args.workers)
    commands: list[str] = []
    # The smoke's steps run in this process, on one Ray started (or joined) here rather than one
    # each: a local start is most of a tiny step's time. The recorded commands leave the address out.
    ray_up = contextlib.ExitStack()
    join = ["--address", args.address] if args.address and not args.smoke else []
    if args.smoke:
        start_ray(ray_up, args.workers, args.address)

    def step(argv: list[str]) -> None:
        (run_here if args.smoke else run)(argv + join)
        commands.append(shlex.join(["archsearch", *argv[3:]]))

    step(archsearch(
        "search", "--space", str(space), "--study", args.study, "--storage", url, "--trials", str(trials),
        "--workers", workers, "--resume",
    ))  # fmt: skip
    with Storage.open(url, create=False) as storage:
        # Fewer rungs when too few designs can be built down to the smallest (a design's smallest
        # shape has a floor: one layer of its narrowest valid width plus the embeddings).
        for count in range(rungs, min(rungs, 3) - 1, -1):  # down to 3 rungs, or the 2 asked for
            targets = rung_targets(top, count, args.spacing)
            chosen = choose_designs(storage, args.study, designs, targets, real_size)
            if len(chosen) == designs:
                break
            print(f"{len(chosen)} designs ladder at {count} rungs; trying {count - 1}", flush=True)
        rungs = count
        if args.smoke and not args.replicate:
            args.replicate = [chosen[0].number]  # the smoke exercises the replicate too
        rule = storage.require_study(args.study).loss_rule
        proxy = storage.require_study(args.study).spec["proxy"]
        data_path = storage.require_study(args.study).spec.get("data")
    if len(chosen) < designs:
        raise SystemExit(f"ladder_accuracy: only {len(chosen)} designs can be laddered; run more --trials")
    unknown = sorted(set(args.replicate) - {t.number for t in chosen})
    if unknown:
        raise SystemExit(f"ladder_accuracy: --replicate {unknown[0]} is not one of the designs chosen")
    numbers = [a for t in chosen for a in ("--trial", str(t.number))]

    # The real runs first (the hours of the benchmark; each keeps a checkpoint, so a stopped run
    # goes on where it was): each design at `real_size`, built and trained as a rung would be.
    shapes = {t.number: rung_shape(t.config, real_size) for t in chosen}

    def real_request(cfg: Any, seed: int) -> tuple[str, dict[str, Any]]:
        """A real run's key (a seed other than 0 keyed apart) and its request."""
        settings = ladder_settings(proxy, rung_tokens(cfg, ratio), seed, args.batch_size)
        key = f"{shape_key(cfg)}-{settings['tokens']}-b{settings['batch_size']}" + (
            f"-s{seed}" if seed else ""
        )
        checkpoint = work / "checkpoints" / f"{key}.pt"
        return key, dict(
            config=cfg.to_dict(), settings=settings, data=data_path, cpus=1.0, checkpoint=str(checkpoint)
        )

    requests: dict[str, dict[str, Any]] = {}  # seed 0's real runs, by key: the rows below
    seed_1: dict[str, dict[str, Any]] = {}  # the --replicate designs' second runs, by key
    replicas: dict[int, tuple[str, str]] = {}  # a --replicate design's seed-0 and seed-1 keys
    for t in chosen:
        key, request = real_request(shapes[t.number], 0)
        requests[key] = request
        if t.number in args.replicate:
            again, request = real_request(shapes[t.number], 1)
            seed_1[again] = request
            replicas[t.number] = (key, again)
    started = time.monotonic()
    results = real_runs(
        {**requests, **seed_1}, work / f"{args.study}-real_runs.jsonl", args.workers,
        train=not args.recorded_only, here=args.smoke,
    )  # fmt: skip
    print(f"real runs: {time.monotonic() - started:.0f} s", flush=True)

    rung_batch = args.batch_size if args.rung_batch_size is None else args.rung_batch_size
    batch = [] if rung_batch is None else ["--batch-size", str(rung_batch)]
    step(archsearch(
        "ladder", "--study", args.study, "--storage", url, *numbers, "--rungs", str(rungs), "--top", str(top),
        *(["--spacing", str(args.spacing)] if args.spacing != 2.0 else []),
        "--tokens-per-param", f"{ratio:g}", *batch, "--workers", workers,
    ))  # fmt: skip
    ray_up.close()

    seed_noise = []  # each replicated design: its two real losses
    for trial, (key, again) in replicas.items():
        first, second = results.get(key), results.get(again)
        if first and second:
            seed_noise.append({
                "trial": trial, "seed_0": first["val_loss"], "seed_1": second["val_loss"],
                "difference": abs(second["val_loss"] - first["val_loss"]) / first["val_loss"],
            })  # fmt: skip
    with Storage.open(url, create=False) as storage:
        real_settings = next(iter(requests.values()))["settings"]
        real_batch = real_settings["batch_size"]
        rung_batch = ladder_settings(proxy, real_settings["tokens"], 0, rung_batch)["batch_size"]
        rungs_stored = [
            r for r in storage.ladder_rungs(args.study, ratio, rung_batch) if r.trial_number in shapes
        ]
    # The smoke's intervals from 50 resamples, not the law's 200: each of its three runs fits the law
    # again, and at 200 that fit was seconds of CPU on a loaded host (the CLI's own fit keeps 200).
    fit = fit_study_ladders(rungs_stored, resamples=SMOKE_RESAMPLES if args.smoke else None)
    rows = []
    for t, key in zip(chosen, requests, strict=True):
        cfg = shapes[t.number]
        counts = param_counts(cfg)
        p = fit.predict(t.number, float(counts.non_embedding))
        result = results.get(key)
        rows.append({
            "trial": t.number, "design": t.config.describe(), "shape_at_real": cfg.describe(),
            "params_total": counts.total, "params_non_embedding": counts.non_embedding,
            "tokens": requests[key]["settings"]["tokens"], "predicted": p.loss, "low": p.low, "high": p.high,
            "distance": p.distance, "real": result["val_loss"] if result else None,
            "real_wall_time_s": result["wall_time_s"] if result else None,
            "proxy_loss": t["loss"],
            "proxy_adjusted": rule.value(t["loss"], t["loss_change"], t["params_total"]),
            "proxy_params": t["params_total"],
            "rungs": [
                {"params_total": r.params_total, "params_non_embedding": r.params_non_embedding,
                 "tokens": r.tokens, "loss": r.val_loss, "wall_time_s": r.wall_time_s}
                for r in rungs_stored if r.trial_number == t.number
            ],
        })  # fmt: skip
    scored = [r for r in rows if r["real"] is not None]
    result_measures = measures(scored) if scored else None
    from archsearch import __version__

    record = {
        "what": (
            f"Ladder accuracy (issue 23): {len(chosen)} designs of {args.study}, ladders of {rungs} rungs "
            f"up to {top:,} parameters and a real run at {real_size:,}, all at {ratio:g} tokens per "
            f"parameter, the rungs at batch {rung_batch}, the real runs at {real_batch}; losses in "
            "nats/token on the study's corpus"
        ),
        "measured": f"archsearch {__version__}, {cpu_description()}",
        "updated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "space": str(space.relative_to(ROOT)) if space.is_relative_to(ROOT) else str(space),
        "commands": commands,
        "fit": fit.to_dict(),
        "rows": rows,
        "measures": result_measures,
        "real_seed_noise": seed_noise,
    }
    write_atomic(out, (json.dumps(record, indent=1) + "\n").encode())

    print(
        f"\n{len(rows)} designs; law: E {fit.e:.4f}, alpha {fit.alpha:.4f}; real runs at {real_size:,} "
        "parameters"
    )
    print(
        f"{'trial':>5} {'params':>9} {'x top':>6} {'predicted':>9} {'95% interval':>17} {'real':>7} "
        f"{'error':>7}"
    )
    for r in rows:
        real = f"{r['real']:.4f}" if r["real"] is not None else "-"
        error = f"{(r['predicted'] - r['real']) / r['real']:+.2%}" if r["real"] is not None else "-"
        print(
            f"{r['trial']:>5} {r['params_total']:>9,} {r['distance']:>6.2f} {r['predicted']:>9.4f} "
            f"[{r['low']:.4f}, {r['high']:.4f}] {real:>7} {error:>7}"
        )
    if result_measures:
        m = result_measures
        print(
            f"median abs error {m['median_abs_error']:.2%}, worst {m['worst_abs_error']:.2%}; real loss "
            f"inside the interval for {m['inside_interval'][0]}/{m['inside_interval'][1]}"
        )
        if "spearman" in m:
            s = m["spearman"]
            print(
                f"Spearman against the real ranking: ladder {estimate(s['ladder'])}, "
                f"proxy {estimate(s['proxy'])}, size-adjusted proxy {estimate(s['proxy_adjusted'])}; "
                f"ladder - proxy {estimate(m['ladder_vs_proxy'])}"
            )
    for n in seed_noise:
        print(
            f"trial {n['trial']}: real runs with seeds 0 and 1 {n['seed_0']:.4f} and {n['seed_1']:.4f}, "
            f"{n['difference']:.2%} apart"
        )
    print(f"recorded in {out}")


if __name__ == "__main__":
    main()
