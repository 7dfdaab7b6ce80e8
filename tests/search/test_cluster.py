"""A search on a multi-node Ray cluster (3 nodes simulated on this machine, `cluster_run.py`) with
its trial database on the local PostgreSQL: trials land on every node, GPU requests queue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.postgres import postgres_database

ROOT = Path(__file__).resolve().parents[2]


def _overlap(trials: list[dict]) -> int:
    """The most trials running at one moment."""
    events = sorted(
        [(t["start"], 1) for t in trials] + [(t["end"], -1) for t in trials], key=lambda e: (e[0], e[1])
    )
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


@pytest.mark.long
def test_a_search_on_a_three_node_cluster_uses_every_node_and_queues_gpu_trials(tmp_path):
    with postgres_database() as url:
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT)}
        run = subprocess.run(
            [sys.executable, "-m", "tests.search.cluster_run", url, str(tmp_path)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    for name, n in (("cpu", 3), ("gpu", 4)):  # a repeated random sample is a duplicate, not trained
        counts = out["counts"][name]
        assert counts["complete"] == n and set(counts) <= {"complete", "duplicate"}, counts
    cpu = [t for t in out["trials"] if t["search"] == "cpu"]
    gpu = [t for t in out["trials"] if t["search"] == "gpu"]
    # Three 1-CPU trials held at once on three 1-CPU nodes: one on each.
    assert {t["node"] for t in cpu} == {out["head"], *out["gpu_nodes"]}
    # GPU trials only where a GPU is declared, never more than the two GPUs at once: the others queued.
    assert {t["node"] for t in gpu} <= set(out["gpu_nodes"]) and len(gpu) == 4
    assert _overlap(gpu) == 2
