"""Extract the compact CSVs of `benchmarks/public_runs.py` from snapshots of two public repositories.

Reads the repositories' files with `git show` (no network), writes the columns the benchmark needs:

    python benchmarks/data/public_runs/extract.py GEMSTONES_GIT_DIR OLMO_LADDER_GIT_DIR

GEMSTONES_GIT_DIR: a clone (or bare git dir) of github.com/mcleish7/gemstone-scaling-laws (MIT);
OLMO_LADDER_GIT_DIR: one of github.com/allenai/OLMo-ladder (Apache-2.0). The commits read are
written into README.md by hand; rerunning at those commits gives the same files byte for byte.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOKENS_PER_STEP = 4_194_304  # Gemstones' global batch, 2048 sequences of 2048 tokens (477 steps = 2.0B)
# The OLMo-2 ladder's sizes by the name its files use, with the parameter counts its code states
# (src/ladder/ladder.py, MODEL_PARAMS: "updated with actual Peteish count").
OLMO_PARAMS = {
    "190M": 190354176,
    "370M": 371262464,
    "760M": 758220288,
    "1B": 1279395840,
    "3B": 3169537280,
}
OLMO_MULTIPLIERS = ("0.5xC", "1xC", "2xC", "5xC", "10xC")
C4 = "eval/c4_en-validation/CrossEntropyLoss"


def show(git_dir: str, path: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", git_dir, "show", f"HEAD:{path}"], check=True, capture_output=True, text=True
    ).stdout


def gemstones(git_dir: str) -> None:
    with open(HERE / "gemstones_hot.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["shape", "width", "depth", "params", "tokens", "loss"])
        for line in show(git_dir, "wandb_dfs/wandb_df_for_fitting_hot_100b+_477.jsonl").splitlines():
            r = json.loads(line)
            shape = f"{r['width']}x{r['depth']}"
            out.writerow(
                [
                    shape,
                    r["width"],
                    r["depth"],
                    r["params_active_precise"],
                    r["tokens"],
                    f"{r['final_loss']:.5f}",
                ]
            )
    with open(HERE / "gemstones_cool.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["shape", "params", "tokens", "loss"])
        for line in show(git_dir, "wandb_dfs/wandb_df_for_fitting_cool_end.jsonl").splitlines():
            r = json.loads(line)
            out.writerow(
                [
                    f"{r['width']}x{r['depth']}",
                    r["params_active_precise"],
                    r["tokens"],
                    f"{r['final_loss']:.5f}",
                ]
            )
    shapes = sorted({row.split(",")[0] for row in (HERE / "gemstones_hot.csv").read_text().splitlines()[1:]})
    with open(HERE / "gemstones_other_val.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["shape", "tokens", "fineweb_edu", "dclm"])
        for shape in shapes:
            edu = json.loads(
                show(git_dir, f"other_validation_losses/fineweb_edu_losses/Gemstone-{shape}.json")
            )
            dclm = json.loads(show(git_dir, f"other_validation_losses/dclm_losses/Gemstone-{shape}.json"))
            for key in sorted(k for k in edu if k.startswith("step_") and k in dclm):
                tokens = int(key.removeprefix("step_")) * TOKENS_PER_STEP
                out.writerow([shape, tokens, f"{edu[key]:.5f}", f"{dclm[key]:.5f}"])


def olmo_ladder(git_dir: str) -> None:
    with open(HERE / "olmo2_ladder_c4.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["size", "params", "multiplier", "step", "tokens", "c4_en_loss"])
        for size, params in OLMO_PARAMS.items():
            for mult in OLMO_MULTIPLIERS:
                # The 1xC runs were rerun with evaluations twice as dense; the rerun is the curve kept.
                name = f"{size}-{mult}-rerun" if mult == "1xC" else f"{size}-{mult}"
                text = show(git_dir, f"src/scripts/paper/data/ladder-runs/{name}.csv")
                for r in csv.DictReader(io.StringIO(text)):
                    if r[C4]:
                        tokens = int(float(r["throughput/total_tokens"]))
                        out.writerow(
                            [
                                size,
                                params,
                                mult.removesuffix("xC"),
                                int(float(r["_step"])),
                                tokens,
                                f"{float(r[C4]):.5f}",
                            ]
                        )

    # The first 1xC runs, trained again as the reruns above: their two final losses are the ladder's
    # own run-to-run spread.
    with open(HERE / "olmo2_ladder_c4_1xc_first.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["size", "params", "step", "tokens", "c4_en_loss"])
        for size, params in OLMO_PARAMS.items():
            text = show(git_dir, f"src/scripts/paper/data/ladder-runs/{size}-1xC.csv")
            last = [r for r in csv.DictReader(io.StringIO(text)) if r[C4]][-1]
            tokens = int(float(last["throughput/total_tokens"]))
            out.writerow([size, params, int(float(last["_step"])), tokens, f"{float(last[C4]):.5f}"])


if __name__ == "__main__":
    gemstones(sys.argv[1])
    olmo_ladder(sys.argv[2])
