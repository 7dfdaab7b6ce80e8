"""Record the third proxy-fidelity set (issue 21): shapes from three blocks, each trained by the
search's own proxy at 3 seeds and retrained 10x as `archsearch validate` retrains them.

Blocks (space files in benchmarks/spaces/, random sampler, no pruning, the proxy's precision
pinned to fp32 so every CPU gives the same losses):
- tiny: examples/tiny.toml's space and proxy, 20 shapes;
- wide: every activation, norm and norm placement, aspect ratios down to 8, 20 shapes;
- iso: the wide space held to 1.0M parameters +-10% (where counting parameters is blind), 16 shapes.

Each block is one study per proxy seed (`cal3-<block>-p<seed>`). The seed-0 study samples the
block's shapes (random sampler, the block's seed); the seed-1 and seed-2 studies train exactly
those shapes, in order (`search --replay`: a resumed random search samples a fresh stream, so the
same sampler seed alone does not give the same shapes), each by the worker's path, the stall rule
included. The set is the seed-0 study's shapes; any other shape a later seed's study holds is left
out of the records.
The seed-0 study's complete trials are then retrained at 10x (seed 0: the reference), and a spread
of 5 per block at a second seed (the reference's own ceiling). Every step is the real CLI command
(the smoke run's, in this process), printed before it runs, on one SQLite database; a search
resumes its study and `validate` trains only the long runs not yet stored, so a stopped run loses
only what was in flight and nothing is trained twice. After each step the database is copied
(SQLite's online backup) to `--snapshot` and the records are written to `--out` as JSON, so
committing those two files keeps the progress:

    python benchmarks/calibration.py                  # resumes from the committed snapshot
    python benchmarks/calibration.py --stages proxies # only the proxies (3 seeds, every block)
    python benchmarks/calibration.py --smoke          # one small block, tiny budgets: a minute

The run's own progress (each search's and validate's) goes to stdout as it comes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SPACES = ROOT / "benchmarks" / "spaces"
DATA = ROOT / "benchmarks" / "data"
NAME = "cal3"
OUT = DATA / "fidelity_cal3.json"
SNAPSHOT = DATA / "fidelity_cal3.sqlite"
PROXY_SEEDS = (0, 1, 2)
MULTIPLIER = 10
SECOND_SEED_PER_BLOCK = 5  # 15 shapes with two reference seeds
# The smoke run's proxy: two steps of 4 sequences (a quarter of the block's batch, so each run is a
# quarter of the compute): it checks that every stage runs and records, not what the proxy measures.
SMOKE_TOKENS, SMOKE_BATCH = 1024, 4


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
STAGES = ("proxies", "reference", "second-seed", "promote")
# Promotion is measured on the blocks a search samples freely (the iso block is held to one size),
# each proxy seed's study resumed with the tiny example's `[search] promote` settings.
PROMOTED_BLOCKS = ("tiny", "wide")
EXAMPLE = ROOT / "examples" / "tiny.toml"


def study_name(block: Block, seed: int) -> str:
    return f"{NAME}-{block.name}-p{seed}"


def seeded_space(block: Block, seed: int, folder: Path, tokens: int | None) -> Path:
    """The block's space file with `[proxy] seed` set (and, for a smoke run, the tokens, the smoke's
    batch and one held-out batch per evaluation: at a few training steps, the default 8 would be
    most of the work)."""
    text = block.space.read_text().replace("[proxy]\n", f"[proxy]\nseed = {seed}\n", 1)
    if tokens is not None:
        text = text.replace("tokens = 240_000", f"tokens = {tokens}\neval_batches = 1")
        text = text.replace("batch_size = 16", f"batch_size = {SMOKE_BATCH}")
    path = folder / f"{block.name}-p{seed}.toml"
    path.write_text(text)
    return path


def example_promote(source: Path = EXAMPLE) -> str:
    """The `[search] promote` table of `source` (a space file; the tiny example's by default) as
    one TOML line: the settings a search on the calibration blocks' space and proxy would promote
    with."""
    from archsearch.search.spec import load_spec

    settings = load_spec(source).defaults.promote
    if settings is None:
        raise SystemExit(f"calibration: {source} has no [search] promote to measure")
    margin = f'"{settings.margin}"' if isinstance(settings.margin, str) else f"{settings.margin!r}"
    return (
        f'promote = {{ cap = {settings.cap!r}, rule = "{settings.rule}", margin = {margin}, '
        f"max_contenders = {settings.max_contenders}"
        + (f", seeds = {settings.seeds}" if settings.seeds > 1 else "")
        + " }"
    )


def promoted_space(block: Block, seed: int, folder: Path, tokens: int | None, source: Path = EXAMPLE) -> Path:
    """`seeded_space` with `source`'s promotion: resuming a finished study with it trains only
    the contenders (`[search].promote` is outside the study's fingerprint)."""
    path = seeded_space(block, seed, folder, tokens)
    text = path.read_text().replace("[search]\n", f"[search]\n{example_promote(source)}\n", 1)
    out = folder / f"{block.name}-p{seed}-promote.toml"
    out.write_text(text)
    return out


def run(argv: list[str]) -> None:
    """One CLI command, shown, its output streamed; a failure stops the benchmark (exit status)."""
    print("+ " + shlex.join(argv), flush=True)
    done = subprocess.run(argv, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{Path(sys.argv[0]).stem}: `{shlex.join(argv)}` exited {done.returncode}")


def run_here(argv: list[str]) -> None:
    """`run` in this process (a smoke run's steps): the steps share one torch import and, on the
    Ray this process joined, one Ray job, whose workers import torch once rather than once a step
    (a tiny step's first trial took seconds more than its others, most of the step)."""
    from archsearch.cli import app

    print("+ " + shlex.join(argv), flush=True)
    code = app(argv[3:], prog_name="archsearch", standalone_mode=False)
    if code:  # None or 0: the command ended normally
        raise SystemExit(f"{Path(sys.argv[0]).stem}: `{shlex.join(argv)}` exited {code}")


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
                "tokens": record["tokens_trained"],
            })  # fmt: skip
        return sorted(out, key=lambda t: t["trial"])


def ranked(db: Path, study: str) -> dict[int, dict[str, Any]]:
    """Each complete trial's loss objective as the study's front ranks it once promoted
    (`Storage.ranked_objectives`: a contender's at the largest budget all contenders reached, any
    other's placed there), by trial number; none when the study has no promotion."""
    from archsearch.storage import Storage

    with Storage.open(f"sqlite:///{db}", create=False) as storage:
        if storage.study(study, counts=False) is None or not storage.promotions(study):
            return {}
        return {
            n: {"objective": v, "tokens": t, "estimated": e}
            for n, (v, t, e) in storage.ranked_objectives(study).items()
        }


def promotions(db: Path, study: str) -> dict[int, list[dict[str, Any]]]:
    """The study's complete promotions (budget, proxy seed, loss, curve, wall time), by trial number."""
    from archsearch.storage import Storage

    with Storage.open(f"sqlite:///{db}", create=False) as storage:
        if storage.study(study, counts=False) is None:
            return {}
        out: dict[int, list[dict[str, Any]]] = {}
        for p in storage.promotions(study, status="complete"):
            out.setdefault(p.trial_number, []).append({
                "tokens": p.budget_tokens, "seed": p.seed, "val_loss": p.val_loss,
                "val_curve": [list(x) for x in p.val_curve], "wall_time_s": p.wall_time_s,
                "resumed_tokens": p.resumed_tokens,
            })  # fmt: skip
        return out


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


def trial_target(db: Path, study: str, shapes: list[dict[str, Any]]) -> int:
    """`--trials` for a later seed's study that replays `shapes` (the seed-0 study's complete
    trials): its finished trials that are not among them, plus all of them."""
    from archsearch.storage import Storage
    from archsearch.trial import FINISHED

    with Storage.open(f"sqlite:///{db}", create=False) as storage:
        record = storage.study(study)
        if record is None:
            return len(shapes)
        finished = sum(record.counts.get(s, 0) for s in FINISHED)
    wanted = {json.dumps(s["config"], sort_keys=True) for s in shapes}
    have = {json.dumps(t["config"], sort_keys=True) for t in complete_trials(db, study)} & wanted
    return finished - len(have) + len(shapes)


def _recorded(out: Path, key: str) -> Any:
    """What an earlier run wrote to `out` under `key` (kept by a checkpoint), or None."""
    try:
        return json.loads(out.read_text()).get(key)
    except (OSError, ValueError):
        return None


def _recorded_commands(out: Path) -> list[str]:
    """The commands an earlier run wrote to `out`, or none."""
    return list(_recorded(out, "commands") or [])


def second_seed_trials(numbers: list[int], k: int) -> list[int]:
    """`k` trial numbers spread evenly over `numbers` (sorted): the shapes with a second reference."""
    if len(numbers) <= k:
        return list(numbers)
    step = (len(numbers) - 1) / (k - 1)
    return [numbers[round(i * step)] for i in range(k)]


def record(
    db: Path, blocks: tuple[Block, ...], out: Path, commands: list[str], promote: str | None = None
) -> dict[str, Any]:
    """Every recorded shape: its proxies (one per seed) and long runs, matched by shape; `promote`,
    the `[search] promote` line its promotions were trained with (None: kept from `out`)."""
    import torch

    from archsearch import __version__

    shapes = []
    for block in blocks:
        by_config: dict[str, dict[str, Any]] = {}
        for seed in PROXY_SEEDS:
            promoted, placed = promotions(db, study_name(block, seed)), ranked(db, study_name(block, seed))
            for t in complete_trials(db, study_name(block, seed)):
                key = json.dumps(t["config"], sort_keys=True)
                if seed > 0 and key not in by_config:
                    continue  # not one of the set's shapes (a later seed's own sample)
                shape = by_config.setdefault(key, {
                    "block": block.name, "trial": t["trial"], "config": t["config"],
                    "params_total": t["params_total"], "proxies": [], "references": [],
                    "flops_forward_per_token": t["flops_forward_per_token"],
                })  # fmt: skip
                shape["proxies"].append({
                    "seed": seed, "trial": t["trial"], "val_loss": t["val_loss"], "val_curve": t["val_curve"],
                    "retried": bool(t["reason"]), "reason": t["reason"], "train_seconds": t["train_seconds"],
                    "tokens": t["tokens"],
                    **({"promotions": promoted[t["trial"]]} if t["trial"] in promoted else {}),
                    **({"ranked": placed[t["trial"]]} if t["trial"] in placed else {}),
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
            f"{SECOND_SEED_PER_BLOCK} shapes per block); a proxy's `promotions`: its study resumed "
            "with the [search] promote line under `promote`, the contenders trained on at longer budgets. "
            "Losses in nats/token on the bundled corpus."
        ),
        "measured": f"archsearch {__version__}, torch {torch.__version__}, {cpu_description()}",
        "updated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "blocks": {
            b.name: {"space": str(b.space.relative_to(ROOT)), "shapes": b.shapes, "seed": b.sampler_seed}
            for b in blocks
        },
        "commands": commands,
        "promote": promote if promote is not None else _recorded(out, "promote"),
        "shapes": shapes,
    }
    from archsearch.fileio import write_atomic

    write_atomic(out, (json.dumps(data, indent=1) + "\n").encode())
    return data


