"""How long `archsearch trials --where` and `archsearch pareto` take on a 100,000-trial study.

Builds a SQLite trial database of synthetic trials in a temporary folder (random shapes from a
grid, their exact costs, statuses in realistic shares, losses that fall with size plus noise,
step times that grow with FLOPs), then times, each as the median of `--repeats` runs after one
warm-up run (the first run's imports are printed separately):

1. `archsearch trials --study S --where "activation = swiglu and d_model >= 512 and status =
   complete" --format csv --output F`, in process (typer's CliRunner), and the library's
   `trials_frame` alone;
2. `archsearch pareto --study S --json` in process, and the library's `study_front` alone;
3. both commands as real processes (`python -m archsearch`), interpreter start and imports
   included: the median of `--repeats` runs, against the target.

Target: under 1.5 seconds each as new processes on an idle 2-core machine (issue 13).

    python benchmarks/query_speed.py [--trials 100000] [--repeats 5] [--seed 0] [--keep DIR]
    python benchmarks/query_speed.py --smoke   # 300 trials, 1 repeat: seconds; the test suite runs it
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from archsearch.errors import ConfigError
from archsearch.space.costs import flop_counts, param_counts
from archsearch.space.knobs import config_from_knobs
from archsearch.storage import Storage

STUDY = "bench"
TARGET_S = 1.5  # seconds per command as a new process, on an idle 2-core machine
WHERE = "activation = swiglu and d_model >= 512 and status = complete"
# (status, share): most trials complete; the search prunes, fails and rejects some.
STATUSES = (("complete", 0.70), ("pruned", 0.15), ("failed", 0.07), ("rejected", 0.06), ("interrupted", 0.02))
REASONS = {
    "pruned": "dominated at rung 0.25 by {k} of {n} trials",
    "failed": "out of memory at batch 16",
    "rejected": "params_total {p:,} above the budget",
    "interrupted": "stopped by SIGTERM; re-queued",
}


def _shape(rng: random.Random) -> Any:
    """A random valid shape from a grid like the example spaces'."""
    while True:
        d_model = rng.choice((128, 192, 256, 384, 512, 640, 768, 1024, 1536, 2048))
        n_heads = d_model // 64
        layout = rng.choice(("mha", "gqa", "mqa"))
        n_kv_heads = {"mha": n_heads, "gqa": max(1, n_heads // 4), "mqa": 1}[layout]
        try:
            return config_from_knobs(
                d_model=d_model,
                aspect_ratio=rng.choice((16, 32, 64, 128)),
                head_dim=64,
                n_kv_heads=n_kv_heads,
                d_ff_ratio=rng.choice((2.0, 3.0, 4.0)),
                vocab_size=rng.choice((256, 32_000)),
                seq_len=rng.choice((256, 1024)),
                activation=rng.choice(("relu", "gelu", "silu", "reglu", "geglu", "swiglu")),
                norm=rng.choice(("layernorm", "rmsnorm")),
                norm_placement=rng.choice(("pre", "post", "sandwich")),
                pos_embedding=rng.choice(("rope", "learned", "none")),
                tie_embeddings=rng.random() < 0.3,
                qk_norm=rng.random() < 0.2,
            )
        except ConfigError:
            continue  # e.g. a KV-head count that does not divide the heads: draw again


def synthetic_trials(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    statuses, weights = zip(*STATUSES, strict=True)
    start = 1.7e9
    rows = []
    for number in range(n):
        cfg = _shape(rng)
        status = rng.choices(statuses, weights)[0]
        params, flops = param_counts(cfg).total, flop_counts(cfg).forward
        row: dict[str, Any] = dict(
            number=number, optuna_trial_id=number, status=status, attempts=1, config=cfg,
            host="bench:1", started_at=start + 60 * number, finished_at=start + 60 * number + 55,
        )  # fmt: skip
        if status in REASONS:
            row["reason"] = REASONS[status].format(k=rng.randint(2, 5), n=rng.randint(6, 12), p=params)
        if status in ("complete", "pruned"):
            # Loss falls with size (a power law) plus noise; pruned trials stopped early, higher.
            loss = 1.2 + 25 * params**-0.25 + rng.gauss(0, 0.05) + (0.4 if status == "pruned" else 0)
            step = 3 * flops * 16 * cfg.seq_len / 50e12 * rng.uniform(1.1, 2.5)  # 16 sequences, 50 TFLOP/s
            row.update(
                loss=loss, bits_per_byte=loss / math.log(2), tokens_trained=1_000_000,
                steps=1_000_000 // (16 * cfg.seq_len),
                train_seconds=rng.uniform(20, 300), tokens_per_second=16 * cfg.seq_len / step,
                mfu=rng.uniform(0.2, 0.55), precision="bf16", corpus_fingerprint="c0ffee" * 4,
                step_time_s=step, step_time_device="h100-sxm", device_fingerprint="d" * 16,
                pruned_rung=0.25 if status == "pruned" else None,
            )  # fmt: skip
        rows.append(row)
    return rows


def _median_s(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(first run, median of `repeats` more runs) in seconds."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="build the database in this folder and keep it")
    parser.add_argument(
        "--smoke", action="store_true", help="300 trials, 1 repeat: checks the benchmark runs, times nothing"
    )
    args = parser.parse_args()
    if args.smoke:
        args.trials, args.repeats = 300, 1
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        run(folder, args.trials, args.repeats, args.seed)


def run(folder: Path, n: int, repeats: int, seed: int) -> None:
    from typer.testing import CliRunner

    from archsearch.cli import app
    from archsearch.search.pareto import study_front
    from archsearch.storage.query import trials_frame

    db_path = folder / "bench.db"
    db_path.unlink(missing_ok=True)
    url = f"sqlite:///{db_path}"
    t0 = time.perf_counter()
    rows = synthetic_trials(n, seed)
    made = time.perf_counter() - t0
    with Storage.open(url) as db:
        db.create_study(
            STUDY, spec_fingerprint="0" * 64, spec_source="", spec={}, objectives=("loss", "flops")
        )
        t0 = time.perf_counter()
        db.add_trials(STUDY, rows)
        inserted = time.perf_counter() - t0
        counts = db.counts(STUDY)
    size_mb = db_path.stat().st_size / 1e6
    print(f"database: {n:,} trials {counts}, {size_mb:.0f} MB at {db_path}")
    print(f"  generated in {made:.1f} s, inserted in {inserted:.1f} s")

    out = folder / "trials.csv"
    runner = CliRunner()
    trials_args = ["trials", "--study", STUDY, "--where", WHERE, "--format", "csv", "--output", str(out)]
    pareto_args = ["pareto", "--study", STUDY, "--json"]

    def cli(argv: list[str]) -> Callable[[], None]:
        def invoke() -> None:
            result = runner.invoke(app, [*argv, "--storage", url])
            if result.exit_code != 0:
                raise SystemExit(f"{' '.join(argv)} failed: {result.output}")

        return invoke

    def frame() -> None:
        with Storage.open(url, create=False) as db:
            trials_frame(db, STUDY, WHERE)

    def front() -> None:
        with Storage.open(url, create=False) as db:
            study_front(db, STUDY)

    with Storage.open(url, create=False) as db:
        matched = len(trials_frame(db, STUDY, WHERE))
        f = study_front(db, STUDY)
    print(f"trials --where {WHERE!r}: {matched:,} trials match")
    on_front, ranked = (len(f.front.numbers), len(f.trial_numbers)) if f else (0, 0)
    print(f"pareto: {on_front} trials on the front of {ranked:,}")
    print(f"seconds (first run, then median of {repeats}):")
    results = {
        "archsearch trials --where ... --format csv --output F (CliRunner)": _median_s(
            cli(trials_args), repeats
        ),
        "trials_frame(storage, study, where) (library)": _median_s(frame, repeats),
        "archsearch pareto --study S --json (CliRunner)": _median_s(cli(pareto_args), repeats),
        "study_front(storage, study) (library)": _median_s(front, repeats),
    }
    for label, (first, median) in results.items():
        print(f"  {median:6.3f}  (first {first:.3f})  {label}")
    print(f"seconds as real processes, interpreter start and imports included (median of {repeats}):")
    for argv in (trials_args, pareto_args):
        command = [sys.executable, "-m", "archsearch", *argv, "--storage", url]
        seconds = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            seconds.append(time.perf_counter() - t0)
        median = statistics.median(seconds)
        verdict = "under" if median < TARGET_S else "OVER"
        print(
            f"  {median:6.3f}  (range {min(seconds):.3f}-{max(seconds):.3f})  python -m archsearch "
            f"{argv[0]}: {verdict} the {TARGET_S} s target"
        )


if __name__ == "__main__":
    main()
