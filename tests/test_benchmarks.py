"""The benchmarks still run against the current API: each in its smoke mode, as a real process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _smoke(
    script: str, *args: str, timeout: float = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`benchmarks/SCRIPT --smoke ARGS` as a real process; it must exit 0."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--smoke", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_query_speed_smoke(tmp_path):
    done = _smoke("query_speed.py", "--keep", str(tmp_path), timeout=300)
    assert "database: 300 trials" in done.stdout, done.stdout
    assert "trials on the front of" in done.stdout, done.stdout
    assert "python -m archsearch pareto" in done.stdout, done.stdout


def test_proxy_fidelity_smoke():
    done = _smoke("proxy_fidelity.py", "--variants", "reference,tokens2x-constant", timeout=600)
    table, with_size, fixed_beta, cost_curve = done.stdout.split("\n\n")
    lines = table.splitlines()
    assert lines[0].startswith("3 shapes; long-run reference: recorded 10x runs"), done.stdout
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"params", "forward", "reference", "tokens2x-constant"}, done.stdout
    assert rows["tokens2x-constant"][1] == "0.07x", done.stdout  # 2 x 4,096 smoke tokens of 120k
    # The proxy beside params, the size-adjusted loss and the rank sum: a beta, 8 correlations,
    # two iso-pair and two shared-front counts per variant.
    lines = with_size.splitlines()
    assert lines[3].split()[:5] == ["variant", "beta", "proxy", "params", "adjusted"], done.stdout
    rows = {line.split()[0]: line.split() for line in lines[4:]}
    assert set(rows) == {"reference", "tokens2x-constant"}, done.stdout
    assert all(len(row) == 1 + 1 + 8 + 4 * 3 for row in rows.values()), done.stdout
    # The size-adjusted loss at each fixed beta (`--betas`): Spearman and "k of front/10x front".
    lines = fixed_beta.splitlines()
    assert lines[2].split()[:3] == ["variant", "beta", "0"], done.stdout
    rows = {line.split()[0]: line.split() for line in lines[3:]}
    assert set(rows) == {"reference", "tokens2x-constant"}, done.stdout
    assert all(len(row) == 1 + 7 * 4 for row in rows.values()), done.stdout  # 7 default betas
    # Fidelity against cost from the recorded long runs' own evaluations: the 5x run's 4, the 10x
    # run's first 3 (its last is the reference), each at beta 0 and 0.15.
    lines = cost_curve.splitlines()
    assert lines[1].split() == ["prefix", "of", "10x", "beta", "0", "beta", "0.15"], done.stdout
    assert [line.split()[0] for line in lines[2:]] == ["x5"] * 4 + ["x10"] * 3, done.stdout
    assert lines[-1].split()[5] == "0.751", done.stdout  # 901,120 of the 10x run's 1,200,128 tokens


def test_proxy_fidelity_scores_the_searchs_retry_of_stalled_runs():
    done = _smoke("proxy_fidelity.py", "--variants", "tokens2x-constant-retry", timeout=600)
    # Smoke runs are too short to be judged stalled: the first variant's runs stand, and the
    # derived variant is scored beside them with its two sources trained.
    assert "tokens2x-constant-retry: no run of tokens2x-constant stalled" in done.stdout, done.stdout
    table = done.stdout.split("\n\n")[0].splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("predictor"))
    rows = [line.split()[0] for line in table[header + 1 :]]
    assert rows == ["params", "forward", "tokens2x-constant-retry"], done.stdout


def test_step_time_accuracy_smoke():
    done = _smoke("step_time_accuracy.py", timeout=600)
    assert "stored/trainer" in done.stdout, done.stdout


def test_threads_smoke():
    done = _smoke("threads.py", timeout=300)
    lines = done.stdout.splitlines()
    assert "tok/s @1" in lines[2] and "tok/s @2" in lines[2] and "2/1" in lines[2], done.stdout
    assert lines[3].startswith("d64 L1 ff128 mha"), done.stdout  # the tiny space's smallest shape


def test_search_quality_smoke(tmp_path):
    cache = tmp_path / "outcomes.jsonl"
    done = _smoke("search_quality.py", "--samplers", "tpe,random", "--cache", str(cache), timeout=600)
    out = done.stdout
    assert "2 searches of examples/tiny.toml at 4,096 proxy tokens, no pruning" in out, out
    lines = out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines if line.startswith(("  tpe ", "  random "))}
    assert rows["tpe"][1] == rows["random"][1] == "1", out  # one seed each in the smoke run
    assert rows["tpe"][-1] == "-" and rows["random"][-1] != "-", out  # only random runs to 2N
    assert "random needs" in out and "mean hypervolume at 3" in out, out
    assert "front, pruning" in out, out
    # Each distinct shape trained once, whichever search met it first.
    keys = [json.loads(line)["key"] for line in cache.read_text().splitlines()]
    assert keys and len(keys) == len(set(keys)), keys


# benchmark -> lines its smoke run must print (the numbers vary; the report's shape does not)
SMOKES = {
    "cost_model": ["cost model, 50 random configs:", "build + FlopCounterMode on meta"],
    "lr_transfer": ["2,048 tokens per run", "per-width        64", "one rate         64"],
    "profiler_accuracy": ["fitting set: 8 GEMMs", "held-out:", "median relative error"],
    "gpu_model_accuracy": ["measured on NVIDIA H100 80GB HBM3"],
    "pruning": ["2 trials of examples/tiny.toml", "front, pruning"],
    "search_overhead": ["1. overhead: 3 no-work trials", "speed-up of 2 workers over 1"],
}


@pytest.mark.parametrize("name", sorted(SMOKES))
def test_every_benchmark_runs_in_smoke_mode(name):
    done = _smoke(f"{name}.py", timeout=600)
    for line in SMOKES[name]:
        assert line in done.stdout, done.stdout[-3000:]


def test_trainer_throughput_smoke_trains_in_the_precision_auto_resolves_to(cpu_bf16):
    # "auto" is fp32 on a CPU without native bf16 and bf16 with it: the benchmark names the one it
    # trained and took the GEMM peak in, on any host, under either setting of the switch.
    done = _smoke("trainer_throughput.py", timeout=600)
    assert f"precision {cpu_bf16}" in done.stdout, done.stdout[-3000:]
    assert f"GEMM peak ({cpu_bf16}): " in done.stdout, done.stdout[-3000:]
    assert "d128 L4" in done.stdout, done.stdout[-3000:]


def test_every_benchmark_has_a_smoke_test():
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py")}
    tested = set(SMOKES) | {"query_speed", "proxy_fidelity", "step_time_accuracy", "threads"}
    tested |= {"search_quality", "trainer_throughput", "calibration", "ladder_accuracy"}
    assert scripts == tested


def test_calibration_smoke_records_every_stage_and_resumes_without_training_again(tmp_path):
    import os

    out, snap = tmp_path / "set.json", tmp_path / "set.sqlite"
    env = {**os.environ, "ARCHSEARCH_CALIBRATION_DIR": str(tmp_path / "work")}
    args = ("--out", str(out), "--snapshot", str(snap))
    done = _smoke("calibration.py", *args, timeout=900, env=env)
    data = json.loads(out.read_text())
    shapes = data["shapes"]
    assert len(shapes) == 4 and {s["block"] for s in shapes} == {"tiny"}, done.stdout[-3000:]
    # Each shape: the proxy at 2 seeds (the smoke run's), the 2x reference at seeds 0 and 1.
    assert all(sorted(p["seed"] for p in s["proxies"]) == [0, 1] for s in shapes), shapes
    assert all(sorted(r["seed"] for r in s["references"]) == [0, 1] for s in shapes), shapes
    assert all(r["multiplier"] == 2 and r["tokens"] > 2 * 4096 * 0.9 for s in shapes for r in s["references"])
    assert "archsearch validate --study cal3-tiny-p0" in "\n".join(data["commands"])
    assert snap.exists()
    # Again on the same database: every search resumes a finished study, validate finds every
    # long run stored; nothing is trained, the records are the same.
    again = _smoke("calibration.py", *args, "--db", str(tmp_path / "work" / "cal3.db"), timeout=900, env=env)
    assert again.stdout.count("0 long runs trained") == 2, again.stdout[-3000:]
    assert json.loads(out.read_text())["shapes"] == shapes
    # Scored: every predictor with its intervals, pairs, front recall and knee regret.
    scored = _smoke("calibration.py", *args, "--report", "--json", timeout=300, env=env)
    report = json.loads(scored.stdout)
    assert report["shapes"] == 4 and report["proxy_seeds"] == [0, 1] and report["second_seed_shapes"] == 4
    assert set(report["predictors"]) >= {"params", "flops", "proxy loss"}
    measures = {"spearman", "vs_params", "front_recall", "knee_regret"}
    assert all(measures <= set(p) for p in report["predictors"].values())


def _bad_set(tmp_path, shapes: list[dict]) -> subprocess.CompletedProcess:
    path = tmp_path / "set.json"
    path.write_text(json.dumps({"shapes": shapes}))
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "calibration.py"), "--report", "--out", str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _shape(trial: int, references: tuple[int, ...] = (0,)) -> dict:
    loss = 2.0 + trial / 10
    proxy = {"seed": 0, "val_loss": loss, "val_curve": [[1, 2.5], [2, loss]], "retried": False}
    return {
        "block": "tiny", "trial": trial, "params_total": 1e5 * (trial + 1), "flops_forward_per_token": 1e6,
        "proxies": [proxy], "references": [{"seed": s, "val_loss": 1.5, "tokens": 20} for s in references],
    }  # fmt: skip


def test_a_set_too_small_or_missing_a_reference_is_refused_in_one_line(tmp_path):
    few = _bad_set(tmp_path, [_shape(i) for i in range(3)])
    assert few.returncode == 2 and few.stdout == "", few.stderr
    assert few.stderr.strip().endswith("3 complete shapes; a set needs at least 10 to be scored"), few.stderr
    assert len(few.stderr.strip().splitlines()) == 1
    gap = _bad_set(tmp_path, [_shape(i) for i in range(12)] + [_shape(12, references=())])
    assert gap.returncode == 2 and len(gap.stderr.strip().splitlines()) == 1, gap.stderr
    assert "1 of 13 shapes lack a seed-0 reference or a proxy repeat (first: block tiny trial 12)" in (
        gap.stderr
    )


def test_the_calibration_sets_tiny_block_is_the_tiny_example():
    # benchmarks/calibration.py's first block must calibrate the example users run: the same
    # space, budget, proxy and objective (only the profile and sampler differ, and only losses
    # are calibrated).
    import tomllib

    example = tomllib.loads((ROOT / "examples" / "tiny.toml").read_text())
    block = tomllib.loads((ROOT / "benchmarks" / "spaces" / "cal-tiny.toml").read_text())
    for table in ("model", "rules", "budget", "proxy", "objectives"):
        assert block[table] == example[table], table
    assert block["search"]["sampler"] == "random" and block["search"]["prune"] is False


def test_ladder_accuracy_smoke_predicts_the_real_runs_and_resumes_without_training_again(tmp_path):
    import os

    env = {**os.environ, "ARCHSEARCH_LADDER_DIR": str(tmp_path)}
    out = tmp_path / "record.json"
    done = _smoke("ladder_accuracy.py", "--out", str(out), timeout=900, env=env)
    assert "3 designs; law: E " in done.stdout, done.stdout[-3000:]
    assert "median abs error" in done.stdout and "Spearman against the real ranking: ladder" in done.stdout
    record = json.loads(out.read_text())
    rows = record["rows"]
    assert len(rows) == 3 and all(r["real"] is not None and len(r["rungs"]) == 3 for r in rows), rows
    assert all(r["low"] <= r["predicted"] <= r["high"] and r["distance"] > 1 for r in rows), rows
    assert any(c.startswith("archsearch ladder --study ladder-smoke") for c in record["commands"])
    assert set(record["measures"]["spearman"]) == {"ladder", "proxy", "proxy_adjusted"}
    # Again: the ladder finds every rung stored and the real runs recorded; nothing is trained.
    again = _smoke("ladder_accuracy.py", "--out", str(out), timeout=900, env=env)
    assert "real runs: 0 to train, 3 recorded" in again.stdout, again.stdout[-3000:]
    assert "0 rungs trained, 9 reused from earlier runs" in again.stderr, again.stderr[-3000:]
    assert [r["real"] for r in json.loads(out.read_text())["rows"]] == [r["real"] for r in rows]
