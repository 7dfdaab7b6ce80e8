"""Studies for the report and ladder tests, written through the storage API: no training, no Ray.

- `small_study`: five shapes of `tests/specs.TINY_TOML` (losses chosen so that trials 3, 1 and 0
  form the front and 1 is its knee), one failed trial, a measured local step time for each and a
  modelled H100 step (a full breakdown) for each, one driver run and one device.
- `recorded_study`: the recorded calibration set of benchmarks/data (14 tiny shapes, their
  measured proxy losses and 10x long-run losses), stored as a validated study: what a real
  study's report looks like, for the browser test and the docs' screenshot.
- `ladder_study`: study "tiny" of `LADDER_SHAPES` (four tiny shapes and one failed trial), what the
  ladder tests and the tests of `pareto --at-size` and `report` on a laddered study start from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from archsearch.evaluators.hardware import modelled_profile
from archsearch.space.config import ArchConfig
from archsearch.space.knobs import config_from_knobs
from archsearch.storage import Storage
from archsearch.trial import TrialOutcome
from tests.specs import tiny_spec

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "benchmarks" / "data" / "fidelity_tiny_2026-11-23.json"

SHAPES = [  # (d_model, n_layers, activation, loss): losses fall with size, 2 and 4 are dominated
    (64, 1, "gelu", 2.6), (128, 2, "swiglu", 2.4), (192, 3, "gelu", 2.45), (256, 4, "swiglu", 2.2),
    (256, 8, "gelu", 2.25),
]  # fmt: skip
FRONT = (3, 1, 0)  # along the loss axis
KNEE = 1
DEVICE = {
    "type": "cpu", "index": None, "name": "Test CPU", "units": 2, "threads": 2, "capability": None,
    "cpu_capability": "AVX2", "torch_version": "2.13.0+cpu", "cuda_version": None, "memory_bytes": None,
    "fingerprint": "0123456789abcdef",
}  # fmt: skip


def _h100(cfg: ArchConfig, batch: int) -> dict[str, Any]:
    """The modelled H100 profile the worker stores (`worker._profile`), with its full report."""
    report = modelled_profile(cfg, "h100-sxm", batch, "bf16", launches=120)
    assert report is not None
    return dict(device="h100-sxm", modelled=True, dtype="bf16", batch=batch, step_time_s=report.step_time_s,
                tokens_per_second=report.tokens_per_second, report=report.to_dict())  # fmt: skip


def small_study(db: Storage, name: str, *, shift: float = 0.0, size_beta: float | None = None) -> None:
    beta = f"size_beta = {size_beta}" if size_beta is not None else ""
    spec = tiny_spec(objectives=f"minimize = ['loss', 'flops']\n{beta}")
    db.create_study(
        name, spec_fingerprint=spec.fingerprint, spec_source=spec.source, spec=spec.to_dict(),
        objectives=spec.objectives,
    )  # fmt: skip
    db.add_search_run(name, {"study": name, "trials": 6, "workers": 1, "sampler": "tpe", "seed": 0})
    for number, (d_model, layers, activation, loss) in enumerate(SHAPES):
        cfg = config_from_knobs(
            d_model=d_model, n_layers=layers, head_dim=32, vocab_size=256, seq_len=32, activation=activation
        )
        slot = db.claim_trial(name, 100, 60)
        db.assign_trial(slot, number=number, optuna_trial_id=number, params={}, config=cfg)
        local = dict(device="local", modelled=False, dtype="fp32", batch=4, step_time_s=0.01 * (number + 1),
                     tokens_per_second=128 / (0.01 * (number + 1)), report={})  # fmt: skip
        train = {"val_loss": loss + shift, "bits_per_byte": (loss + shift) / 0.6931, "tokens": 2048}
        outcome = TrialOutcome(
            status="complete", train=train, profiles=(local, _h100(cfg, 4)), device=DEVICE,
            step_time_s=local["step_time_s"], step_time_device="local",
        )  # fmt: skip
        db.finish_trial(slot, outcome)
    slot = db.claim_trial(name, 100, 60)
    db.finish_trial(slot, TrialOutcome(status="failed", reason="worker died: <boom> & more"))


def recorded_study(db: Storage, name: str) -> dict[str, Any]:
    """The recorded calibration set as a study with its 10x long runs and a stored validation
    report (`validate.fidelity_report`, as `archsearch validate` stores it); returns the record."""
    from archsearch.search.validate import fidelity_report

    data = json.loads(RECORDED.read_text())
    proxy = {"tokens": 120_832, "batch_size": 16, "schedule": "cosine", "device": "cpu"}
    source = (
        f"# {data['what']}\n# measured {data['measured']}\n"
        '[proxy]\ntokens = 120_832\nbatch_size = 16\nschedule = "cosine"\ndevice = "cpu"\n'
        '[objectives]\nminimize = ["loss", "flops"]\nsize_beta = 0.15\n'
    )
    spec = {"proxy": proxy, "size_beta": 0.15, "data": None}
    db.create_study(name, spec_fingerprint="recorded-2026-11-23", spec_source=source, spec=spec,
                    objectives=("loss", "flops"))  # fmt: skip
    db.add_search_run(name, {"study": name, "trials": 20, "sampler": "random", "seed": 1, "prune": False})
    device = {**DEVICE, "name": "AMD EPYC, 2 cores (recorded)", "fingerprint": "recorded-epyc-2c"}
    rows = []
    for t in data["trials"]:
        cfg = ArchConfig.from_dict(t["config"])
        slot = db.claim_trial(name, 100, 60)
        db.assign_trial(slot, number=t["trial"], optuna_trial_id=t["trial"], params={}, config=cfg)
        p = t["proxy"]
        train = {"val_loss": p["val_loss"], "tokens": p["tokens"], "val_curve": p["curves"]["val"],
                 "loss_curve": p["curves"]["train"]}  # fmt: skip
        h100 = _h100(cfg, 16)
        outcome = TrialOutcome(status="complete", train=train, profiles=(h100,), device=device,
                               step_time_s=h100["step_time_s"], step_time_device="h100-sxm")  # fmt: skip
        db.finish_trial(slot, outcome)
        long = t["x10"]
        db.add_long_run(
            name, trial_number=t["trial"], multiplier=10.0, seed=0, tokens=long["tokens"],
            val_loss=long["val_loss"], val_curve=long["val_curve"], device_fingerprint=device["fingerprint"],
        )  # fmt: skip
        rows.append({"number": t["trial"], "shape": cfg.describe(), "params_total": t["params_total"],
                     "flops": t["flops_forward_per_token"], "proxy_loss": p["val_loss"],
                     "long_losses": [long["val_loss"]]})  # fmt: skip
    report = fidelity_report(rows, 10.0, 1, size_beta=0.15, objective="adjusted")
    db.add_validation(name, multiplier=10.0, seeds=1, report=report)
    return report


# `ladder_study`'s trials: number -> (d_model, n_layers, activation, proxy loss); trial 2 failed;
# 4 is trial 0's design, narrower.
LADDER_SHAPES = {
    0: (128, 2, "gelu", 2.9),
    1: (128, 2, "swiglu", 2.8),
    3: (64, 2, "swiglu", 3.0),
    4: (64, 4, "gelu", 3.1),
}


def ladder_config(d_model: int, layers: int, activation: str) -> ArchConfig:
    return config_from_knobs(
        d_model=d_model, n_layers=layers, head_dim=32, vocab_size=256, seq_len=32, activation=activation
    )


def ladder_study(url: str, spec=None) -> str:
    spec = spec or tiny_spec()
    with Storage.open(url) as db:
        db.create_study(
            "tiny", spec_fingerprint=spec.fingerprint, spec_source=spec.source, spec=spec.to_dict(),
            objectives=spec.objectives,
        )  # fmt: skip
        for number in range(max(LADDER_SHAPES) + 1):
            slot = db.claim_trial("tiny", 100, 60)
            if number not in LADDER_SHAPES:
                db.assign_trial(slot, number=number, optuna_trial_id=number, params={}, config=None)
                db.finish_trial(slot, TrialOutcome(status="failed", reason="boom"))
                continue
            d_model, layers, activation, loss = LADDER_SHAPES[number]
            cfg = ladder_config(d_model, layers, activation)
            db.assign_trial(slot, number=number, optuna_trial_id=number, params={}, config=cfg)
            db.finish_trial(slot, TrialOutcome(status="complete", train={"val_loss": loss, "tokens": 2048}))
    return url
