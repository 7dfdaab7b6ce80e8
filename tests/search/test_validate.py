"""`archsearch validate` on tiny studies written through the storage API (no search run)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import sqlite3
import statistics

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.cli.validate import _print_validation
from archsearch.search.validate import (
    ValidateError,
    ValidateOptions,
    adjusted_label,
    calibration_set,
    checkpoint_path,
    fidelity_report,
    long_run,
    long_settings,
    run_validate,
)
from archsearch.space.knobs import config_from_knobs
from archsearch.storage import Storage
from archsearch.trial import TrialOutcome
from tests.helpers import store_promotions
from tests.specs import tiny_spec

# (d_model, n_layers, proxy loss): the study's front in (loss, FLOPs) is trials 0, 1 and 3.
SHAPES = [(64, 1, 2.9), (64, 2, 2.8), (128, 1, 2.85), (128, 2, 2.7), (128, 4, 2.75), (64, 4, 2.82)]
ARGS = ("--study", "tiny", "--trials", "4", "--multiplier", "2")  # 4 runs of 4,096 tokens
JSON_KEYS = {
    "study", "trained", "skipped", "failed", "multiplier", "seeds", "trials", "correlations", "iso_pairs",
    "size_beta", "size_beta_fixed", "extrapolate", "objective", "noise_floor", "fronts", "rows", "deciding",
    "regime",
}  # fmt: skip
PREDICTORS = {"proxy", "params", "flops", "adjusted"}


def _study(url: str, shapes=SHAPES, failed: int = 0, spec=None) -> str:
    spec = spec or tiny_spec()
    with Storage.open(url) as db:
        db.create_study(
            "tiny", spec_fingerprint=spec.fingerprint, spec_source=spec.source, spec=spec.to_dict(),
            objectives=spec.objectives,
        )  # fmt: skip
        for number, (d_model, layers, loss) in enumerate(shapes):
            cfg = config_from_knobs(d_model=d_model, n_layers=layers, head_dim=32, vocab_size=256, seq_len=32)
            slot = db.claim_trial("tiny", 100, 60)
            db.assign_trial(slot, number=number, optuna_trial_id=number, params={}, config=cfg)
            db.finish_trial(slot, TrialOutcome(status="complete", train={"val_loss": loss, "tokens": 2048}))
        for _ in range(failed):
            db.finish_trial(db.claim_trial("tiny", 100, 60), TrialOutcome(status="failed", reason="boom"))
    return url


@pytest.fixture
def url(tmp_path):
    return _study(f"sqlite:///{tmp_path / 't.db'}")


def _run(*args: str):
    return CliRunner().invoke(app, ["validate", *args])


def _files(tmp_path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(tmp_path.iterdir())}


@pytest.fixture(scope="module")
def validated(tmp_path_factory, ray_session):
    """One real validation of the tiny study (CPU), shared by the tests that read it."""
    path = tmp_path_factory.mktemp("validated")
    url = _study(f"sqlite:///{path / 't.db'}")
    result = _run(*ARGS, "--storage", url, "--json")
    assert result.exit_code == 0, result.output
    return url, json.loads(result.stdout)


def test_too_few_complete_trials_is_one_error_line(tmp_path):
    url = _study(f"sqlite:///{tmp_path / 't.db'}", shapes=SHAPES[:3], failed=2)
    result = _run("--study", "tiny", "--storage", url)
    assert result.exit_code == 2
    assert (
        result.stderr == "error: study 'tiny' has 3 complete trials with a loss; validate needs at least 4\n"
    )
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args, match",
    [
        (("--multiplier", "1"), "--multiplier must be > 1"),
        (("--multiplier", "0.5"), "--multiplier must be > 1"),
        (("--multiplier", "nan"), "--multiplier must be a finite number"),
        (("--multiplier", "inf"), "--multiplier must be a finite number"),
        (("--seeds", "0"), "--seeds must be in 1..100, got 0"),
        (("--seeds", "101"), "--seeds must be in 1..100, got 101"),
        (("--size-beta", "-0.1"), "--size-beta must be a finite number >= 0"),
        (
            ("--multiplier", "1e300"),
            "--multiplier 1e+300 makes long runs that cannot train: tokens budget a ",
        ),
    ],
    ids=["one", "below-one", "nan", "inf", "no-seeds", "too-many-seeds", "negative-size-beta", "endless"],
)
def test_bad_options_exit_2_and_leave_the_database_unchanged(url, tmp_path, args, match):
    before = _files(tmp_path)
    result = _run("--study", "tiny", "--storage", url, *args)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {match}") and result.stderr.count("\n") == 1
    assert _files(tmp_path) == before


def test_unknown_trial_numbers_are_an_error(url):
    result = _run("--study", "tiny", "--storage", url, *(f"--trial={n}" for n in (0, 1, 2, 42)))
    assert result.exit_code == 2
    assert result.stderr == "error: not complete trials of 'tiny': 42 (see `archsearch trials`)\n"


def test_the_calibration_set_is_the_front_plus_a_sample_spread_over_sizes(url):
    with Storage.open(url) as db:
        assert [r.number for r in calibration_set(db, "tiny", 4)] in (
            [0, 1, 2, 3],
            [0, 1, 3, 4],
            [0, 1, 3, 5],
        )
        # Five: the front and one from each half of the others by parameter count (2 and 5 are
        # the two smallest non-front shapes, 4 the largest).
        five = [r.number for r in calibration_set(db, "tiny", 5, seed=3)]
        assert five[:2] == [0, 1] and 3 in five and 4 in five and len(five) == 5
        assert [r.number for r in calibration_set(db, "tiny", 2)] == [0, 3]  # spread along the front
        assert [r.number for r in calibration_set(db, "tiny", numbers=[5, 4, 0, 1])] == [0, 1, 4, 5]
        assert calibration_set(db, "tiny", 4, seed=7) == calibration_set(db, "tiny", 4, seed=7)


def test_long_runs_scale_the_budget_and_train_with_the_cosine_schedule():
    proxy = {"tokens": 2048, "schedule": "wsd", "min_lr": 0.0, "seed": 5, "lr": 1e-3}
    assert long_settings(proxy, 10, 2, None) == {
        "tokens": 20480, "schedule": "cosine", "min_lr": 0.1, "seed": 2, "lr": 1e-3,
    }  # fmt: skip
    assert long_settings({"tokens": None, "flops": 1e9}, 2.5, 0, None)["flops"] == 2.5e9
    assert long_settings({"tokens": None, "flops": None, "seconds": 3.0}, 4, 0, 1000)["tokens"] == 4000


def test_a_long_run_without_threads_takes_them_from_the_cpus_it_is_given(monkeypatch):
    from archsearch.evaluators import trainer

    seen, real = [], trainer.train
    monkeypatch.setattr(
        trainer, "train", lambda cfg, data, s, **kw: seen.append(s.threads) or real(cfg, data, s)
    )
    cfg = config_from_knobs(d_model=64, n_layers=1, head_dim=32, vocab_size=256, seq_len=32)
    settings = dict(tokens=256, batch_size=4, evals=1, eval_batches=1, device="cpu")
    out = long_run(dict(config=cfg.to_dict(), settings=settings, data=None, cpus=1.0))
    assert out["status"] == "complete" and seen == [1]  # one CPU from Ray: one thread
    long_run(dict(config=cfg.to_dict(), settings={**settings, "threads": 2}, data=None, cpus=1.0))
    assert seen == [1, 2]  # the study's own [proxy] threads as given


def test_a_long_run_keeps_a_checkpoint_in_the_cache_unless_told_otherwise(monkeypatch, tmp_path):
    from archsearch.evaluators import trainer
    from archsearch.evaluators.data import cache_dir

    seen = []
    monkeypatch.setattr(trainer, "train", lambda cfg, data, s, checkpoint: seen.append(checkpoint) or real)
    real = trainer.TrainResult(
        status="complete", reason=None, val_loss=2.0, bits_per_byte=None, tokens=256, steps=2,
        wall_time_s=0.1, tokens_per_second=1.0, achieved_flops_per_second=1.0, mfu=None,
        peak_flops_per_second=None, precision="fp32", device="cpu", corpus_fingerprint="c", params=1,
    )  # fmt: skip
    cfg = config_from_knobs(d_model=64, n_layers=1, head_dim=32, vocab_size=256, seq_len=32)
    request = dict(
        config=cfg.to_dict(), settings=dict(tokens=256, batch_size=4, threads=1), data=None, cpus=1.0
    )
    long_run(request)
    path = checkpoint_path(request)
    assert seen[-1].path == path and path.parent == cache_dir() / "checkpoints"
    # The key is the run: threads aside, another setting, config or corpus is another file.
    assert checkpoint_path({**request, "settings": {**request["settings"], "threads": 2}}) == path
    assert checkpoint_path({**request, "settings": {**request["settings"], "seed": 1}}) != path
    assert checkpoint_path({**request, "data": "corpus.txt"}) != path
    long_run({**request, "checkpoint": str(tmp_path / "mine.pt")})
    assert seen[-1].path == tmp_path / "mine.pt"
    long_run({**request, "checkpoint": False})
    assert seen[-1] is None


def test_the_report_of_a_perfect_proxy():
    rows = [
        dict(number=n, params_total=p, flops=2.0 * p, proxy_loss=loss, long_losses=[loss - 1, loss - 0.9])
        for n, (p, loss) in enumerate([(100, 3.0), (110, 2.9), (300, 2.5), (1000, 2.6)])
    ]
    report = fidelity_report(rows, 10, 2)
    assert report["correlations"]["proxy"] == {"spearman": pytest.approx(1.0), "kendall": pytest.approx(1.0)}
    assert report["correlations"]["params"]["spearman"] == pytest.approx(0.8)
    assert report["iso_pairs"] == {"proxy": [1, 1], "params": [1, 1], "adjusted": [1, 1]}
    assert report["noise_floor"] == pytest.approx(math.sqrt(0.005))  # each pair differs by 0.1
    fronts = report["fronts"]
    assert sorted(fronts["proxy"]) == sorted(fronts["long"]) == [0, 1, 2] and fronts["shared"] == 3
    assert fronts["proxy_long_hypervolume"] == fronts["long_long_hypervolume"] > 0
    # The size-adjusted proxy, beta = sd(proxy) / sd(ln params) over the four: crediting size
    # costs a perfect proxy a pair (trial 3, 10x trial 2's size, overtakes it), so it ranks as
    # -params does; its front gains trial 3, which adds nothing to the long-run hypervolume.
    losses, sizes = [3.0, 2.9, 2.5, 2.6], [math.log(p) for p in (100, 110, 300, 1000)]
    assert report["size_beta"] == pytest.approx(statistics.pstdev(losses) / statistics.pstdev(sizes))
    adjusted = report["correlations"]["adjusted"]
    assert adjusted == {"spearman": pytest.approx(0.8), "kendall": pytest.approx(2 / 3)}
    assert fronts["adjusted"] == [0, 1, 2, 3] and fronts["adjusted_shared"] == 3
    assert fronts["adjusted_long_hypervolume"] == fronts["long_long_hypervolume"]
    # The measures that decide: a perfect proxy scores 1, but four trials give no interval (some
    # resamples draw one trial four times: no ranking, None); its front holds the long runs' and
    # its knee has no regret; every seed pair differs by 0.1 (the reference's noise),
    # and the two seeds rank the four trials alike (the ceiling).
    deciding = report["deciding"]
    assert deciding["reference_noise"] == pytest.approx(0.1) and deciding["seed_pairs"] == 4
    assert deciding["reference_ceiling"]["value"] == pytest.approx(1.0)
    proxy = deciding["proxy"]
    assert proxy["spearman"]["value"] == pytest.approx(1.0) and proxy["spearman"]["low"] is None
    assert proxy["vs_params"]["value"] == pytest.approx(0.2)  # 1.0 against params' 0.8
    assert proxy["front_recall"] == [3, 3] and proxy["knee_regret"] == 0.0
    assert deciding["params"]["vs_params"]["value"] == 0.0


def test_the_adjusted_predictor_extrapolates_as_the_studys_objective_does():
    # One size, so size ranks nothing: the curves still falling fastest at the end finish best at
    # 10x, which the proxy loss alone ranks backwards and the extrapolated loss ranks right.
    changes = [0.0, -0.1, -0.2, -0.3]
    rows = [
        dict(number=n, params_total=1000, flops=2000.0, proxy_loss=2.0 + n / 100, loss_change=c,
             long_losses=[1.9 - n / 5])
        for n, c in enumerate(changes)
    ]  # fmt: skip
    report = fidelity_report(rows, 10, 1, size_beta=0.15, objective="adjusted", extrapolate=2.0)
    assert report["correlations"]["proxy"]["spearman"] == pytest.approx(-1.0)
    assert report["correlations"]["adjusted"]["spearman"] == pytest.approx(1.0)
    assert (report["size_beta"], report["extrapolate"], report["objective"]) == (0.15, 2.0, "adjusted")
    assert adjusted_label(report) == "adjusted proxy (beta 0.150, + 2 x last change)"
    # Rows without a change (reports of older studies) count it as 0: the proxy's order.
    old = [{k: v for k, v in r.items() if k != "loss_change"} for r in rows]
    assert fidelity_report(old, 10, 1, 0.15, "adjusted", 2.0)["correlations"]["adjusted"]["spearman"] == (
        pytest.approx(-1.0)
    )
    assert adjusted_label({"size_beta": 0.15}) == "size-adjusted proxy (beta 0.150)"  # stored before


def test_a_report_stored_before_the_size_adjusted_predictor_still_loads_and_prints(url, capsys):
    rows = [
        dict(number=n, params_total=p, flops=2.0 * p, proxy_loss=loss, long_losses=[loss - 1], shape="s")
        for n, (p, loss) in enumerate([(100, 3.0), (110, 2.9), (300, 2.5), (1000, 2.6)])
    ]
    old = fidelity_report(rows, 10, 1)
    del old["size_beta"], old["correlations"]["adjusted"], old["iso_pairs"]["adjusted"]
    for key in ("adjusted", "adjusted_shared", "adjusted_long_hypervolume"):
        del old["fronts"][key]
    with Storage.open(url) as db:
        db.add_validation("tiny", multiplier=10, seeds=1, report=old)
        [stored] = db.validations("tiny")
    assert stored.report == json.loads(json.dumps(old))
    _print_validation("tiny", stored.report)
    out = capsys.readouterr().out
    assert "-FLOPs" in out and "hypervolume" in out and "size-adjusted" not in out


def test_json_output_has_the_report_keys(validated):
    _, report = validated
    assert set(report) == JSON_KEYS
    assert report["trained"] == 4 and report["skipped"] == 0 and report["seeds"] == 1
    assert report["failed"] == []
    assert report["noise_floor"] is None  # one seed
    assert set(report["correlations"]) == PREDICTORS and set(report["iso_pairs"]) == PREDICTORS - {"flops"}
    assert report["size_beta"] > 0
    assert all(r["long_loss"] is not None and len(r["long_losses"]) == 1 for r in report["rows"])
    assert {"proxy", "long", "shared", "proxy_long_hypervolume", "long_long_hypervolume"} <= set(
        report["fronts"]
    )


def test_a_rerun_trains_nothing_and_reports_the_same(validated):
    url, first = validated
    with Storage.open(url) as db:
        runs = db.long_runs("tiny")
    result = _run(*ARGS, "--storage", url, "--json")
    assert result.exit_code == 0, result.output
    again = json.loads(result.stdout)
    assert (again["trained"], again["skipped"]) == (0, 4)
    drop = {"trained", "skipped", "failed"}
    assert {k: v for k, v in again.items() if k not in drop} == {
        k: v for k, v in first.items() if k not in drop
    }
    with Storage.open(url) as db:
        assert db.long_runs("tiny") == runs  # nothing rewritten
        assert [v.report["correlations"] for v in db.validations("tiny")] == [first["correlations"]] * 2


def test_a_given_size_beta_changes_the_report_only(validated, tmp_path):
    url, first = validated
    copy = tmp_path / "t.db"  # the shared database stays as the other tests expect it
    src, dst = sqlite3.connect(url.removeprefix("sqlite:///")), sqlite3.connect(copy)
    src.backup(dst)
    src.close(), dst.close()
    result = _run(*ARGS, "--storage", f"sqlite:///{copy}", "--json", "--size-beta", "0.2")
    assert result.exit_code == 0, result.output
    again = json.loads(result.stdout)
    assert (again["trained"], again["skipped"]) == (0, 4)  # no long run for a report-only option
    assert (again["size_beta"], again["size_beta_fixed"], again["objective"]) == (0.2, True, "proxy")
    assert first["size_beta_fixed"] is False and first["objective"] == "proxy"
    rows = [
        {k: r[k] for k in ("number", "params_total", "flops", "proxy_loss", "long_losses")}
        for r in first["rows"]
    ]
    assert again["correlations"] == fidelity_report(rows, 2, 1, size_beta=0.2)["correlations"]
    assert again["correlations"]["proxy"] == first["correlations"]["proxy"]


def test_a_study_with_a_size_beta_is_validated_on_its_loss_objective(tmp_path, ray_session):
    url = _study(f"sqlite:///{tmp_path / 't.db'}", spec=tiny_spec(objectives="size_beta = 0.3"))
    with Storage.open(url) as db:
        for number, (_, _, loss) in enumerate(SHAPES[:4]):  # stored: validate trains nothing
            db.add_long_run(
                "tiny", trial_number=number, multiplier=2, seed=0, tokens=4096, val_loss=loss - 0.5
            )
    args = ("--study", "tiny", "--storage", url, "--multiplier", "2", *(f"--trial={n}" for n in range(4)))
    report = json.loads(_run(*args, "--json").stdout)
    assert (report["trained"], report["objective"], report["size_beta"]) == (0, "adjusted", 0.3)
    assert report["size_beta_fixed"] is True
    table = _run(*args).stdout
    assert "size-adjusted proxy (beta 0.300): the study's objective" in table
    assert "proxy loss: the study's objective" not in table


def test_the_table_states_the_measures(validated):
    url, report = validated
    result = _run(*ARGS, "--storage", url)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "4 trials retrained at 2x the proxy's tokens, 1 seed" in out
    for text in ("proxy loss", "-params", "-FLOPs", "Spearman", "Kendall", "seed noise floor", "hypervolume"):
        assert text in out
    assert f"size-adjusted proxy (beta {report['size_beta']:.3f})" in out and "size-adjusted front:" in out
    # Which regime measured these figures, and what the measured regimes say of a proxy like this one.
    said = " ".join(out.split())
    assert "regime: the figures above are this study's own, its shapes retrained at 2x" in said
    assert report["regime"].startswith("regime: the figures above are this study's own")
    assert all(r["proxy_tokens"] > 0 for r in report["rows"])  # each trial's proxy tokens, stored


def test_an_interrupted_validation_keeps_its_runs_and_a_rerun_trains_the_rest(
    tmp_path, validated, ray_session, caplog
):
    url = _study(f"sqlite:///{tmp_path / 't.db'}")
    seen = []

    def interrupt(progress):
        seen.append(progress.done)
        if progress.done == 1 and seen.count(1) == 1:  # the first long run is stored
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C: the driver's handler stops the loop

    with Storage.open(url) as db:
        summary = run_validate(db, ValidateOptions("tiny", trials=4, multiplier=2), on_update=interrupt)
        assert summary.signal == signal.SIGINT and summary.report is None and summary.trained == 1
        assert "received SIGINT: stopping validate (again to force)" in caplog.text
        assert seen[0] == 0  # displays hear of the start, before any run ends
        [kept] = db.long_runs("tiny")
        assert db.validations("tiny") == []
    result = _run(*ARGS, "--storage", url, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["trained"], report["skipped"]) == (3, 1)
    with Storage.open(url) as db:
        runs = db.long_runs("tiny")
    assert len(runs) == 4 and len({r.key for r in runs}) == 4
    assert kept in runs  # the first run was kept, not repeated
    # CPU training is deterministic: the same losses as the uninterrupted validation.
    _, reference = validated
    assert [r["long_losses"] for r in report["rows"]] == [r["long_losses"] for r in reference["rows"]]
    assert report["correlations"] == reference["correlations"]


def test_options_are_checked_before_anything_runs():
    with pytest.raises(ValidateError, match="--workers must be at least 1"):
        ValidateOptions("s", workers=0)
    with pytest.raises(ValidateError, match="given twice"):
        ValidateOptions("s", numbers=(1, 1, 2, 3))


def test_pareto_and_trials_show_the_long_run_loss_where_one_exists(url):
    runner = CliRunner()
    before = runner.invoke(app, ["pareto", "--study", "tiny", "--storage", url])
    assert before.exit_code == 0, before.output
    assert "long loss" not in before.stdout  # no long runs: the tables are as they were
    with Storage.open(url) as db:
        for seed, loss in enumerate((2.5, 2.7)):
            db.add_long_run("tiny", trial_number=3, multiplier=10, seed=seed, tokens=20480, val_loss=loss)
        db.add_long_run("tiny", trial_number=0, multiplier=2, seed=0, tokens=4096, val_loss=2.75)
        db.add_long_run("tiny", trial_number=0, multiplier=5, seed=0, tokens=10240, val_loss=2.65)
        assert db.long_run_losses("tiny") == {3: (10.0, pytest.approx(2.6), 2), 0: (5.0, 2.65, 1)}
    pareto = runner.invoke(app, ["pareto", "--study", "tiny", "--storage", url])
    assert "long loss" in pareto.stdout
    assert "2.6000 (10x, 2 seeds)" in pareto.stdout and "2.6500 (5x)" in pareto.stdout
    front = json.loads(runner.invoke(app, ["pareto", "--study", "tiny", "--storage", url, "--json"]).stdout)
    rows = {r["number"]: r for r in front[0]["front"]}
    assert (rows[3]["long_loss"], rows[3]["long_multiplier"], rows[3]["long_seeds"]) == (
        pytest.approx(2.6), 10.0, 2,
    )  # fmt: skip
    assert rows[1]["long_loss"] is None
    listing = runner.invoke(app, ["trials", "--study", "tiny", "--storage", url])
    assert listing.exit_code == 0, listing.output
    assert "long loss" in listing.stdout and "2.6000 (10x, 2 seeds)" in listing.stdout


def _fake_run(request):
    """A long run without training: trial 0's shape fails, the others get a loss from their width."""
    d_model = request["config"]["d_model"]
    if request["config"]["n_layers"] == 1 and d_model == 64:
        return dict(status="failed", reason="loss is NaN", val_loss=None)
    return dict(
        status="complete", reason=None, val_loss=3.0 - d_model / 1000 - request["settings"]["seed"] / 100,
        tokens=request["settings"]["tokens"], val_curve=[], wall_time_s=0.0, corpus_fingerprint="c",
        device_fingerprint="d",
    )  # fmt: skip


