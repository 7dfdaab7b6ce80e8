"""`archsearch fit-device` on a recording it cannot fit (another GPU, impossible steps, a malformed
file): one line naming what is wrong, exit 2, no entry printed to paste."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from tests.helpers import one_line

RECORDED = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_model_accuracy_h100_2026-11-22.json"


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
    """A batch of 0 was a ValueError traceback; a NaN, zero or negative real step was
    fitted (NaN constants, numpy's divide-by-zero warning, garbage), exit 0."""
    raw = json.loads(RECORDED.read_text())
    broken = copy.deepcopy(raw)
    broken["shapes"][0][field] = value
    path = tmp_path / "run.json"
    path.write_text(json.dumps(broken))
    result = CliRunner().invoke(app, ["fit-device", str(path), "--device", "h100-sxm", "--no-holdout"])
    line = one_line(result, 2, "not a recorded gpu_model_accuracy run: ")
    assert f"shapes[0] ({raw['shapes'][0]['label']!r}): {why}" in line, line


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
    """An H100 recording fitted as `--device a100-80gb` printed an A100 entry to paste."""
    line = _fit_device(tmp_path, json.loads(RECORDED.read_text()), "a100-80gb")
    assert line.startswith(
        "error: the run was recorded on 'NVIDIA H100 80GB HBM3' (132 SMs, 85.02GB), not on a100-80gb "
        "(NVIDIA A100 80GB SXM: 108 SMs, 80GB)"
    ), line


def test_fit_device_refuses_steps_no_gpu_runs_and_kernels_of_another_config(tmp_path):
    """Steps of 1e-12 s were fitted (errors of 10^12 %, an entry to paste); so was a
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
    """`KeyError('kernels')`, `ValueError('not enough values to unpack ...')`,
    `TypeError("'NoneType' object is not iterable")`."""
    line = _fit_device(tmp_path, _edited(edit))
    assert line.startswith("error: not a recorded gpu_model_accuracy run: ") and why in line, line