def cpu_description() -> str:
    """ "2-core AMD EPYC ...": the machine's CPU as `evaluators.device` reads it."""
    from archsearch.evaluators.device import detect_device

    cpu = detect_device("cpu")
    return f"{cpu.units}-core {cpu.name}"


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


# --- scoring the recorded set ---------------------------------------------------------------------

# The predictor chosen on the development sets (the 28 shapes of fidelity_tiny_2026-11-23.json and
# fidelity_tiny_fid_2026-11-24.json, offline from their recorded proxy curves) before any reference
# of this set existed: the end loss, extrapolated by its last evaluation interval's change
# `EXTRAPOLATE` times more, credited for size as the objective is. On the development sets
# (Spearman against 10x, seeds 0 / 1 / 2 of the first and seed 0 of the second): 0.938 / 0.890 /
# 0.864 / 0.908 (mean 0.900) against the objective's 0.916 / 0.837 / 0.824 / 0.873 (0.863); the
# surface is flat for EXTRAPOLATE 2-3 and beta 0.15-0.25 (0.896-0.905), so neither is tuned to a
# point. Averaging two proxy seeds (for every shape, or the front's only) did not help there.
EXTRAPOLATE = 2.0
SIZE_BETA = 0.15
MIN_SHAPES = 10  # below this a rank correlation's interval spans most of [-1, 1]


