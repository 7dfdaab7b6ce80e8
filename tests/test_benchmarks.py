"""The benchmarks still run against the current API: each in its smoke mode, as a real process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_query_speed_smoke(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "query_speed.py"), "--smoke", "--keep", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "database: 300 trials" in done.stdout, done.stdout
    assert "trials on the front of" in done.stdout, done.stdout
    assert "python -m archsearch pareto" in done.stdout, done.stdout


def test_proxy_fidelity_smoke():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "proxy_fidelity.py"), "--smoke",
         "--variants", "reference,tokens2x-constant"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("3 shapes; long-run reference: recorded 10x runs"), done.stdout
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"params", "forward", "reference", "tokens2x-constant"}, done.stdout
    assert rows["tokens2x-constant"][1] == "0.07x", done.stdout  # 2 x 4,096 smoke tokens of 120k


def test_step_time_accuracy_smoke():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "step_time_accuracy.py"), "--smoke"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stored/trainer" in done.stdout, done.stdout


def test_threads_smoke():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "threads.py"), "--smoke"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "tok/s @1" in lines[2] and "tok/s @2" in lines[2] and "2/1" in lines[2], done.stdout
    assert lines[3].startswith("d64 L1 ff128 mha"), done.stdout  # the tiny space's smallest shape
