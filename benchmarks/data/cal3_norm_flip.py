"""A one-off experiment (2026-11-29): is the tiny block's pre-norm / post-norm flip the proxy's
length or its schedule?

Trains tiny-block shapes of calibration set 3 (`fidelity_cal3.json`) with the studies' stored
proxy settings, varying the budget (multiples of 240k tokens) and the schedule (constant, cosine,
wsd); one JSON line per run in cal3_norm_flip.jsonl, keyed by (trial, seed, multiplier,
schedule), so a rerun trains nothing twice. Each argument is SEEDS:TRIALS:MULTIPLIERS:SCHEDULES:

    python benchmarks/data/cal3_norm_flip.py 0:12:1:constant 0,1:0,1,4,12,14:4:constant \
        0,1:12,14:2:constant 0,1:0,1,4,12,14:1:cosine,wsd 0:0,1,4,12,14:8:constant
"""

import json
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

HERE = Path(__file__).parent
OUT = HERE / "cal3_norm_flip.jsonl"
PROXY = {
    "base_width": 128,
    "batch_size": 16,
    "compile": False,
    "device": "cpu",
    "eval_batches": 8,
    "evals": 4,
    "flops": None,
    "grad_clip": 1.0,
    "lr": 0.003,
    "min_lr": 0.1,
    "precision": "fp32",
    "schedule": "constant",
    "seconds": None,
    "seq_len": None,
    "tokens": 240000,
    "warmup": 0.05,
    "weight_decay": 0.1,
}
shapes = {
    s["trial"]: s for s in json.load(open(HERE / "fidelity_cal3.json"))["shapes"] if s["block"] == "tiny"
}


def key(trial, seed, mult, sched):
    return f"{trial}/{seed}/{mult}/{sched}"


def job(args):
    trial, seed, mult, sched = args
    from archsearch.search.validate import long_run

    settings = dict(PROXY, seed=seed, schedule=sched, tokens=int(240000 * mult), threads=1)
    r = long_run(
        {
            "config": shapes[trial]["config"],
            "settings": settings,
            "data": None,
            "cpus": 1,
            "checkpoint": False,
        }
    )
    return dict(
        key=key(*args),
        trial=trial,
        seed=seed,
        multiplier=mult,
        schedule=sched,
        val_loss=r["val_loss"],
        val_curve=r["val_curve"],
        status=r["status"],
        wall_time_s=r["wall_time_s"],
    )


def main():
    plan = []
    for spec in sys.argv[1:]:  # "seeds:trials:mults:scheds", e.g. 0:0,1,4,12,14:4:constant
        seeds, trials, mults, scheds = spec.split(":")
        for seed in map(int, seeds.split(",")):
            for t in shapes if trials == "all" else map(int, trials.split(",")):
                for m in map(float, mults.split(",")):
                    for s in scheds.split(","):
                        plan.append((t, seed, m, s))
    done = {json.loads(l)["key"] for l in OUT.read_text().splitlines()} if OUT.exists() else set()
    todo = [p for p in plan if key(*p) not in done]
    print(f"{len(plan)} runs planned, {len(todo)} to train", flush=True)
    with ProcessPoolExecutor(2) as pool:
        for f in as_completed([pool.submit(job, p) for p in todo]):
            row = f.result()
            with OUT.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(row["key"], round(row["val_loss"], 4), round(row["wall_time_s"]), flush=True)


if __name__ == "__main__":
    main()