class SetError(Exception):
    """A recorded set that cannot be scored: the one-line reason."""


def _objective(shape: dict[str, Any], proxy: dict[str, Any], extrapolate: float) -> float:
    """The search's loss objective (`objectives.loss_objective`, `[objectives] extrapolate`) of a
    recorded proxy: its end loss is its curve's last point."""
    from archsearch.space.objectives import curve_change, loss_objective

    change = curve_change(proxy["val_curve"])
    return loss_objective(proxy["val_loss"], change, shape["params_total"], SIZE_BETA, extrapolate)


PREDICTORS = {
    # name -> (value of one shape at one proxy repeat, uses the proxy)
    "params": (lambda s, p: -math.log(s["params_total"]), False),
    "flops": (lambda s, p: -math.log(s["flops_forward_per_token"]), False),
    "proxy loss": (lambda s, p: p["val_loss"], True),
    f"objective (beta {SIZE_BETA})": (lambda s, p: _objective(s, p, 0.0), True),
    f"chosen (+{EXTRAPOLATE:g} x last change)": (lambda s, p: _objective(s, p, EXTRAPOLATE), True),
}


def scorable(data: dict[str, Any], min_shapes: int, partial: bool) -> tuple[list[dict[str, Any]], int]:
    """The shapes that have a seed-0 reference and every proxy repeat; a set with a shape lacking
    either (unless `partial`) or with fewer than `min_shapes` is refused (`SetError`)."""
    shapes = data.get("shapes") or []
    repeats = max((len(s["proxies"]) for s in shapes), default=0)
    complete = [
        s for s in shapes if any(r["seed"] == 0 for r in s["references"]) and len(s["proxies"]) == repeats
    ]
    missing = len(shapes) - len(complete)
    if missing and not partial:
        first = next(s for s in shapes if s not in complete)
        raise SetError(
            f"{missing} of {len(shapes)} shapes lack a seed-0 reference or a proxy repeat (first: block "
            f"{first['block']} trial {first['trial']}); record them, or score the rest with --partial"
        )
    if len(complete) < min_shapes:
        raise SetError(f"{len(complete)} complete shapes; a set needs at least {min_shapes} to be scored")
    return complete, missing


