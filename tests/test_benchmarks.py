"""The benchmarks still run against the current API: each in its smoke mode, as a real process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _smoke(script: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`benchmarks/SCRIPT --smoke ARGS` as a real process; it must exit 0."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--smoke", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
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
    "serve_accuracy": [
        "serve accuracy on",
        "d128-L4-gqa",
        "decode: median |error|",
        "prefill: median |error|",
    ],
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
    tested |= {"search_quality", "trainer_throughput"}
    assert scripts == tested
