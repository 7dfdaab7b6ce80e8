"""Ray resources a local Ray does not have: GPUs asked per trial or run are refused before Ray
starts (every task would wait without end), and the local GPU count follows CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.storage import Storage
from tests.helpers import one_line, space_file


@pytest.mark.parametrize(
    "command",
    [
        ["search", "--space", "{space}", "--trials", "1", "--gpus-per-trial", "1"],
        ["validate", "--study", "s", "--trials", "4", "--gpus-per-run", "1"],
        ["ladder", "--study", "s", "--trial", "0", "--gpus-per-run", "1"],
    ],
    ids=["search", "validate", "ladder"],
)
def test_gpus_a_local_ray_does_not_have_are_refused_before_ray_starts(
    tmp_path, monkeypatch, study_url, command
):
    """`search --gpus-per-trial 1` on a machine without a GPU waited without end (Ray
    queues a task no node can run), and its SIGTERM left an empty study a plain rerun refused."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # what a local Ray counts: none
    space = space_file(tmp_path)
    args = [a.format(space=space) for a in command]
    result = CliRunner().invoke(app, [*args, "--storage", study_url])
    per = "trial" if command[0] == "search" else "run"
    assert one_line(result, 2) == (
        f"error: --gpus-per-{per} 1 is more than the 0 GPUs a local Ray finds here: every {per} would wait "
        f"for one without end; use --gpus-per-{per} 0, or join a cluster with GPUs (--address)"
    )
    with Storage.open(study_url, read_only=True) as db:
        assert db.study_names() == ["s"]  # nothing created


def test_the_local_gpu_count_follows_cuda_visible_devices(monkeypatch):
    from archsearch.units import local_gpu_count, ray_resources_problem

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert local_gpu_count() == 2
    assert ray_resources_problem(1.0, 2.0, "trial") is None
    assert ray_resources_problem(1.0, 2.0, "trial", address="ray://head:10001") is None  # a cluster's own
    assert "more than the 2 GPUs" in ray_resources_problem(1.0, 3.0, "trial")
