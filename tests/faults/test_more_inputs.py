"""Inputs and environments the sixth probe of issue 26 found a traceback, an endless wait, a
silent substitution or the wrong exit code in: a recorded run with impossible steps, a corpus
path that is empty or holds a NUL, empty values given for options that have defaults, GPUs asked
of a local Ray that has none, a library that cannot be mapped under a memory limit, a file name
too long for the file system, a training run that fails, a PostgreSQL server that is not there,
and a signal while the interpreter tears down after a complete run."""

from __future__ import annotations

import copy
import json
import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.cli import boundary as cli_boundary
from archsearch.storage import Storage, StorageUnavailableError
from tests.faults.test_inputs import PROXY, _one_line, _space
from tests.processes import start_archsearch, wait_for
from tests.storage.test_query import fill_study

RECORDED = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_model_accuracy_h100_2026-11-22.json"


# --- fit-device: a recorded run whose steps are impossible ---------------------------------------------
@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("batch", 0, "batch must be a positive integer, got 0"),
        ("batch", -8, "batch must be a positive integer, got -8"),
        (
            "train_step_s",
            float("nan"),
            "train_step_s must be a positive number of seconds up to 3600, got nan",
        ),
        ("train_step_s", 0, "train_step_s must be a positive number of seconds up to 3600, got 0"),
        ("train_step_s", -1.0, "train_step_s must be a positive number of seconds up to 3600, got -1.0"),
        ("train_step_s", True, "train_step_s must be a positive number of seconds up to 3600, got True"),
        ("train_step_s", 1e308, "train_step_s must be a positive number of seconds up to 3600, got 1e+308"),
    ],
    ids=["batch-0", "batch-negative", "step-nan", "step-0", "step-negative", "step-bool", "step-1e308"],
)
def test_a_recorded_run_with_an_impossible_shape_is_refused(tmp_path, field, value, why):
    """Probe 6: a batch of 0 was a ValueError traceback; a NaN, zero or negative real step was
    fitted (NaN constants, numpy's divide-by-zero warning, garbage), exit 0."""
    raw = json.loads(RECORDED.read_text())
    broken = copy.deepcopy(raw)
    broken["shapes"][0][field] = value
    path = tmp_path / "run.json"
    path.write_text(json.dumps(broken))
    result = CliRunner().invoke(app, ["fit-device", str(path), "--device", "h100-sxm", "--no-holdout"])
    line = _one_line(result, 2, "not a recorded gpu_model_accuracy run: ")
    assert f"shapes[0] ({raw['shapes'][0]['label']!r}): {why}" in line, line


# --- [proxy] data that names nothing -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "shown"), [('""', "''"), ('"a\\u0000b"', "'a\\x00b'")], ids=["empty", "nul"]
)
def test_a_corpus_path_that_names_nothing_is_refused(tmp_path, monkeypatch, data, shown):
    """Probe 6: `data = ""` read the space file's own folder as the corpus, exit 0; a NUL in the
    path was a ValueError traceback ('embedded null byte')."""
    monkeypatch.chdir(tmp_path)
    space = _space(tmp_path, proxy=f"{PROXY}\ndata = {data}")
    result = CliRunner().invoke(app, ["space", "check", str(space)])
    assert _one_line(result, 2) == f"error: {space}: [proxy].data: must name a file or folder, got {shown}"


def test_a_space_file_with_a_byte_order_mark_says_so(tmp_path):
    """Probe 6: a space saved by Notepad (UTF-8 with a BOM) was 'invalid TOML: Invalid statement (at
    line 1, column 1)'."""
    space = _space(tmp_path)
    space.write_bytes(b"\xef\xbb\xbf" + space.read_bytes())
    result = CliRunner().invoke(app, ["space", "check", str(space)])
    assert _one_line(result, 2) == (
        f"error: {space}: invalid TOML: the file starts with a byte-order mark (U+FEFF); save it without one"
    )


# --- empty values are refused, not replaced by the default ------------------------------------------------
def test_empty_objectives_are_refused_not_the_default(study_url):
    """Probe 6: `pareto --objectives ''` ranked the study's own objectives, exit 0."""
    result = CliRunner().invoke(app, ["pareto", "--study", "s", "--objectives", "", "--storage", study_url])
    _one_line(result, 2, "objectives '' must be loss then one or two of")