def report(data: dict[str, Any], min_shapes: int = MIN_SHAPES, partial: bool = False) -> dict[str, Any]:
    """Every deciding measure (archsearch.search.fidelity_stats) of each predictor on the set."""
    from archsearch.search import fidelity_stats as fs

    shapes, missing = scorable(data, min_shapes, partial)
    target = np.array([next(r["val_loss"] for r in s["references"] if r["seed"] == 0) for s in shapes])
    flops = np.array([s["flops_forward_per_token"] for s in shapes])
    seeds = sorted({p["seed"] for p in shapes[0]["proxies"]})
    twice = [s for s in shapes if {0, 1} <= {r["seed"] for r in s["references"]}]
    first = [next(r["val_loss"] for r in s["references"] if r["seed"] == 0) for s in twice]
    second = [next(r["val_loss"] for r in s["references"] if r["seed"] == 1) for s in twice]
    noise = fs.seed_noise(first, second) if twice else 0.0
    ceiling = fs.rank_correlation(second, first).to_dict() if len(twice) >= 3 else None
    iso = np.array([s["block"] == "iso" for s in shapes])
    out: dict[str, Any] = {
        "shapes": len(shapes), "left_out": missing, "proxy_seeds": seeds, "reference_noise": noise,
        "second_seed_shapes": len(twice), "reference_ceiling": ceiling, "predictors": {},
    }  # fmt: skip
    values = {}
    for name, (fn, uses_proxy) in PREDICTORS.items():
        rows = [[fn(s, next(p for p in s["proxies"] if p["seed"] == seed)) for s in shapes] for seed in seeds]
        values[name] = np.array(rows if uses_proxy else rows[:1])
    for name, rows in values.items():
        out["predictors"][name] = fs.measures(
            rows, target, flops, params_predictor=values["params"][0], flops_predictor=values["flops"][0],
            noise=noise, within=iso if iso.any() else None,
        )  # fmt: skip
    # Each block alone, as one search would see it: its front, its knee, its ranking.
    blocks = np.array([s["block"] for s in shapes])
    out["blocks"] = {}
    for block in dict.fromkeys(blocks):
        inside = blocks == block
        if inside.sum() < 4:
            continue
        free = {f"{k}_predictor": values[k][0][inside] for k in ("params", "flops")}
        out["blocks"][block] = {
            name: fs.measures(rows[:, inside], target[inside], flops[inside], noise=noise, **free)
            for name, rows in values.items()
        }
    out["promotion"] = promotion_report(shapes, blocks, seeds, target, flops, noise)
    if out["promotion"] and len(seeds) > 1:
        out["seed_repeats"] = seed_repeats(shapes, blocks, seeds, target, flops)
    if out["promotion"]:
        out["promotion"]["settings"] = data.get("promote")
    tenx = np.mean([next(r["tokens"] for r in s["references"] if r["seed"] == 0) for s in shapes])
    runs = [(p, s) for s in shapes for p in s["proxies"]]
    spent = [p["val_curve"][-1][0] * (1.5 if p["retried"] else 1.0) for p, _ in runs]
    out["compute_per_shape"] = float(np.mean(spent) / tenx)  # one search's proxy (a retry: 1.5 runs)
    return out


