"""`gpu_campaign.py --dry-run`: what a sitting on a lent H200 will cost, before one is lent.

Device time counts from the asking for a machine to its return, and a task gets 15 minutes: the
machine's start, a warm-up command (the wheels installed, the BPE corpus built, part 5's smoke),
the campaign command (`--budget-s`), and the give-back. The parts' seconds are planned from
measured figures where there are some (part 1: the fresh2- shapes' sitting; part 3: its first
pass) and from the H200 step model for part 5's runs. A call carries the working tree, the
wheels and anything else named in `carry`: 64 MiB in all.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import Any

DEVICE_S = 900  # a task's device time
MACHINE_START_S = 180  # a fresh machine's start, counted: 2-3 minutes
WARM_UP_S = 60  # wheels (2 s on the H200), the corpus (seconds on 16 cores), part 5's CPU smoke
GIVE_BACK_S = 30  # transfers back and the idle wait before a give-back
COMMAND_S = 600  # one command's limit
CARRY_BYTES = 64 * 2**20
# The wheels gpu_campaign_wheels.sh fetches (Ray without its jars, Optuna, SQLAlchemy and the rest)
# for Python 3.12, when no .whl folder is here to weigh: 51 MB on 2026-11-25.
WHEELS_BYTES = 51_000_000
# Part 1 on the H200, 2026-11-28: 12 fresh2- shapes measured, timed twice more and scored in 93 s.
PART1_S_PER_SHAPE = 8.0
PART1_FIT_GEMMS_S = 40.0  # the fit set, when the records hold none (a fresh --out)
PART3_FIRST_PASS_S = 297.0  # part 3's 39 points, once each, on the H200 (2026-11-26)
# The BPE corpus built from Python 3.11's standard library (vocab 8,192): when none is built here.
CORPUS_TRAIN_TOKENS = 1_901_951
CORPUS_BYTES = 4_306_862


def tree_bytes(root: Path) -> int:
    """What a call carries of the checkout: tracked files and untracked ones git does not ignore."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    return sum((root / n.decode()).stat().st_size for n in names if n and (root / n.decode()).is_file())


