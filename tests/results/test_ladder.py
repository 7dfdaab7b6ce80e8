"""`archsearch ladder`: rungs that keep the design, refusals, storage, resume after Ctrl-C, and the
predictions `export --scale-to` and `pareto --at-size` print. Studies are written through the storage
API; the Ray tests train with a stand-in run function (a known law) unless they say otherwise."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import signal
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.results.ladder import fit_study_ladders, predict_trial, seed_predictions
from archsearch.results.ladder_fit import LadderFitError
from archsearch.search.ladder_plan import (
    MIN_RUNG_STEPS,
    LadderError,
    LadderOptions,
    default_top,
    enough_batch,
    few_steps_note,
    merged_rungs_note,
    plan_ladder,
    plan_ladders,
    rung_shape,
    rung_targets,
)
from archsearch.search.ladder_runs import run_ladder
from archsearch.space.config import ArchConfig
from archsearch.space.costs import param_counts
from archsearch.space.scale_candidates import KEPT_FIELDS
from archsearch.storage import Storage, shape_key
from archsearch.trial import TrialOutcome
from tests.helpers import one_line
from tests.results.studies import LADDER_SHAPES, ladder_config, ladder_study
from tests.specs import tiny_spec

E, ALPHA = 1.2, 0.34  # the stand-in run's law, on non-embedding parameters
A = {"gelu": 30.0, "swiglu": 24.0}


def _run_ladder(storage, options, **kwargs):
    """`run_ladder` with the law `archsearch ladder` fits the rungs by."""
    return run_ladder(storage, options, fit_rungs=fit_study_ladders, **kwargs)


@pytest.fixture
def url(tmp_path):
    return ladder_study(f"sqlite:///{tmp_path / 't.db'}")


def _law(cfg: ArchConfig) -> float:
    return E + A[cfg.activation] * param_counts(cfg).non_embedding ** -ALPHA


def _fake_run(log: str, request: dict) -> dict:
    """A rung without training: the law's loss; each call is logged by the rung's shape key."""
    cfg = ArchConfig.from_dict(request["config"])
    with open(log, "a") as f:
        f.write(shape_key(cfg) + "\n")
    if (cfg.d_model, cfg.n_layers) == (32, 1):  # the one shape the failure test asks to fail
        return dict(status="failed", reason="loss is NaN", val_loss=None)
    return dict(
        status="complete", reason=None, val_loss=_law(cfg), tokens=request["settings"]["tokens"],
        val_curve=[], wall_time_s=0.0, corpus_fingerprint="c", device_fingerprint="d",
    )  # fmt: skip


def _logged(log: Path):
    def run(request: dict) -> dict:  # a plain function: Ray's remote takes no partial
        return _fake_run(str(log), request)

    return run


def _lines(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


# --- rungs --------------------------------------------------------------------------------------
def test_rungs_are_about_2x_apart_keep_the_design_and_train_in_proportion(url):
    with Storage.open(url) as db:
        planned = plan_ladder(db, LadderOptions("tiny", numbers=(0, 1), rungs=3, tokens_per_param=20))
    assert [p.trial for p in planned] == [0, 0, 0, 1, 1, 1]
    for trial in (0, 1):
        source = ladder_config(*LADDER_SHAPES[trial][:3])
        mine = [p for p in planned if p.trial == trial]
        assert [p.target for p in mine] == list(rung_targets(param_counts(source).total, 3))
        sizes = [p.params for p in mine]
        assert all(1.3 < b / a < 3.1 for a, b in itertools.pairwise(sizes)), sizes
        for p in mine:
            assert abs(p.params / p.target - 1) <= 0.25
            assert all(getattr(p.config, f) == getattr(source, f) for f in KEPT_FIELDS)
            assert (p.config.attention_layout, p.config.head_dim) == (source.attention_layout, 32)
            assert abs(p.config.d_ff_ratio - source.d_ff_ratio) <= 16 / p.config.d_model  # d_ff on a 16 grid
            assert p.settings["tokens"] == round(20 * p.params)
            assert (p.settings["schedule"], p.settings["min_lr"], p.settings["seed"]) == ("cosine", 0.1, 0)
            assert p.settings["batch_size"] == 4  # the study's [proxy] otherwise


def test_without_top_the_ladder_rises_until_its_smallest_rung_can_be_built():
    # The tiny-hf quick start's knee: MQA with 32-wide heads, SwiGLU 4x. At its own 541k, the
    # smallest of 4 rungs (68k) is below the design's smallest shape (d_model 64, one layer: 94k).
    knee = ArchConfig(
        vocab_size=256, seq_len=128, d_model=128, n_layers=2, n_heads=4, n_kv_heads=1, head_dim=32, d_ff=512,
        activation="swiglu",
    )  # fmt: skip
    own = param_counts(knee).total
    with pytest.raises(LadderError, match=r"has 67\.66k parameters within 25%"):
        rung_shape(knee, rung_targets(own, 4)[0])
    top = default_top(knee, own, 4, params_max=2_000_000)
    assert top == round(1.25 * own)
    shapes = [rung_shape(knee, t) for t in rung_targets(top, 4)]
    assert shapes[0].d_model == 64 and all(s.attention_layout == "mqa" for s in shapes)
    assert default_top(knee, own, 4, params_max=600_000) == own  # raising it would pass the budget


def test_rung_targets_halve_from_the_top():
    assert rung_targets(400_000, 4) == (50_000, 100_000, 200_000, 400_000)
    assert rung_targets(400_000, 3, 2**0.5) == (200_000, 282_843, 400_000)


def test_denser_rungs_that_come_out_as_one_shape_train_once_and_say_so(url):
    # 7 rungs 1.19x apart under 500k: the width grid (d_model on 32s, whole layers) has fewer shapes.
    options = LadderOptions("tiny", numbers=(0,), rungs=7, spacing=2**0.25, top=500_000)
    with Storage.open(url) as db:
        planned = plan_ladder(db, options)
    targets = rung_targets(500_000, 7, 2**0.25)
    assert 2 <= len(planned) < 7 and len({p.config for p in planned}) == len(planned)
    assert [p.target for p in planned] == sorted(p.target for p in planned)
    assert {p.target for p in planned} <= set(targets) and planned[0].target == targets[0]
    note = merged_rungs_note(planned, 7)
    assert note is not None and f"trial 0 {len(planned)} of 7 sizes" in note
    with Storage.open(url) as db:
        assert merged_rungs_note(plan_ladder(db, OPTIONS), 3) is None


def test_the_scaled_shape_at_a_large_size_keeps_the_design():
    source = ladder_config(128, 2, "swiglu")
    big = rung_shape(source, 1_300_000_000)
    assert abs(param_counts(big).total / 1.3e9 - 1) <= 0.25 and big.activation == "swiglu"
    assert 50 <= big.aspect_ratio <= 400


# --- refusals: one line, exit 2, nothing trained or written -------------------------------------
def _run(*args: str):
    return CliRunner().invoke(app, ["ladder", *args])


@pytest.mark.parametrize(
    "args, message",
    [
        (("--trial", "0", "--rungs", "1"), "a ladder of 1 rung fits no trend: give --rungs 2 or more"),
        (("--trial", "2"), "trial 2 of 'tiny' is failed (boom): no design to keep"),
        (("--trial", "9"), "study 'tiny' has no trial 9"),
        (("--trial", "0", "--top", "3M"), "the top rung of 3M parameters is past the space's budget of 2M"),
        (("--trial", "0", "--rungs", "2"), "1 design of 2 rungs cannot fit the law's 3 constants"),
        (("--trial", "0", "--knee"), "give exactly one of --trial N, --knee, --front (got --trial, --knee)"),
        (("--trial", "0", "--tokens-per-param", "0"), "--tokens-per-param must be a finite number > 0"),
        (("--trial", "0", "--top", "2k"), "trial 0: no shape keeping the design (mha, head_dim 32"),
        (("--trial", "0", "--plot", "x.svg"), "cannot plot ladders to 'x.svg': use a .png file"),
        (("--trial", "0", "--tokens-per-param", "1e300"),
         "a rung cannot train: tokens budget a 30"),  # trained until killed
        (("--trial", "0", "--batch-size", "0"), "--batch-size must be a positive number of sequences, got 0"),
        (("--trial", "0", "--tokens-per-param", "1e308"),
         "a rung cannot train: tokens budget a 309-digit number"),  # OverflowError
        (("--trial", "0", "--batch-size", "1099511627776"), "trial 0 at "),  # all failed, exit 0
        (("--trial", "0", "--spacing", "1"), "--spacing must be a ratio > 1 and <= 16, got 1.0"),
        (("--trial", "0", "--spacing", "nan"), "--spacing must be a ratio > 1 and <= 16, got nan"),
        (("--trial", "0", "--rungs", "40", "--spacing", "4"), "--rungs must be at most 32 (rungs 4x apart"),
    ],
    ids=["one-rung", "no-design", "unknown-trial", "past-budget", "too-few-rungs", "two-selectors",
         "no-tokens", "too-small", "plot-suffix", "endless-rungs", "no-batch", "overflowing-tokens",
         "batch-past-memory", "spacing-1", "spacing-nan", "rungs-past-spacing"],
)  # fmt: skip
def test_bad_ladders_exit_2_with_one_line_and_store_nothing(tmp_path, args, message):
    url = ladder_study(f"sqlite:///{tmp_path / 't.db'}", tiny_spec(budget="params = { max = 2e6 }"))
    result = _run("--study", "tiny", "--storage", url, *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {message}") and result.stderr.count("\n") == 1, result.stderr
    assert result.stdout == ""
    with Storage.open(url) as db:
        assert db.ladder_rungs("tiny") == [] and db.ladder_fits("tiny") == []


# --- training, storing, resuming (Ray, stand-in run) --------------------------------------------
OPTIONS = LadderOptions("tiny", numbers=(0, 1), rungs=3, workers=1)


def test_ctrl_c_keeps_finished_rungs_and_a_rerun_trains_the_rest_once(url, tmp_path, ray_session):
    log = tmp_path / "runs.log"
    seen = []

    def interrupt(progress):
        seen.append(progress.done)
        if progress.done == 1 and seen.count(1) == 1:  # the first rung is stored
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C: the driver's handler stops the loop

    with Storage.open(url) as db:
        summary = _run_ladder(db, OPTIONS, on_update=interrupt, run_fn=_logged(log))
        assert summary.signal == signal.SIGINT and summary.fit is None and summary.trained == 1
        assert seen[0] == 0  # displays hear of the start, before any rung ends
        [kept] = db.ladder_rungs("tiny")
        assert db.ladder_fits("tiny") == []
        first = _lines(log)
        log.unlink()
        again = _run_ladder(db, OPTIONS, run_fn=_logged(log))
        assert (again.trained, again.skipped, again.failed) == (5, 1, ())
        rungs = db.ladder_rungs("tiny")
        assert len(rungs) == 6 and len({r.key for r in rungs}) == 6 and kept in rungs
        assert kept.shape_key not in _lines(log)  # the stored rung is not trained again
        assert sorted(set(first) | set(_lines(log))) == sorted(r.shape_key for r in rungs)
        # A third run trains nothing and fits the same.
        log.unlink()
        third = _run_ladder(db, OPTIONS, run_fn=_logged(log))
        assert (third.trained, third.skipped) == (0, 6) and _lines(log) == []
        assert third.fit.to_dict() == again.fit.to_dict()
        assert len(db.ladder_fits("tiny")) == 2
    # The stand-in law is recovered from its six rungs.
    assert again.fit.alpha == pytest.approx(ALPHA, rel=1e-3) and again.fit.e == pytest.approx(E, rel=1e-3)
    assert again.fit.coefficient(0) == pytest.approx(A["gelu"], rel=1e-2)
    assert again.fit.coefficient(1) == pytest.approx(A["swiglu"], rel=1e-2)


def test_a_rung_another_ladder_is_training_is_left_to_it_and_a_rerun_trains_it(
    url, tmp_path, ray_session, monkeypatch
):
    # Two ladders of one study started together trained every missing rung twice. Each
    # rung is now claimed in the database just before it starts; here another ladder holds one.
    import archsearch.search.ladder_runs as ladder

    log = tmp_path / "runs.log"
    with Storage.open(url) as db:
        planned = plan_ladder(db, OPTIONS)
        held = planned[0]
        assert db.claim_ladder_rung(
            "tiny", trial_number=held.trial, tokens_per_param=OPTIONS.tokens_per_param,
            batch_size=held.batch_size, config=held.config, seed=OPTIONS.seed, owner="other:1:x",
            lease_s=600,
        ) is None  # fmt: skip
        summary = _run_ladder(db, OPTIONS, run_fn=_logged(log))
        assert summary.busy == (f"trial {held.trial} at {held.params / 1e3:.4g}k",)
        assert summary.trained == len(planned) - 1 and summary.failed == ()
        assert shape_key(held.config) not in _lines(log)  # not trained here
        # Its claims are released when it ends; the other ladder's stays until that one ends.
        assert db.claim_ladder_rung(
            "tiny", trial_number=planned[1].trial, tokens_per_param=OPTIONS.tokens_per_param,
            batch_size=planned[1].batch_size, config=planned[1].config, seed=OPTIONS.seed,
            owner="third", lease_s=600,
        ) == "stored"  # fmt: skip
    # The command says so, exit 0: the ladder holding the rung stores it.
    real = ladder.run_ladder
    monkeypatch.setattr(ladder, "run_ladder", lambda db, o, **kw: real(db, o, run_fn=_logged(log), **kw))
    argv = ["ladder", "--study", "tiny", "--storage", url, "--trial", "0", "--trial", "1", "--rungs", "3"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert f"note: 1 rung left to another ladder training it now (trial {held.trial}" in result.output
    assert "rerun the same command once it finishes" in result.output
    with Storage.open(url) as db:
        db.release_ladder_claims("other:1:x")  # the other ladder gave up: the rung is free again
        log.unlink()
        again = _run_ladder(db, OPTIONS, run_fn=_logged(log))
        assert (again.trained, again.busy) == (1, ()) and _lines(log) == [shape_key(held.config)]


def test_another_batch_size_is_another_recipe_with_rungs_and_a_law_of_its_own(url, tmp_path, ray_session):
    log = tmp_path / "runs.log"
    with Storage.open(url) as db:
        first = _run_ladder(db, OPTIONS, run_fn=_logged(log))  # the study's proxy batch: 4
        small = dataclasses.replace(OPTIONS, batch_size=2)
        second = _run_ladder(db, small, run_fn=_logged(log))
        assert (first.batch_size, second.batch_size) == (4, 2)
        assert (second.trained, second.skipped) == (6, 0)  # the same shapes, trained again at batch 2
        assert len(_lines(log)) == 12
        assert {r.settings["batch_size"] for r in second.rungs} == {2} and len(second.rungs) == 6
        assert [f.batch_size for f in db.ladder_fits("tiny")] == [4, 2]
        rungs = db.ladder_rungs("tiny")
    assert sorted({r.recipe for r in rungs}) == [(20.0, 2), (20.0, 4)]
    with pytest.raises(LadderFitError, match=r"rungs of 2 recipes \(tokens per parameter, batch size\)"):
        fit_study_ladders(rungs)
    # A prediction rests on one recipe: of equal ladders, the smaller batch's (more steps per rung).
    found = predict_trial(rungs, 1, rung_shape(ladder_config(*LADDER_SHAPES[1][:3]), 2_000_000))
    assert found.batch_size == 2 and {r.batch_size for r in found.rungs} == {2}


def test_a_rung_of_too_few_steps_is_noted_with_the_batch_that_gives_enough(url):
    with Storage.open(url) as db:
        # The smallest rung of trial 0 (82k) at 0.2 tokens per parameter: 16k tokens, 129 steps of 4 x 32.
        short = plan_ladder(db, LadderOptions("tiny", numbers=(0,), rungs=4, tokens_per_param=0.2))
        enough = plan_ladder(db, LadderOptions("tiny", numbers=(0,), rungs=4, tokens_per_param=20))
    smallest = min(short, key=lambda p: p.steps)
    assert smallest.steps == math.ceil(smallest.settings["tokens"] / (4 * 32)) < MIN_RUNG_STEPS
    note = few_steps_note(short)
    batch = 4 * smallest.steps // MIN_RUNG_STEPS
    assert (
        note.startswith("note: the smallest rung (trial 0 at ")
        and f"trains {smallest.steps} steps at batch 4" in note
    )
    assert note.endswith(f"--batch-size {max(1, batch)} gives it enough")
    assert min(p.steps for p in enough) >= MIN_RUNG_STEPS and few_steps_note(enough) is None
    # A batch of 100,000 (1 step) was told a batch that still gave 74 steps.
    with Storage.open(url) as db:
        huge = plan_ladder(
            db, LadderOptions("tiny", numbers=(0,), rungs=4, tokens_per_param=20, batch_size=2000)
        )
        tiny = plan_ladder(db, LadderOptions("tiny", numbers=(0,), rungs=4, tokens_per_param=1e-3))
    smallest = min(huge, key=lambda p: p.steps)
    fix = smallest.settings["tokens"] // (32 * MIN_RUNG_STEPS)
    assert smallest.steps < 100 and few_steps_note(huge).endswith(f"--batch-size {fix} gives it enough")
    assert math.ceil(smallest.settings["tokens"] / (fix * 32)) >= MIN_RUNG_STEPS
    assert few_steps_note(tiny).endswith("even batch 1 gives it 3: give a larger --tokens-per-param")


def test_without_a_batch_size_the_rungs_train_at_the_largest_batch_that_gives_them_enough_steps(url):
    short = LadderOptions("tiny", numbers=(0,), rungs=4, tokens_per_param=0.2)  # 129 steps at batch 4
    with Storage.open(url) as db:
        every, plans, note = plan_ladders(db, [short, dataclasses.replace(short, tokens_per_param=20)])
        batch = enough_batch(plan_ladder(db, short))
        given, _, none = plan_ladders(db, [dataclasses.replace(short, batch_size=4)])
        enough, _, nothing = plan_ladders(db, [dataclasses.replace(short, tokens_per_param=20)])
    # One batch for both ratios, so their rungs are one recipe for the joint law.
    assert batch is not None and batch < 4 and [o.batch_size for o in every] == [batch, batch]
    assert all(p.batch_size == batch for plan in plans for p in plan)
    assert min(p.steps for plan in plans for p in plan) >= MIN_RUNG_STEPS
    assert note.startswith(f"note: rungs train at batch {batch}, not the proxy's 4, so the smallest (trial 0")
    assert note.endswith("(--batch-size sets another)") and few_steps_note(plans[0]) is None
    assert given[0].batch_size == 4 and none is None  # a given batch is the user's recipe
    assert enough[0].batch_size is None and nothing is None  # enough steps at the proxy's batch


def test_a_failed_rung_is_reported_not_stored_and_tried_again(url, tmp_path, ray_session):
    log = tmp_path / "runs.log"
    options = LadderOptions("tiny", numbers=(3,), rungs=4, top=200_000)  # its smallest rung is d_model 32
    with Storage.open(url) as db:
        planned = plan_ladder(db, options)
        assert (planned[0].config.d_model, planned[0].config.n_layers) == (32, 1)
        summary = _run_ladder(db, options, run_fn=_logged(log))
        assert summary.failed == (f"trial 3 at {planned[0].params / 1e3:.4g}k: loss is NaN",)
        assert summary.trained == 3 and len(db.ladder_rungs("tiny")) == 3
        assert summary.fit is None and "cannot fit 3 constants" in summary.fit_error  # 3 rungs, 1 design
        again = _run_ladder(db, options, run_fn=_logged(log))
        assert (again.trained, again.skipped, len(again.failed)) == (0, 3, 1)


def test_a_shape_already_trained_for_a_trial_of_the_same_design_is_not_trained_again(
    url, tmp_path, ray_session
):
    log = tmp_path / "runs.log"
    with Storage.open(url) as db:
        one = LadderOptions("tiny", numbers=(0,), rungs=4, top=920_000)
        first = _run_ladder(db, one, run_fn=_logged(log))
        assert (first.trained, first.skipped) == (4, 0)
        # Trial 4 is trial 0's design: to the same top, its rungs are the same shapes.
        both = LadderOptions("tiny", numbers=(4, 0), rungs=4, top=920_000)
        again = _run_ladder(db, both, run_fn=_logged(log))
        assert (again.trained, again.skipped) == (0, 8) and len(_lines(log)) == 4
        rungs = db.ladder_rungs("tiny")
    by_trial = {n: [(r.shape_key, r.val_loss) for r in rungs if r.trial_number == n] for n in (0, 4)}
    assert by_trial[0] == by_trial[4] and len(by_trial[0]) == 4
    assert all(r.settings.get("reused_from_trial") == 0 for r in rungs if r.trial_number == 4)


def test_two_trials_of_one_design_share_each_run_in_one_ladder(url, tmp_path, ray_session):
    log = tmp_path / "runs.log"
    with Storage.open(url) as db:
        summary = _run_ladder(
            db, LadderOptions("tiny", numbers=(0, 4), rungs=3, top=460_000), run_fn=_logged(log)
        )
        assert (summary.trained, summary.skipped) == (3, 3) and len(_lines(log)) == 3
        assert len(db.ladder_rungs("tiny")) == 6


# --- reading: export --scale-to and pareto --at-size --------------------------------------------
def _laddered(url: str, floor: bool = True, seed: int = 0, scale: float = 1.0) -> str:
    """Rungs of trials 0 and 1 stored as the stand-in law trains them, without Ray; without `floor`,
    falling as a steeper power law with no floor (E = 0); at training `seed`, the losses x `scale`."""
    with Storage.open(url) as db:
        for p in plan_ladder(db, OPTIONS):
            loss = _law(p.config) if floor else 500 * param_counts(p.config).non_embedding ** -0.5
            db.add_ladder_rung(
                "tiny", trial_number=p.trial, tokens_per_param=20, batch_size=16, target_params=p.target,
                config=p.config, seed=seed, tokens=p.settings["tokens"], val_loss=loss * scale,
            )  # fmt: skip
    return url


def test_a_ladder_of_two_seeds_prints_how_far_apart_each_seeds_rungs_put_the_4x_prediction(url, ray_session):
    _laddered(url)
    argv = ["ladder", "--study", "tiny", "--storage", url, "--trial", "0", "--trial", "1", "--rungs", "3",
            "--batch-size", "16", "--tokens-per-param", "20"]  # fmt: skip
    one = CliRunner().invoke(app, argv)
    assert one.exit_code == 0, one.output
    assert "0 rungs trained, 6 reused" in one.output and "by the rungs' seed" not in one.output
    _laddered(url, seed=1, scale=1.02)  # seed 1's rungs 2% above seed 0's: its law is seed 0's x 1.02
    two = CliRunner().invoke(app, argv)
    assert two.exit_code == 0, two.output
    lines = [x for x in two.stdout.splitlines() if "at 4x its top rung" in x]
    assert len(lines) == 2 and all("by the rungs' seed" in x and "(2.0% apart)" in x for x in lines), lines
    as_json = CliRunner().invoke(app, [*argv, "--json"])
    assert as_json.exit_code == 0, as_json.output
    for p in json.loads(as_json.stdout)["at_4x_top"]:
        assert p["by_seed"]["1"] / p["by_seed"]["0"] == pytest.approx(1.02, abs=1e-6), p


def test_export_scale_to_shows_how_far_the_rungs_training_seed_moves_the_prediction(url, tmp_path):
    args = ["export", "--study", "tiny", "--trial", "1", "--scale-to", "1.3B", "--format", "json",
            "--storage", url]  # fmt: skip
    _laddered(url)
    one = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "one")])
    assert one.exit_code == 0, one.output
    assert "one training seed: the interval does not carry" in one.stdout and "`--seed 1`" in one.stdout
    with Storage.open(url) as db:  # seed 2's ladder under way: one rung of trial 1 stored
        p = next(p for p in plan_ladder(db, OPTIONS) if p.trial == 1)
        db.add_ladder_rung(
            "tiny", trial_number=1, tokens_per_param=20, batch_size=16, target_params=p.target,
            config=p.config, seed=2, tokens=p.settings["tokens"], val_loss=_law(p.config),
        )  # fmt: skip
    partial = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "partial")])
    assert "only one seed's rungs can be fitted alone so far" in partial.stdout, partial.output
    # Seed 1's rungs 2% above seed 0's at every size: its law is seed 0's x 1.02, so its prediction
    # too (seed 2's one rung cannot be fitted alone and is left out).
    _laddered(url, seed=1, scale=1.02)
    two = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "two")])
    assert two.exit_code == 0, two.output
    line = next(x for x in two.stdout.splitlines() if "by the rungs' training seed" in x)
    (low, high) = (float(line.split(f"seed {s} ")[1].split()[0].rstrip(",")) for s in (0, 1))
    assert high / low == pytest.approx(1.02, abs=1e-3) and "(2.0% apart;" in line, line
    with Storage.open(url) as db:
        rungs = db.ladder_rungs("tiny")
    assert seed_predictions([r for r in rungs if r.seed == 0], 1, 1e9) == ()  # one seed: nothing to compare


def test_export_scale_to_prints_the_predicted_loss_its_interval_and_distance(url, tmp_path):
    _laddered(url)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        ["export", "--study", "tiny", "--trial", "1", "--scale-to", "1.3B", "--tokens", "26B", "--format",
         "json", "-o", str(out), "--storage", url],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    scaled = ArchConfig.from_dict(json.loads((out / "archsearch.json").read_text())["config"])
    truth = E + A["swiglu"] * param_counts(scaled).non_embedding ** -ALPHA
    line = next(x for x in result.stdout.splitlines() if x.startswith("predicted loss: "))
    predicted = float(line.split()[2])
    assert predicted == pytest.approx(truth, abs=5e-4)
    assert "(95% bootstrap over rungs), extrapolated" in line and "x past the top rung" in line
    assert (
        "from the ladder of trial 1: 3 rungs of" in result.stdout
        and "fitted with 1 other design" in result.stdout
    )
    assert "G training tokens (20 per parameter), on the ladder's corpus" in result.stdout
    assert "note: --tokens" not in result.stderr  # 26B at 1.3B is the ladder's ratio
    assert "do not pin the floor" not in result.stderr  # E = 1.2, recovered
    # 3 rungs each: without their top rungs, 2 designs of 2 rungs leave no more points than constants.
    assert "backtest" not in result.stdout
    with Storage.open(url) as db:
        found = predict_trial(db.ladder_rungs("tiny"), 1, scaled, 26 * 10**9)
    assert found.prediction.distance > 1000 and found.prediction.extrapolated


def test_a_law_whose_floor_the_rungs_do_not_pin_is_said_to_predict_too_low_far_out(url, tmp_path):
    _laddered(url, floor=False)
    args = ["--study", "tiny", "--storage", url]
    out = str(tmp_path / "o")
    export = ["export", *args, "--trial", "1", "--scale-to", "1.3B", "--format", "json", "-o", out]
    for command in (export, ["pareto", *args, "--at-size", "1.3B"]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 0, result.output
        assert "note: these rungs do not pin the floor E (fitted at its bound, 0)" in result.stderr


def test_export_scale_to_without_a_ladder_says_how_to_get_one(url, tmp_path):
    result = CliRunner().invoke(
        app, ["export", "--study", "tiny", "--trial", "0", "--scale-to", "350M", "--format", "json", "-o",
              str(tmp_path / "o"), "--storage", url],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "predicted loss" not in result.stdout
    assert "note: no ladder of trial 0: `archsearch ladder --study tiny --trial 0`" in result.stderr


def test_tokens_without_scale_to_is_refused(url, tmp_path):
    result = CliRunner().invoke(
        app, ["export", "--study", "tiny", "--trial", "0", "--tokens", "26B", "--format", "json", "-o",
              str(tmp_path / "o"), "--storage", url],
    )  # fmt: skip
    assert result.exit_code == 2 and result.stderr == "error: --tokens only goes with --scale-to\n"


def test_pareto_at_size_ranks_the_laddered_designs_by_predicted_loss(url):
    _laddered(url)
    runner = CliRunner()
    result = runner.invoke(app, ["pareto", "--study", "tiny", "--at-size", "2M", "--storage", url, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [r["trial"] for r in doc["ranked"]] == [1, 0]  # swiglu's A is the smaller
    for r in doc["ranked"]:
        assert r["low"] <= r["loss"] <= r["high"] and r["extrapolated"] and r["distance"] > 1
        assert abs(r["target_params"] / 2e6 - 1) <= 0.25
    table = runner.invoke(app, ["pareto", "--study", "tiny", "--at-size", "2M", "--storage", url])
    assert "ranked by predicted loss" in table.stdout


def test_pareto_at_size_without_ladders_is_one_error_line(url):
    result = CliRunner().invoke(app, ["pareto", "--study", "tiny", "--at-size", "2M", "--storage", url])
    assert result.exit_code == 2
    assert (
        result.stderr
        == "error: study 'tiny' has no ladder: run `archsearch ladder --study tiny --knee` first\n"
    )


def test_ladder_options_are_checked_before_anything_runs():
    with pytest.raises(LadderError, match="--workers must be at least 1"):
        LadderOptions("s", knee=True, workers=0)
    with pytest.raises(LadderError, match="given twice"):
        LadderOptions("s", numbers=(1, 1))


# --- one real ladder through the CLI ------------------------------------------------------------
@pytest.mark.long
def test_a_real_ladder_trains_stores_fits_and_a_rerun_trains_nothing(url, ray_session, tmp_path):
    args = ("--study", "tiny", "--trial", "0", "--trial", "1", "--rungs", "3", "--tokens-per-param", "0.01",
            "--workers", "2", "--storage", url, "--json")  # fmt: skip
    first = _run(*args)
    assert first.exit_code == 0, first.output
    doc = json.loads(first.stdout)
    assert (doc["trained"], doc["skipped"], doc["failed"]) == (6, 0, [])
    assert len(doc["rungs"]) == 6 and doc["fit"]["designs"] == [0, 1] and doc["fit_error"] is None
    assert all(r["tokens"] >= round(0.01 * r["params_total"]) for r in doc["rungs"])
    plot = tmp_path / "ladders.png"
    again_run = _run(*args, "--plot", str(plot))
    assert again_run.exit_code == 0, again_run.output
    assert plot.read_bytes().startswith(b"\x89PNG") and f"wrote {plot}" in again_run.stderr
    again = json.loads(again_run.stdout)
    assert (again["trained"], again["skipped"]) == (0, 6)
    assert [r["loss"] for r in again["rungs"]] == [r["loss"] for r in doc["rungs"]]


def test_export_of_a_trial_whose_ladder_has_one_size_says_so(url, tmp_path):
    _laddered(url)
    with Storage.open(url) as db:
        [first, *_] = plan_ladder(db, LadderOptions("tiny", numbers=(3,), rungs=4, top=200_000))
        db.add_ladder_rung(
            "tiny", trial_number=3, tokens_per_param=20, batch_size=16, target_params=first.target,
            config=first.config, seed=0, tokens=first.settings["tokens"], val_loss=_law(first.config),
        )  # fmt: skip
    result = CliRunner().invoke(
        app, ["export", "--study", "tiny", "--trial", "3", "--scale-to", "350M", "--format", "json", "-o",
              str(tmp_path / "o"), "--storage", url],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "predicted loss" not in result.stdout
    assert (
        "ladder: no prediction for trial 3: trial 3's ladder at 20 tokens per parameter and batch 16 has one "
        "size so far" in result.stderr
    )
    # pareto --at-size leaves it out and says why.
    ranked = CliRunner().invoke(app, ["pareto", "--study", "tiny", "--at-size", "2M", "--storage", url])
    assert ranked.exit_code == 0 and "left out: trial 3: its ladder has one size so far" in ranked.stderr


def test_pareto_at_size_names_designs_laddered_under_another_recipe_only(url):
    """A design laddered only at another tokens-per-parameter ratio vanished from the
    ranking unsaid (the JSON said `left_out: 0`)."""
    _laddered(url)
    with Storage.open(url) as db:
        for p in plan_ladder(db, LadderOptions("tiny", numbers=(3,), rungs=4, top=200_000)):
            db.add_ladder_rung(
                "tiny", trial_number=3, tokens_per_param=5, batch_size=16, target_params=p.target,
                config=p.config, seed=0, tokens=p.settings["tokens"], val_loss=_law(p.config),
            )  # fmt: skip
    result = CliRunner().invoke(
        app, ["pareto", "--study", "tiny", "--at-size", "2M", "--storage", url, "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [r["trial"] for r in doc["ranked"]] == [1, 0]
    assert doc["left_out"] == [
        "trial 3: laddered only at 5 tokens per parameter at batch 16; this ranking is at 20 tokens per "
        "parameter at batch 16, the recipe most designs share"
    ]


def test_pareto_at_size_where_no_design_has_a_shape_is_one_error_line(url):
    """Every design left out printed an empty table and exited 0."""
    _laddered(url)
    result = CliRunner().invoke(app, ["pareto", "--study", "tiny", "--at-size", "1k", "--storage", url])
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.startswith(
        "error: no laddered design of 'tiny' can be ranked at 1k parameters: trial "
    )
    assert "no shape keeping its design has 1k parameters" in result.stderr and result.stderr.count("\n") == 1


def test_a_count_that_rounds_to_zero_says_so(url, tmp_path):
    result = CliRunner().invoke(
        app, ["export", "--study", "tiny", "--trial", "0", "--scale-to", "0.5", "--format", "json", "-o",
              str(tmp_path / "o"), "--storage", url],
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.stderr == "error: --scale-to '0.5' rounds to 0: a count is a whole number, at least 1\n"


def test_pareto_at_size_of_a_study_with_nothing_to_ladder_does_not_advise_a_ladder(tmp_path):
    """A study whose every trial failed was told to run `ladder --knee`, which fails."""
    url = f"sqlite:///{tmp_path / 'f.db'}"
    spec = tiny_spec()
    with Storage.open(url) as db:
        db.create_study(
            "failed", spec_fingerprint=spec.fingerprint, spec_source=spec.source, spec=spec.to_dict(),
            objectives=spec.objectives,
        )  # fmt: skip
        slot = db.claim_trial("failed", 100, 60)
        db.assign_trial(slot, number=0, optuna_trial_id=0, params={}, config=None)
        db.finish_trial(slot, TrialOutcome(status="failed", reason="boom"))
    result = CliRunner().invoke(app, ["pareto", "--study", "failed", "--at-size", "2M", "--storage", url])
    assert (result.exit_code, result.stderr) == (
        2,
        "error: study 'failed' has no ladder, and no complete trial to ladder yet\n",
    )


def test_rungs_naming_a_trial_the_study_lacks_are_left_out_with_a_note(tmp_path):
    """`pareto --at-size` on rungs whose trial number names no trial: a KeyError traceback."""
    result = _pareto_at_size_after(
        tmp_path, "UPDATE archsearch_ladder_rungs SET trial_number = 999 WHERE trial_number = 1"
    )
    assert result.exit_code == 0, result.output
    assert "left out: trial 999: its rungs name a trial the study does not have" in result.stderr


def test_a_size_no_design_reaches_is_noted_without_another_command_s_flags(tmp_path):
    """`pareto --at-size 1` advised `--top` and `--rungs`, flags of `ladder`, not of `pareto`."""
    url = _laddered(ladder_study(f"sqlite:///{tmp_path / 't.db'}"))
    result = CliRunner().invoke(app, ["pareto", "--study", "tiny", "--at-size", "1", "--storage", url])
    # No design left to rank is an error (it used to print an empty table, exit 0).
    assert one_line(result, 2).startswith("error: no laddered design of 'tiny' can be ranked at 1 parameters")
    assert "trial 0: no shape keeping its design has 1 parameters" in result.stderr
    assert "--top" not in result.stderr and "--rungs" not in result.stderr


def test_a_stored_rung_loss_no_run_ends_with_is_a_damaged_database(tmp_path):
    """A rung whose val_loss is -1e308 reached the fit's logarithm: exit 2, as if the input erred."""
    result = _pareto_at_size_after(
        tmp_path, "UPDATE archsearch_ladder_rungs SET val_loss = -1e308 WHERE id = 1"
    )
    line = one_line(result, 1)
    assert "damaged" in line and "the val_loss of ladder rung 1 of 'tiny' is -1e+308" in line, line


def _pareto_at_size_after(tmp_path, sql):
    """`pareto --at-size 2M` on a laddered study whose database `sql` edited behind its back."""
    url = _laddered(ladder_study(f"sqlite:///{tmp_path / 't.db'}"))
    with sqlite3.connect(tmp_path / "t.db") as conn:
        conn.execute(sql)
    conn.close()
    return CliRunner().invoke(app, ["pareto", "--study", "tiny", "--at-size", "2M", "--storage", url])