def promotion_report(
    shapes: list[dict[str, Any]], blocks: np.ndarray, seeds: list[int], target: np.ndarray,
    flops: np.ndarray, noise: float,
) -> dict[str, Any]:  # fmt: skip
    """Each promoted block's search before and after promotion, one study per proxy seed: front
    recall and the knee's regret at every seed (the first pass ranked by the study's loss objective,
    then by `ranked`), the budget it was ranked at, and what the search trained (first pass and
    promotions, tokens) against the block's references (every shape at 10x)."""
    from archsearch.search import fidelity_stats as fs

    out: dict[str, Any] = {}
    for block in PROMOTED_BLOCKS:
        inside = np.flatnonzero(blocks == block)
        mine = [shapes[i] for i in inside]
        # The seeds whose study was promoted (every proxy of it ranked); a smoke run promotes one.
        promoted = [
            seed for seed in seeds
            if all("ranked" in p for s in mine for p in s["proxies"] if p["seed"] == seed)
        ]  # fmt: skip
        if not mine or not promoted:
            continue
        t, f = target[inside], flops[inside]
        rows: dict[str, dict[str, list[Any]]] = {"before": {}, "after": {}}
        for seed in promoted:
            proxies = [next(p for p in s["proxies"] if p["seed"] == seed) for s in mine]
            before = [_objective(s, p, 0.0) for s, p in zip(mine, proxies, strict=True)]
            after = [p["ranked"]["objective"] for p in proxies]
            for when, values in (("before", before), ("after", after)):
                rows[when].setdefault("front_recall", []).append(list(fs.front_recall(values, t, f)))
                rows[when].setdefault("knee_regret", []).append(fs.knee_regret(values, t, f))
            rows["after"].setdefault("ranked_at", []).append(max(p["ranked"]["tokens"] for p in proxies))
            spent = sum(p["tokens"] or 0 for p in proxies)
            promoted = sum(q["tokens"] for p in proxies for q in p.get("promotions", []))
            rows["after"].setdefault("contenders", []).append(sum(1 for p in proxies if p.get("promotions")))
            rows["after"].setdefault("first_pass_tokens", []).append(spent)
            rows["after"].setdefault("promotion_tokens", []).append(promoted)
        reference = sum(next(r["tokens"] for r in s["references"] if r["seed"] == 0) for s in mine)
        rows["after"]["reference_tokens"] = reference
        out[block] = rows
    if out:
        out["reference_noise"] = noise
    return out


def seed_repeats(
    shapes: list[dict[str, Any]], blocks: np.ndarray, seeds: list[int], target: np.ndarray, flops: np.ndarray
) -> dict[str, Any]:
    """Promotion by seed repeats instead of longer budgets, replayed from the record: in each
    promoted block, each seed's study's contenders (`promotion.contenders` under the example's
    margin and bound, on the study's loss objective) ranked by their mean loss objective over every
    recorded proxy seed, the other shapes placed by the contenders' median change, as a promoted
    front places them; with the loss objective as the blocks' studies computed it (no
    extrapolation) and as the tiny example does (`EXTRAPOLATE`). Exact, not modelled: the proxy is
    pinned to fp32, so a contender trained again at another seed is that seed's study's trial.
    Costs one proxy run per contender and extra seed."""
    from archsearch.search import fidelity_stats as fs
    from archsearch.search.promotion import contenders
    from archsearch.search.spec import load_spec

    settings = load_spec(EXAMPLE).defaults.promote
    assert settings is not None  # example_promote refuses an example without
    out: dict[str, Any] = {}
    for extrapolate in (0.0, EXTRAPOLATE):
        rows: dict[str, Any] = {}
        for block in PROMOTED_BLOCKS:
            inside = np.flatnonzero(blocks == block)
            mine = [shapes[i] for i in inside]
            if not mine:
                continue
            t, f = target[inside], flops[inside]
            value = np.array([
                [_objective(s, next(p for p in s["proxies"] if p["seed"] == seed), extrapolate) for s in mine]
                for seed in seeds
            ])  # fmt: skip
            mean = value.mean(axis=0)
            numbers = list(range(len(mine)))
            row: dict[str, Any] = {
                "shapes": len(mine), "contenders": [], "before": [], "after": [], "regret_before": [],
                "regret_after": [],
            }  # fmt: skip
            for first in value:
                chosen = contenders(
                    numbers, np.column_stack([first, f]), ["loss", "flops"], settings.margin_nats,
                    settings.max_contenders,
                )  # fmt: skip
                change = float(np.median([mean[i] - first[i] for i in chosen]))
                after = np.array([mean[i] if i in chosen else first[i] + change for i in numbers])
                row["before"].append(list(fs.front_recall(first, t, f)))
                row["after"].append(list(fs.front_recall(after, t, f)))
                row["regret_before"].append(fs.knee_regret(first, t, f))
                row["regret_after"].append(fs.knee_regret(after, t, f))
                row["contenders"].append(len(chosen))
            rows[block] = row
        out[f"{extrapolate:g}"] = rows
    return out


def print_seed_repeats(r: dict[str, Any], seeds: int, noise: float) -> None:
    print(
        f"seed repeats, replayed (each study's contenders ranked by their mean over the {seeds} proxy seeds):"
    )
    for extrapolate, rows in r.items():
        together = [_sum([x for row in rows.values() for x in row[when]]) for when in ("before", "after")]
        parts = [
            f"{block} regret {_regrets(row['regret_before'])} -> {_regrets(row['regret_after'])}"
            for block, row in rows.items()
        ]
        more = max((seeds - 1) * c / row["shapes"] for row in rows.values() for c in row["contenders"])
        print(
            f"  extrapolate {extrapolate}: front recall {_frac(together[0])} -> {_frac(together[1])}; "
            f"{'; '.join(parts)} (reference noise {noise:.4f}); at most {more:.0%} more proxy runs than a "
            "study's first pass"
        )