def folder_bytes(folder: Path) -> int | None:
    if not folder.is_dir():
        return None
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def dry_run(
    args: argparse.Namespace, root: Path, part1_todo: list[str], has_fit_gemms: bool,
    corpus: dict[str, Any], spec_text: str, recorded_runs: set[str], part3: tuple[int, int],
) -> dict[str, Any]:  # fmt: skip
    """Print the sitting's plan; return its figures. `part3`: serving's points, and how many of them
    lack a timing (`--serve-rounds`)."""
    import gpu_campaign_fidelity as fid

    budget = args.budget_s or 540.0
    rows: list[tuple[str, float, str]] = []
    part1 = 0.0
    if 1 in args.parts:
        part1 = len(part1_todo) * PART1_S_PER_SHAPE + (0.0 if has_fit_gemms else PART1_FIT_GEMMS_S)
        rows.append((f"part 1: {len(part1_todo)} shapes to measure", part1,
                     f"{PART1_S_PER_SHAPE:g} s a shape, as 12 fresh2- shapes took on the H200"))  # fmt: skip
    part5 = 0.0
    regime = None
    if 5 in args.parts:
        shapes, runs = fid.plan(spec_text, args.smoke)
        concurrency = fid.SMOKE["concurrency"] if args.smoke else fid.CONCURRENCY
        device = "cpu" if args.smoke else "h200"  # the smoke's plan: its CPU guess, not the H200
        estimates = {r.key: fid.estimate_s(r, device, concurrency) for r in runs}
        todo = [r for r in fid.ordered(runs, estimates) if r.key not in recorded_runs]
        span = fid.makespan(todo, estimates, concurrency)
        part5 = (fid.RAY_START_S + span) if todo else 0.0
        rows.append((f"part 5: {len(shapes)} shapes, {len(todo)} of {len(runs)} runs to train", part5,
                     f"Ray's start {fid.RAY_START_S:g} s + {span:.0f} s, {concurrency} runs sharing the "
                     "GPU "
                     f"(H200 model: {sum(estimates[r.key] for r in todo):.0f} run-seconds)"))  # fmt: skip
        params = [s["params"] for s in shapes]
        proxy = fid.SMOKE["proxy_tokens"] if args.smoke else fid.PROXY_TOKENS
        long_tokens = proxy * fid.MULTIPLIER
        regime = (
            f"part 5's regime: shapes {min(params) / 1e6:.1f}-{max(params) / 1e6:.1f}M parameters; proxy "
            f"{proxy:,} tokens ({proxy / max(params):.2f}-{proxy / min(params):.2f} a parameter, "
            f"{proxy / corpus['train_tokens']:.2f} epochs), long runs {long_tokens:,} "
            f"({long_tokens / max(params):.2f}-{long_tokens / min(params):.2f} a parameter, "
            f"{long_tokens / corpus['train_tokens']:.2f} epochs of the corpus's {corpus['train_tokens']:,} "
            "training tokens)"
        )
    if 3 in args.parts:
        rest = max(0.0, budget - part1 - part5)
        points, todo_points = part3
        if todo_points:
            rows.append((f"part 3: serving, {todo_points} of {points} points to measure", rest,
                         f"what remains: {min(rest / PART3_FIRST_PASS_S, 1):.0%} of the "
                         f"{PART3_FIRST_PASS_S:.0f} s first pass; resumes in a later sitting"))  # fmt: skip
        else:
            rows.append((f"part 3: serving, all {points} points recorded", 0.0,
                         f"scored again only; {rest:.0f} s of the budget left over"))  # fmt: skip
    total = MACHINE_START_S + WARM_UP_S + budget + GIVE_BACK_S
    print(
        f"gpu campaign dry run: parts {','.join(map(str, args.parts))} on a lent H200, --budget-s {budget:g}"
    )
    print(f"  {'machine start':<44} {MACHINE_START_S:>5.0f} s")
    print(f"  {'warm-up command':<44} {WARM_UP_S:>5.0f} s  wheels, corpus, part 5's smoke")
    print(f"  {'campaign command':<44} {budget:>5.0f} s  (its limit {COMMAND_S} s)")
    for name, seconds, why in rows:
        print(f"    {name:<42} {seconds:>5.0f} s  {why}")
    print(f"  {'give-back':<44} {GIVE_BACK_S:>5.0f} s")
    fits = "fits" if total <= DEVICE_S and budget < COMMAND_S else "DOES NOT FIT"
    print(f"  {'total device time':<44} {total:>5.0f} s of {DEVICE_S} s: {fits}")
    if regime:
        print(regime)
    tree = tree_bytes(root)
    wheels = folder_bytes(root / ".whl")
    built = corpus.get("bytes")  # the corpus built here, if it is
    carried = tree + (wheels if wheels is not None else WHEELS_BYTES)
    fits_carry = "fits" if carried <= CARRY_BYTES else "DOES NOT FIT"
    wheels_text = (
        f"{wheels / 1e6:.1f} MB (.whl)" if wheels is not None else f"{WHEELS_BYTES / 1e6:.0f} MB (recorded)"
    )
    corpus_bytes = built if built is not None else CORPUS_BYTES
    print(f"carried: working tree {tree / 1e6:.1f} MB + wheels {wheels_text} = {carried / 2**20:.1f} MiB of "
          f"{CARRY_BYTES / 2**20:.0f} MiB: {fits_carry}; the corpus is built on the machine (carried, it "
          f"would add {corpus_bytes / 1e6:.1f} MB)")  # fmt: skip
    return {"device_s": total, "part1_s": part1, "part5_s": part5, "carried_bytes": carried}