def test_an_empty_storage_is_refused_not_the_default_database(tmp_path, monkeypatch):
    """Probe 6: `--storage ''` opened ./archsearch.db (`no database at archsearch.db`)."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["studies", "--storage", ""])
    assert (
        _one_line(result, 2)
        == "error: --storage is empty: give a database URL (e.g. sqlite:///archsearch.db)"
    )
    assert list(tmp_path.iterdir()) == []


# --- GPUs a local Ray does not have ---------------------------------------------------------------------
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
    """Probe 6: `search --gpus-per-trial 1` on a machine without a GPU waited without end (Ray
    queues a task no node can run), and its SIGTERM left an empty study a plain rerun refused."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # what a local Ray counts: none
    space = _space(tmp_path)
    args = [a.format(space=space) for a in command]
    result = CliRunner().invoke(app, [*args, "--storage", study_url])
    per = "trial" if command[0] == "search" else "run"
    assert _one_line(result, 2) == (
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


# --- the command boundary -----------------------------------------------------------------------------
def test_a_library_that_cannot_be_mapped_under_a_memory_limit_is_the_out_of_memory_line(
    monkeypatch, tmp_path
):
    """Probe 6: `profile`, `train`, `align`, `export --scale-to` under `ulimit -v 500000` ended in
    torch's ImportError traceback ('libtorch_cpu.so: failed to map segment from shared object')."""

    def unmappable(*args, **kwargs):
        raise ImportError("libtorch_cpu.so: failed to map segment from shared object")

    monkeypatch.setattr("archsearch.cli.devices.resolve_config", unmappable)
    result = CliRunner().invoke(app, ["align", "--preset", "gpt2-small", "--device", "h100-sxm"])
    assert _one_line(result, 1) == f"error: {cli_boundary.OUT_OF_MEMORY}"


def test_another_import_error_keeps_its_traceback(monkeypatch):
    def missing(*args, **kwargs):
        raise ImportError("No module named 'nothing_here'")

    monkeypatch.setattr("archsearch.cli.devices.resolve_config", missing)
    result = CliRunner().invoke(app, ["align", "--preset", "gpt2-small", "--device", "h100-sxm"])
    assert isinstance(result.exception, ImportError)  # a bug, not the environment: not hidden


def test_a_file_name_too_long_for_the_file_system_is_bad_input(study_url, tmp_path):
    """Probe 6: `pareto --plot <300 characters>.png` was exit 1, the environment's code."""
    out = tmp_path / f"{'a' * 300}.png"
    result = CliRunner().invoke(app, ["pareto", "--study", "s", "--plot", str(out), "--storage", study_url])
    assert _one_line(result, 2) == f"error: cannot use {out}: File name too long"


def test_an_os_error_without_a_file_is_not_said_twice():
    assert cli_boundary.os_error_text(OSError(28, "No space left on device")) == "No space left on device"


def test_a_failed_training_run_says_why_on_stderr(monkeypatch):
    """Probe 6: `train --batch-size 1000000000000` exited 1 with the reason only in the table on
    stdout and nothing on stderr."""
    from archsearch.evaluators import trainer

    real = trainer.train

    def too_large(cfg, dataset, settings, progress=None):
        result = real(cfg, dataset, settings.__class__(**{**settings.__dict__, "tokens": 1}), progress)
        return result.__class__(
            **{**result.__dict__, "status": "failed", "reason": "config too large for cpu"}
        )

    monkeypatch.setattr(trainer, "train", too_large)
    result = CliRunner().invoke(app, ["train", "--preset", "byte-1m", "--device", "cpu", "--tokens", "512"])
    assert _one_line(result, 1) == "error: the run failed: config too large for cpu"
    assert "failed (config too large for cpu)" in result.stdout


# --- PostgreSQL ----------------------------------------------------------------------------------------
def test_a_postgresql_server_that_refuses_connections_is_the_environment_s_fault(tmp_path, monkeypatch):
    """Probe 6: a server that is down (connection refused) was exit 2, bad input, where the same
    server stopping mid-search is exit 1. A missing database stays the input's fault."""
    url = "postgresql+psycopg://postgres@127.0.0.1:1/none"
    with pytest.raises(StorageUnavailableError) as info:
        Storage.open(url)
    assert str(info.value).startswith(
        f"cannot reach the database {url} (waited up to 15 s): OperationalError: "
    )
    assert "Connection refused" in str(info.value)
    monkeypatch.chdir(tmp_path)
    for command in (["studies"], ["search", "--space", str(_space(tmp_path)), "--study", "s"]):
        result = CliRunner().invoke(app, [*command, "--storage", url])
        _one_line(result, 1, "cannot reach the database", "Connection refused")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.toml"]


# --- a signal after the command has ended ----------------------------------------------------------------
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_interpreter_tears_down_keeps_the_command_s_exit_code(tmp_path, signum):
    """Probe 6: `export` signalled as it exited (its folder written, its lines printed) died by the
    signal's default action, which Python puts back while it finalises: exit 130 / 143, no line.
    Waited for by state: the signal is sent once the output is complete."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    with Storage.open(url) as db:
        fill_study(db)
    out = tmp_path / "out"
    proc = start_archsearch(
        "export",
        "--study",
        "s",
        "--front",
        "--format",
        "json",
        "-o",
        str(out),
        "--storage",
        url,
        cwd=tmp_path,
    )
    wait_for(lambda: (out / "index.json").exists() or proc.poll() is not None, 120, "the export", every=0.002)
    if proc.poll() is None:  # still running: printing its lines, or tearing down
        proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    assert json.loads((out / "index.json").read_text())  # written whole either way
    if proc.returncode != 0:  # the signal came before the command had ended (its last lines): it says so
        assert (proc.returncode, stderr) == (
            128 + signum,
            f"error: interrupted by {signal.Signals(signum).name}\n",
        )
    else:  # it came while the interpreter tore down: the command's own code, not a silent 130 / 143
        assert stderr == "" and "trial" in stdout


def test_the_teardown_ignores_signals_and_is_bounded(monkeypatch):
    from archsearch import __main__ as entry

    calls = []
    monkeypatch.setattr(entry.signal, "signal", lambda s, h: calls.append((s, h)))
    monkeypatch.setattr(entry.signal, "alarm", lambda s: calls.append(("alarm", s)))
    entry._settled()
    assert calls == [
        (signal.SIGINT, signal.SIG_IGN),
        (signal.SIGTERM, signal.SIG_IGN),
        ("alarm", entry.TEARDOWN_BOUND_S),
    ]