def print_promotion(r: dict[str, Any]) -> None:
    """The before/after lines of `promotion_report`, one per promoted block, and the blocks together."""
    noise = r.get("reference_noise", 0.0)
    blocks = {block: rows for block, rows in r.items() if block not in ("reference_noise", "settings")}
    for block, rows in blocks.items():
        before, after = rows["before"], rows["after"]
        trained = np.array(after["first_pass_tokens"]) + np.array(after["promotion_tokens"])
        spent = ", ".join(f"{x:.3f}" for x in trained / after["reference_tokens"])
        recall = f"{_frac(_sum(before['front_recall']))} -> {_frac(_sum(after['front_recall']))}"
        ranked_at = ", ".join(f"{t:,}" for t in after["ranked_at"])
        print(
            f"  {block}: front recall {recall}; knee regret by seed {_regrets(before['knee_regret'])} -> "
            f"{_regrets(after['knee_regret'])} (reference noise {noise:.4f}); ranked at {ranked_at} tokens; "
            f"{', '.join(map(str, after['contenders']))} contenders; trained {spent} of the"
            " references' tokens"
        )
    if blocks:
        together = [
            _sum([x for rows in blocks.values() for x in rows[when]["front_recall"]])
            for when in ("before", "after")
        ]
        print(f"  together: front recall {_frac(together[0])} -> {_frac(together[1])}")


def _sum(pairs: list[list[int]]) -> list[int]:
    return [sum(p[0] for p in pairs), sum(p[1] for p in pairs)]


def _regrets(values: list[float]) -> str:
    return "/".join(f"{v:.3f}" for v in values)


def print_report(r: dict[str, Any]) -> None:
    ceiling = r["reference_ceiling"]
    print(
        f"{r['shapes']} shapes ({r['left_out']} left out), proxy seeds {r['proxy_seeds']}; reference noise "
        f"(rms gap of two seeds, {r['second_seed_shapes']} shapes) {r['reference_noise']:.4f}; reference "
        f"ceiling (Spearman seed 1 vs 0) {estimate(ceiling) if ceiling else '-'}; proxy compute per shape "
        f"{r['compute_per_shape']:.3f} of a 10x run"
    )
    head = ("predictor", "Spearman [95%]", "Kendall [95%]", "- params [95%]", "- FLOPs [95%]",
            "pairs>noise", "iso pairs", "front recall", "knee regret")  # fmt: skip
    print("".join(f"{h:<26}" if i == 0 else f"{h:>21}" for i, h in enumerate(head)))
    for name, p in r["predictors"].items():
        cells = [
            estimate(p["spearman"]), estimate(p["kendall"]),
            estimate(p["vs_params"]), estimate(p["vs_flops"]),
            _frac(p["pairs"]), _frac(p["iso_pairs"]), _frac(p["front_recall"]), f"{p['knee_regret']:.4f}",
        ]  # fmt: skip
        print(f"{name:<26}" + "".join(f"{c:>21}" for c in cells))
    if r.get("promotion"):
        settings = r["promotion"].get("settings") or "settings not recorded"
        print(f"promotion ({settings}; before: the first pass by the study's loss objective, beta 0.15; "
              "after: as the promoted front ranks):")  # fmt: skip
        print_promotion(r["promotion"])
    if r.get("seed_repeats"):
        print_seed_repeats(r["seed_repeats"], len(r["proxy_seeds"]), r["reference_noise"])
    for block, predictors in r.get("blocks", {}).items():
        print(f"block {block}:")
        for name, p in predictors.items():
            print(f"  {name:<24} Spearman {estimate(p['spearman'])}, "
                  f"front recall {_frac(p['front_recall'])}, knee regret {p['knee_regret']:.4f}")  # fmt: skip


# The grid of the loss objective's constants that `benchmarks/public_runs.py --sweep` scores on public
# GPU runs, scored here on this set: which constants help which regime (docs/accuracy.md).
SWEEP_BETAS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3)
SWEEP_EXTRAPOLATES = (0.0, 1.0, 2.0, 3.0)