def test_a_failed_long_run_is_reported_not_stored_and_retried_by_a_rerun(url, ray_session):
    with Storage.open(url) as db:
        options = ValidateOptions("tiny", trials=4, multiplier=2, seeds=2, workers=2)
        summary = run_validate(db, options, run_fn=_fake_run)
        # In the order they ended: two workers may finish them either way round.
        assert sorted(summary.failed) == ["trial 0 seed 0: loss is NaN", "trial 0 seed 1: loss is NaN"]
        assert summary.trained == 6 and {r.trial_number for r in db.long_runs("tiny")} == {1, 3, 4}
        rows = {r["number"]: r for r in summary.report["rows"]}
        assert rows[0]["long_loss"] is None and summary.report["trials"] == [1, 3, 4]
        assert summary.report["noise_floor"] == pytest.approx(math.sqrt(0.00005))  # seeds 0.01 apart
        again = run_validate(db, options, run_fn=_fake_run)
        assert (again.trained, again.skipped, len(again.failed)) == (0, 6, 2)


def test_a_study_with_promotions_is_validated_on_the_front_it_ranks_and_says_so(url, ray_session, capsys):
    with Storage.open(url) as db:
        # At twice the proxy's 2,048 tokens the deep shape 4 overtakes 3: the front is 0, 1, 3, 4.
        store_promotions(db, "tiny", 4096, {1: 2.78, 3: 2.65, 4: 2.6})
        assert [r.number for r in calibration_set(db, "tiny", 4)] == [0, 1, 3, 4]
        summary = run_validate(db, ValidateOptions("tiny", trials=4, multiplier=2), run_fn=_fake_run)
    promotion = summary.report["promotion"]
    assert (promotion["contenders"], promotion["ranked_at"], promotion["proxy_tokens"]) == (
        [1, 3, 4],
        4096,
        2048,
    )
    _print_validation("tiny", summary.report)
    out = " ".join(capsys.readouterr().out.split())
    assert "chosen from the study's front, ranked at 4,096 tokens (2x the proxy) for the 3 promoted" in out


def test_a_shape_trained_twice_enters_the_calibration_set_once(tmp_path):
    url = _study(f"sqlite:///{tmp_path / 't.db'}", shapes=[*SHAPES, (128, 4, 2.75)])  # trial 6 = trial 4
    with Storage.open(url) as db:
        assert [r.number for r in calibration_set(db, "tiny", 12)] == [0, 1, 2, 3, 4, 5]
        assert [r.number for r in calibration_set(db, "tiny", numbers=[4, 6, 0, 1])] == [0, 1, 4, 6]


@pytest.mark.parametrize("proxy", [{"tokens": 2048}, {"tokens": None, "flops": None, "seconds": 3.0}])
def test_a_multiplier_whose_budget_overflows_is_refused(proxy):
    """`validate --multiplier 1e308`: `round(inf)`, an OverflowError traceback."""
    with pytest.raises(
        ValidateError, match=r"--multiplier 1e\+308 makes long runs that cannot train: .*309-digit"
    ):
        long_settings(proxy, 1e308, 0, 1000)
