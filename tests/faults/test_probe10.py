"""Probe 10's broken promises (issue 26) and probe 9's leftovers: each now one line, the right
exit code, nothing changed."""

from __future__ import annotations

import json
import shlex
import signal

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.errors import Terminated
from archsearch.search import driver as driver_module
from archsearch.search import pool as pool_module
from archsearch.storage import Storage
from archsearch.trial import TrialOutcome
from tests.faults.test_more_inputs import RECORDED
from tests.search.test_driver import instant
from tests.specs import tiny_toml


@pytest.mark.parametrize(
    ("signal_error", "code", "name"), [(KeyboardInterrupt, 130, "SIGINT"), (Terminated, 143, "SIGTERM")]
)
def test_a_second_signal_during_the_clean_up_still_says_how_to_continue(
    tmp_path, monkeypatch, signal_error, code, name
):
    """Probe 9: a second Ctrl-C (which stops waiting for the first one's clean-up) printed
    `interrupted by SIGINT` and no command to continue; a second SIGTERM exited 130."""
    real = driver_module.run_search

    def second_signal(spec, db, options, on_update=None, continue_with=None):
        def update(progress):
            if progress.finished >= 1:  # where the second signal's handler raises, in the loop
                raise signal_error()

        return real(spec, db, options, on_update=update, continue_with=continue_with, evaluate_fn=instant)

    monkeypatch.setattr(driver_module, "run_search", second_signal)
    space = tmp_path / "space.toml"
    space.write_text(tiny_toml(search="trials = 3\nprune = false"))
    url = f"sqlite:///{tmp_path / 't.db'}"
    result = CliRunner().invoke(app, ["search", "--space", str(space), "--study", "s", "--storage", url])
    assert result.exit_code == code, result.output
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: interrupted by {name}; continue with `archsearch search "), line
    command = shlex.split(line.split("`")[1])
    assert "--resume" in command and command[command.index("--storage") + 1] == url
    assert command[command.index("--trials") + 1] == "3"
    with Storage.open(url, create=False) as db:
        assert db.counts("s")["complete"] >= 1  # what finished before the signals is kept


def test_a_second_sigterm_is_a_sigterm():
    stop = pool_module.Stop()
    stop(signal.SIGINT, None)
    with pytest.raises(Terminated):
        stop(signal.SIGTERM, None)


def test_a_huge_objectives_value_is_quoted_once_and_shortened(tmp_path, monkeypatch):
    """Probe 9: `--objectives` of 100k characters was echoed twice and cut to one line saying
    199,212 characters were cut."""
    monkeypatch.chdir(tmp_path)  # the default database's folder
    huge = "x" * 100_000
    result = CliRunner().invoke(app, ["pareto", "--study", "s", "--objectives", huge])
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert "\n" not in line and "characters cut" not in line and len(line) < 400, line
    assert line.startswith("error: unknown objective 'xxx") and "must be loss then" in line


@pytest.mark.parametrize(
    ("interrupt", "code", "name"), [(KeyboardInterrupt, 130, "SIGINT"), (Terminated, 143, "SIGTERM")]
)
def test_a_signal_while_the_arguments_are_parsed_is_one_line(monkeypatch, interrupt, code, name):
    """Probe 10: a SIGTERM 0.2 s into `archsearch studies` (Click parsing the command line, before
    the command boundary) exited 130 with nothing said, in about half of 24 tries."""
    from typer.core import TyperGroup

    def signalled(self, ctx, args):
        raise interrupt

    monkeypatch.setattr(TyperGroup, "parse_args", signalled)
    result = CliRunner().invoke(app, ["studies"])
    assert (result.exit_code, result.stderr) == (code, f"error: interrupted by {name}\n")


@pytest.mark.parametrize("below", ["", "corpora"])
def test_a_cache_folder_that_cannot_exist_is_refused_before_any_trial(tmp_path, monkeypatch, below):
    """Probe 10: `ARCHSEARCH_CACHE` naming a regular file failed every trial (`cannot write the
    corpus cache`) and a search of one trial exited 0."""
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ARCHSEARCH_CACHE", str(blocker / below))
    space = tmp_path / "space.toml"
    space.write_text(tiny_toml(search="trials = 1\nprune = false"))
    db = tmp_path / "t.db"
    for args in (
        ["space", "check", str(space)],
        ["search", "--space", str(space), "--storage", f"sqlite:///{db}"],
    ):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 1, result.output
        assert result.stderr == (
            f"error: cannot make the cache folder {blocker / below}: {blocker} is not a folder; set "
            "ARCHSEARCH_CACHE to a writable folder\n"
        )
    assert not db.exists() and blocker.read_text() == "not a folder"


