"""Record the third proxy-fidelity set (issue 21): shapes from three blocks, each trained by the
search's own proxy at 3 seeds and retrained 10x as `archsearch validate` retrains them.

Blocks (space files in benchmarks/spaces/, random sampler, no pruning, the proxy's precision
pinned to fp32 so every CPU gives the same losses):
- tiny: examples/tiny.toml's space and proxy, 20 shapes;
- wide: every activation, norm and norm placement, aspect ratios down to 8, 20 shapes;
- iso: the wide space held to 1.0M parameters +-10% (where counting parameters is blind), 16 shapes.

Each block is one study per proxy seed (`cal3-<block>-p<seed>`: the same random-sampler seed, so
the same shapes in the same order, each trained by the worker's path: the stall rule included).
The seed-0 study's complete trials are then retrained at 10x (seed 0: the reference), and a spread
of 5 per block at a second seed (the reference's own ceiling). Every step is the real CLI command,
printed before it runs, on one SQLite database; a search resumes its study and `validate` trains
only the long runs not yet stored, so a stopped run loses only what was in flight and nothing is
trained twice. After each step the database is copied (SQLite's online backup) to `--snapshot`
and the records are written to `--out` as JSON, so committing those two files keeps the progress:

    python benchmarks/calibration.py                  # resumes from the committed snapshot
    python benchmarks/calibration.py --stages proxies # only the proxies (3 seeds, every block)
    python benchmarks/calibration.py --smoke          # one small block, tiny budgets: a minute

The run's own progress (each search's and validate's) goes to stdout as it comes.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SPACES = ROOT / "benchmarks" / "spaces"
DATA = ROOT / "benchmarks" / "data"
NAME = "cal3"
OUT = DATA / "fidelity_cal3.json"
SNAPSHOT = DATA / "fidelity_cal3.sqlite"
PROXY_SEEDS = (0, 1, 2)
MULTIPLIER = 10
SECOND_SEED_PER_BLOCK = 5  # 15 shapes with two reference seeds


@dataclass(frozen=True)
class Block:
    name: str
    space: Path
    shapes: int  # finished trials of each of its studies
    sampler_seed: int  # the random sampler's: the same shapes at every proxy seed


BLOCKS = (
    Block("tiny", SPACES / "cal-tiny.toml", 20, 31),
    Block("wide", SPACES / "cal-wide.toml", 20, 32),
    Block("iso", SPACES / "cal-iso.toml", 16, 33),
)
STAGES = ("proxies", "reference", "second-seed")


def study_name(block: Block, seed: int) -> str:
    return f"{NAME}-{block.name}-p{seed}"


def seeded_space(block: Block, seed: int, folder: Path, tokens: int | None) -> Path:
    """The block's space file with `[proxy] seed` set (and the tokens, for a smoke run)."""
    text = block.space.read_text().replace("[proxy]\n", f"[proxy]\nseed = {seed}\n", 1)
    if tokens is not None:
        text = text.replace("tokens = 240_000", f"tokens = {tokens}")
    path = folder / f"{block.name}-p{seed}.toml"
    path.write_text(text)
    return path


def run(argv: list[str]) -> None:
    """One CLI command, shown, its output streamed; a failure stops the recording (exit status)."""
    print("+ " + shlex.join(argv), flush=True)
    done = subprocess.run(argv, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"calibration: `{shlex.join(argv)}` exited {done.returncode}")


def archsearch(*args: str) -> list[str]:
    return [sys.executable, "-m", "archsearch", *args]


def complete_trials(db: Path, study: str) -> list[dict[str, Any]]:
    """The study's complete trials (number, config, loss, curve) from the database, by number."""
    from archsearch.storage import Storage

    with Storage.open(f"sqlite:///{db}", create=False) as storage:
        if storage.study(study, counts=False) is None:
            return []
        out = []
        for record in storage.trials(study, status="complete"):
            curves = storage.curves(record.id)
            out.append({
                "trial": record.number,
                "config": record.config.to_dict(),
                "params_total": record["params_total"],
                "flops_forward_per_token": record["flops_forward_per_token"],
                "val_loss": record["loss"],
                "val_curve": curves.get("val", []),
                "reason": record.reason,
                "train_seconds": record.values.get("train_seconds"),
            })  # fmt: skip
        return sorted(out, key=lambda t: t["trial"])


def long_runs(db: Path, study: str) -> list[dict[str, Any]]:
    from archsearch.storage import Storage

    with Storage.open(f"sqlite:///{db}", create=False) as storage:
        if storage.study(study, counts=False) is None:
            return []
        return [
            {
                "trial": r.trial_number, "multiplier": r.multiplier, "seed": r.seed, "tokens": r.tokens,
                "val_loss": r.val_loss, "val_curve": [list(p) for p in r.val_curve],
                "wall_time_s": r.wall_time_s,
            }
            for r in storage.long_runs(study)
        ]  # fmt: skip


def second_seed_trials(numbers: list[int], k: int) -> list[int]:
    """`k` trial numbers spread evenly over `numbers` (sorted): the shapes with a second reference."""
    if len(numbers) <= k:
        return list(numbers)
    step = (len(numbers) - 1) / (k - 1)
    return [numbers[round(i * step)] for i in range(k)]