def print_sweep(data: dict[str, Any], min_shapes: int = MIN_SHAPES, partial: bool = False) -> None:
    """Each (size_beta, extrapolate) of the grid as the search's loss objective on the recorded
    proxies: Spearman against the 10x runs (mean over the proxy seeds), iso-size pairs, and its
    Spearman minus the shipped constants' (`SIZE_BETA`, `EXTRAPOLATE`), paired over shapes at each
    seed."""
    from archsearch.search import fidelity_stats as fs
    from archsearch.space.objectives import LossRule, curve_change

    shapes, _ = scorable(data, min_shapes, partial)
    target = np.array([next(r["val_loss"] for r in s["references"] if r["seed"] == 0) for s in shapes])
    seeds = sorted({p["seed"] for p in shapes[0]["proxies"]})
    iso = np.array([s["block"] == "iso" for s in shapes])
    # Pairs closer than the reference's seed noise are ties, as the report counts them.
    twice = [s for s in shapes if {0, 1} <= {r["seed"] for r in s["references"]}]
    first, second = (
        [next(r["val_loss"] for r in s["references"] if r["seed"] == k) for s in twice] for k in (0, 1)
    )
    noise = fs.seed_noise(first, second) if twice else 0.0
    by_seed = [[next(p for p in s["proxies"] if p["seed"] == seed) for s in shapes] for seed in seeds]

    def rows(rule: LossRule) -> np.ndarray:
        return np.array(
            [
                [
                    rule.value(p["val_loss"], curve_change(p["val_curve"]), s["params_total"])
                    for p, s in zip(ps, shapes, strict=True)
                ]
                for ps in by_seed
            ]
        )

    shipped = rows(LossRule(SIZE_BETA, EXTRAPOLATE))
    print(
        f"{len(shapes)} shapes, proxy seeds {seeds}; the loss objective's constants against the 10x runs "
        f"(shipped: size_beta {SIZE_BETA:g}, extrapolate {EXTRAPOLATE:g}); minus shipped: the mean over "
        "seeds, and the seeds whose paired 95% interval lies above / below 0"
    )
    head = f"{'beta':>5s} {'extrap':>6s} {'Spearman [95%]':>20s} {'iso pairs':>14s} {'minus shipped':>14s}"
    print(f"{head} above below")
    for beta in SWEEP_BETAS:
        for extrapolate in SWEEP_EXTRAPOLATES:
            values = rows(LossRule(beta, extrapolate))
            rho = fs.rank_correlation(values, target)
            inside = [fs.pair_accuracy(v, target, noise, within=iso) for v in values] if iso.any() else []
            right, counted = sum(r for r, _ in inside), sum(c for _, c in inside)
            diff = [fs.paired_difference(v, b, target) for v, b in zip(values, shipped, strict=True)]
            above, below = sum(d.low > 0 for d in diff), sum(d.high < 0 for d in diff)
            print(
                f"{beta:5.2f} {extrapolate:6g} {estimate(rho.to_dict()):>20s} {_frac([right, counted]):>14s} "
                f"{np.mean([d.value for d in diff]):+14.3f} {above:>5d} {below:>5d}"
            )


def estimate(e: dict[str, float | None]) -> str:
    from archsearch.search.fidelity_stats import estimate_text

    return estimate_text(e, value_spec=".3f")


def _frac(pair: list[int]) -> str:
    right, n = pair
    return f"{right}/{n} ({right / n:.0%})" if n else "-"