def _fit_device(tmp_path, raw, device="h100-sxm"):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(raw))
    result = CliRunner().invoke(app, ["fit-device", str(path), "--device", device, "--no-holdout"])
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.count("\n") == 1 and "Error(" not in result.stderr, result.stderr
    return result.stderr.strip()


def _edited(edit):
    raw = json.loads(RECORDED.read_text())
    edit(raw)
    return raw


def test_fit_device_refuses_a_recording_of_another_gpu(tmp_path):
    """Probe 10: an H100 recording fitted as `--device a100-80gb` printed an A100 entry to paste."""
    line = _fit_device(tmp_path, json.loads(RECORDED.read_text()), "a100-80gb")
    assert line.startswith(
        "error: the run was recorded on 'NVIDIA H100 80GB HBM3' (132 SMs, 85.02GB), not on a100-80gb "
        "(NVIDIA A100 80GB SXM: 108 SMs, 80GB)"
    ), line


def test_fit_device_refuses_steps_no_gpu_runs_and_kernels_of_another_config(tmp_path):
    """Probe 10: steps of 1e-12 s were fitted (errors of 10^12 %, an entry to paste); so was a
    config whose d_model (7) runs none of the recorded GEMMs."""

    def instant(raw):
        for shape in raw["shapes"]:
            shape["train_step_s"] = 1e-12

    line = _fit_device(tmp_path, _edited(instant))
    assert "train_step_s 1e-12 s is shorter than its matrix FLOPs take at the NVIDIA H100 SXM5 80GB's" in line

    def narrow(raw):
        raw["shapes"][0]["config"]["d_model"] = 7

    line = _fit_device(tmp_path, _edited(narrow))
    assert "shapes[0] ('gpt2-small'): its recorded GEMMs are not its config's at batch 8" in line, line


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda raw: raw["shapes"][0]["report"].pop("kernels"), "shapes[0] ('gpt2-small') has no 'kernels'"),
        (lambda raw: raw["shapes"][0].pop("report"), "shapes[0] ('gpt2-small') has no 'report'"),
        (
            lambda raw: raw["shapes"][0]["report"].update(kernels=None),
            "shapes[0] ('gpt2-small') holds a value of the wrong type",
        ),
        (lambda raw: raw.update(fit_gemms="x"), "fit_gemms[0] must be [m, n, k, seconds]"),
        (lambda raw: raw.update(fit_gemms=[[1, 2, 3, "x"]]), "fit_gemms[0]"),
        (lambda raw: raw.update(shapes={"a": 1}), "'shapes' must be a list of objects"),
    ],
    ids=["no-kernels", "no-report", "null-kernels", "string-gemms", "bad-gemm-time", "shapes-object"],
)
def test_a_malformed_recording_is_named_not_a_python_repr(tmp_path, edit, why):
    """Probe 10: `KeyError('kernels')`, `ValueError('not enough values to unpack ...')`,
    `TypeError("'NoneType' object is not iterable")`."""
    line = _fit_device(tmp_path, _edited(edit))
    assert line.startswith("error: not a recorded gpu_model_accuracy run: ") and why in line, line


def test_a_report_of_a_study_with_no_complete_trial_says_what_its_trials_are(tmp_path):
    """Probe 10: `report` of a study whose trials all failed said only `no complete trial with every
    objective`; it now counts them by state and names the command that lists their reasons."""
    from tests.results.test_ladder import _study

    url = _study(f"sqlite:///{tmp_path / 't.db'}")
    with Storage.open(url, create=False) as db:
        r = db.require_study("tiny")
        db.create_study(
            "allfail", spec_fingerprint=r.spec_fingerprint, spec_source=r.spec_source, spec=r.spec,
            objectives=r.objectives,
        )  # fmt: skip
        for number in range(2):
            slot = db.claim_trial("allfail", 100, 60)
            db.assign_trial(slot, number=number, optuna_trial_id=number, params={}, config=None)
            db.finish_trial(slot, TrialOutcome(status="failed", reason="loss is NaN"))
    result = CliRunner().invoke(
        app,
        ["report", "--study", "tiny", "--study", "allfail", "-o", str(tmp_path / "r.html"), "--storage", url],
    )
    assert result.exit_code == 2 and not (tmp_path / "r.html").exists()
    assert result.stderr == (
        "error: no complete trial with every objective in 'allfail' (2 failed): `archsearch trials --study "
        "allfail` lists its trials with their reasons\n"
    )