def record(db: Path, blocks: tuple[Block, ...], out: Path, commands: list[str]) -> dict[str, Any]:
    """Every recorded shape: its proxies (one per seed) and long runs, matched by shape."""
    import torch

    from archsearch import __version__

    shapes = []
    for block in blocks:
        by_config: dict[str, dict[str, Any]] = {}
        for seed in PROXY_SEEDS:
            for t in complete_trials(db, study_name(block, seed)):
                key = json.dumps(t["config"], sort_keys=True)
                shape = by_config.setdefault(key, {
                    "block": block.name, "trial": t["trial"], "config": t["config"],
                    "params_total": t["params_total"], "proxies": [], "references": [],
                    "flops_forward_per_token": t["flops_forward_per_token"],
                })  # fmt: skip
                shape["proxies"].append({
                    "seed": seed, "trial": t["trial"], "val_loss": t["val_loss"], "val_curve": t["val_curve"],
                    "retried": bool(t["reason"]), "reason": t["reason"], "train_seconds": t["train_seconds"],
                })  # fmt: skip
        seed0 = {s["trial"]: s for s in by_config.values() if any(p["seed"] == 0 for p in s["proxies"])}
        for run_ in long_runs(db, study_name(block, 0)):
            if run_["trial"] in seed0:
                seed0[run_["trial"]]["references"].append(run_)
        shapes.extend(sorted(by_config.values(), key=lambda s: s["trial"]))
    data = {
        "what": (
            "Third proxy-fidelity set (issue 21): per shape, the search's proxy at seeds 0-2 and "
            f"{MULTIPLIER}x reference runs (validate's cosine retraining, seed 0; a second seed for "
            f"{SECOND_SEED_PER_BLOCK} shapes per block). Losses in nats/token on the bundled corpus."
        ),
        "measured": f"archsearch {__version__}, torch {torch.__version__}, {_cpu()}",
        "updated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "blocks": {
            b.name: {"space": str(b.space.relative_to(ROOT)), "shapes": b.shapes, "seed": b.sampler_seed}
            for b in blocks
        },
        "commands": commands,
        "shapes": shapes,
    }
    from archsearch.fileio import write_atomic

    write_atomic(out, (json.dumps(data, indent=1) + "\n").encode())
    return data


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{os.cpu_count()}-core {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return f"{os.cpu_count()}-core CPU"


def snapshot(db: Path, to: Path) -> None:
    """A consistent copy of the live database (SQLite's backup API: WAL pages included)."""
    tmp = to.with_name(to.name + ".tmp")
    tmp.unlink(missing_ok=True)
    src, dst = sqlite3.connect(db), sqlite3.connect(tmp)
    try:
        src.backup(dst)
        dst.execute("PRAGMA journal_mode = DELETE")  # one self-contained file to commit
    finally:
        src.close()
        dst.close()
    os.replace(tmp, to)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, help="working database (default: a copy of --snapshot)")
    parser.add_argument("--snapshot", type=Path, default=SNAPSHOT)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="one block of 4 shapes, tiny budgets")
    args = parser.parse_args()
    stages = [s for s in args.stages.split(",") if s]
    if unknown := sorted(set(stages) - set(STAGES)):
        parser.error(f"unknown stage(s) {', '.join(unknown)}; valid: {', '.join(STAGES)}")

    blocks, tokens, multiplier, second = BLOCKS, None, MULTIPLIER, SECOND_SEED_PER_BLOCK
    if args.smoke:
        blocks = (Block("tiny", SPACES / "cal-tiny.toml", 4, 31),)
        tokens, multiplier, second = 4096, 2, 4
    work = Path(os.environ.get("ARCHSEARCH_CALIBRATION_DIR", ROOT / ".calibration"))
    work.mkdir(parents=True, exist_ok=True)
    db = args.db or work / "cal3.db"
    if not db.exists() and args.snapshot.exists() and not args.smoke:
        shutil.copyfile(args.snapshot, db)  # resume what earlier sessions recorded
        print(f"resuming from {args.snapshot}", flush=True)
    storage = f"sqlite:///{db}"
    commands: list[str] = []

    def step(argv: list[str]) -> None:
        run(argv)
        commands.append(shlex.join(["archsearch", *argv[3:]]))
        snapshot(db, args.snapshot)
        record(db, blocks, args.out, commands)

    workers = str(args.workers)
    if "proxies" in stages:
        for seed in PROXY_SEEDS[: 2 if args.smoke else 3]:
            for block in blocks:
                space = seeded_space(block, seed, work, tokens)
                step(archsearch(
                    "search", "--space", str(space), "--study", study_name(block, seed), "--storage", storage,
                    "--sampler", "random", "--seed", str(block.sampler_seed), "--no-prune",
                    "--trials", str(block.shapes), "--workers", workers, "--resume",
                ))  # fmt: skip
    for stage, seeds in (("reference", 1), ("second-seed", 2)):
        if stage not in stages:
            continue
        for block in blocks:
            numbers = [t["trial"] for t in complete_trials(db, study_name(block, 0))]
            if stage == "second-seed":
                numbers = second_seed_trials(numbers, second)
            if len(numbers) < 4:
                print(f"{stage}: block {block.name} has {len(numbers)} complete trials; skipped", flush=True)
                continue
            trial_args = [a for n in numbers for a in ("--trial", str(n))]
            step(archsearch(
                "validate", "--study", study_name(block, 0), "--storage", storage, *trial_args,
                "--multiplier", str(multiplier), "--seeds", str(seeds), "--workers", workers,
            ))  # fmt: skip
    data = record(db, blocks, args.out, commands)
    refs = sum(len(s["references"]) for s in data["shapes"])
    proxies = sum(len(s["proxies"]) for s in data["shapes"])
    print(f"recorded {len(data['shapes'])} shapes, {proxies} proxies, {refs} long runs in {args.out}")


if __name__ == "__main__":
    main()