def start_ray(stack: contextlib.ExitStack, cpus: int, address: str | None = None) -> None:
    """A local Ray in this process (or the cluster at `address` joined), shut down (left) when
    `stack` closes: the steps run here use it."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    from archsearch.search.pool import start_local_ray

    if address:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    else:
        start_local_ray(cpus, log_to_driver=False)
    stack.callback(ray.shutdown)


def steps(
    args: argparse.Namespace,
    stages: list[str],
    blocks: tuple[Block, ...],
    tokens: int | None,
    multiplier: int,
    second: int,
    work: Path,
    db: Path,
    step: Callable[[list[str]], None],
) -> None:
    """The search and validate commands of `stages`, each run by `step`."""
    storage = f"sqlite:///{db}"
    workers = str(args.workers)
    proxy_seeds = PROXY_SEEDS[: 2 if args.smoke else 3]

    def search(block: Block, seed: int, space: Path) -> list[str]:
        study, trials, replay = study_name(block, seed), block.shapes, []
        if seed > 0:
            shapes = complete_trials(db, study_name(block, 0))
            trials, replay = trial_target(db, study, shapes), ["--replay", study_name(block, 0)]
        return archsearch(
            "search", "--space", str(space), "--study", study, "--storage", storage,
            "--sampler", "random", "--seed", str(block.sampler_seed), "--no-prune",
            "--trials", str(trials), "--workers", workers, "--resume", *replay,
        )  # fmt: skip

    if "proxies" in stages:
        for seed in proxy_seeds:
            for block in blocks:
                step(search(block, seed, seeded_space(block, seed, work, tokens)))
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
    if "promote" in stages:
        # Each seed's finished study resumed with promotion: its first pass is kept, and only the
        # contenders train (afresh at each longer budget: the blocks' proxy sets its warm-up as a
        # fraction, so no final state is resumable). A smoke run promotes the first seed's only.
        for seed in proxy_seeds[:1] if args.smoke else proxy_seeds:
            for block in blocks:
                if block.name in PROMOTED_BLOCKS and complete_trials(db, study_name(block, seed)):
                    step(search(block, seed, promoted_space(block, seed, work, tokens, args.promote_from)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, help="working database (default: a copy of --snapshot)")
    parser.add_argument("--snapshot", type=Path, default=SNAPSHOT)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    parser.add_argument("--workers", type=int, default=None, help="trials at once (default 2; --smoke 1)")
    parser.add_argument(
        "--address", default=None, help="a Ray cluster the searches and validations join (default: each "
        "starts its own; --smoke starts one for all its steps)"
    )  # fmt: skip
    parser.add_argument(
        "--promote-from", type=Path, default=EXAMPLE,
        help="the space file whose [search] promote the promote stage uses (default: the tiny example)",
    )  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="one block of 4 shapes, tiny budgets")
    parser.add_argument("--report", action="store_true", help="score the recorded --out set; train nothing")
    parser.add_argument(
        "--checkpoint", action="store_true",
        help="copy the working --db to --snapshot and write --out (what a running calibration has "
        "finished mid-step: a step snapshots only when it ends); train nothing",
    )  # fmt: skip
    parser.add_argument("--partial", action="store_true", help="--report: score the complete shapes only")
    parser.add_argument("--json", action="store_true", help="--report: print one JSON object")
    parser.add_argument(
        "--sweep", action="store_true", help="--report: the loss objective's size_beta x extrapolate grid"
    )
    args = parser.parse_args()
    if args.workers is None:
        # The smoke's trials take a second each: a second worker would save little of that, and its
        # first trial pays torch's import and the step counts again (seconds of CPU on a shared host).
        args.workers = 1 if args.smoke else 2
    if args.report:
        min_shapes = 4 if args.smoke else MIN_SHAPES
        try:
            data = json.loads(args.out.read_text())
            if args.sweep:
                print_sweep(data, min_shapes, args.partial)
                return
            scored = report(data, min_shapes, args.partial)
        except (OSError, ValueError, KeyError) as exc:
            raise SystemExit(f"calibration: cannot read {args.out}: {exc}") from None
        except SetError as exc:
            print(f"calibration: {args.out}: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        print(json.dumps(scored, indent=1) if args.json else "", end="")
        if not args.json:
            print_report(scored)
        return
    stages = [s for s in args.stages.split(",") if s]
    if unknown := sorted(set(stages) - set(STAGES)):
        parser.error(f"unknown stage(s) {', '.join(unknown)}; valid: {', '.join(STAGES)}")

    blocks, tokens, multiplier, second = BLOCKS, None, MULTIPLIER, SECOND_SEED_PER_BLOCK
    if args.smoke:
        blocks = (Block("tiny", SPACES / "cal-tiny.toml", 4, 31),)
        tokens, multiplier, second = SMOKE_TOKENS, 2, 4
    work = Path(os.environ.get("ARCHSEARCH_CALIBRATION_DIR", ROOT / ".calibration"))
    work.mkdir(parents=True, exist_ok=True)
    db = args.db or work / "cal3.db"
    if not db.exists() and args.snapshot.exists() and not args.smoke:
        shutil.copyfile(args.snapshot, db)  # resume what earlier sessions recorded
        print(f"resuming from {args.snapshot}", flush=True)
    commands = [] if args.smoke else _recorded_commands(args.out)  # earlier runs' steps stay listed
    if args.checkpoint:
        if not db.exists():
            raise SystemExit(f"calibration: no working database at {db}")
        snapshot(db, args.snapshot)
        data = record(db, blocks, args.out, commands)
        refs = sum(len(s["references"]) for s in data["shapes"])
        print(f"checkpoint: {len(data['shapes'])} shapes, {refs} long runs in {args.out} and {args.snapshot}")
        return

    # The smoke run's steps run in this process, on one Ray started (or joined) here rather than one
    # each: a local start is most of a tiny step's time. On a database that exists (a resume) no Ray
    # starts first: a step whose work is all stored needs none, and one that has work starts its own.
    # The recorded commands leave the address out.
    ray_up = contextlib.ExitStack()
    join = ["--address", args.address] if args.address and not args.smoke else []
    if args.smoke and not db.exists():
        start_ray(ray_up, args.workers, args.address)

    promote = example_promote(args.promote_from) if "promote" in stages else None

    def step(argv: list[str]) -> None:
        (run_here if args.smoke else run)(argv + join)
        if (command := shlex.join(["archsearch", *argv[3:]])) not in commands:
            commands.append(command)
        snapshot(db, args.snapshot)
        record(db, blocks, args.out, commands, promote)

    with ray_up:
        steps(args, stages, blocks, tokens, multiplier, second, work, db, step)
    data = record(db, blocks, args.out, commands, promote)
    refs = sum(len(s["references"]) for s in data["shapes"])
    proxies = sum(len(s["proxies"]) for s in data["shapes"])
    print(f"recorded {len(data['shapes'])} shapes, {proxies} proxies, {refs} long runs in {args.out}")


if __name__ == "__main__":
    main()
