"""The loss at the user's own tokens per parameter: rungs laddered at two ratios or more fit the
joint law L(N, D), which `export --scale-to --tokens` and `pareto --at-size --tokens` predict at
(N, D); rungs at one ratio predict at that ratio, with a note. Rungs are stored through the storage
API, or trained by `ladder --tokens-per-param 5,20` with a stand-in run function (a known law)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.results.ladder import fit_study_ladders, fit_study_ladders_joint
from archsearch.results.ladder_fit import LadderFitError
from archsearch.search.ladder_plan import LadderError, LadderOptions, parse_ratios, plan_ladder
from archsearch.space.config import ArchConfig
from archsearch.space.costs import param_counts
from archsearch.storage import Storage, shape_key
from tests.results.studies import ladder_study

# The stand-in law: Chinchilla's form on non-embedding parameters and training tokens.
E, ALPHA, B, BETA = 1.2, 0.34, 20.0, 0.28
A = {"gelu": 30.0, "swiglu": 24.0}
OPTIONS = LadderOptions("tiny", numbers=(0, 1), rungs=3, workers=1)


@pytest.fixture
def url(tmp_path):
    return ladder_study(f"sqlite:///{tmp_path / 't.db'}")


def _law(cfg: ArchConfig, tokens: float) -> float:
    return E + A[cfg.activation] * param_counts(cfg).non_embedding ** -ALPHA + B * tokens**-BETA


def _laddered(url: str, ratios: tuple[float, ...]) -> str:
    """Rungs of trials 0 and 1 at each of `ratios` tokens per parameter, stored as the law gives."""
    with Storage.open(url) as db:
        for ratio in ratios:
            for p in plan_ladder(db, dataclasses.replace(OPTIONS, tokens_per_param=ratio)):
                tokens = p.settings["tokens"]
                db.add_ladder_rung(
                    "tiny", trial_number=p.trial, tokens_per_param=ratio, batch_size=16,
                    target_params=p.target, config=p.config, seed=0, tokens=tokens,
                    val_loss=_law(p.config, tokens),
                )  # fmt: skip
    return url


def _export(url: str, out: Path, tokens: str):
    return CliRunner().invoke(
        app,
        ["export", "--study", "tiny", "--trial", "1", "--scale-to", "1.3B", "--tokens", tokens, "--format",
         "json", "-o", str(out), "--storage", url],
    )  # fmt: skip


def test_rungs_at_two_ratios_fit_the_joint_law_and_recover_it(url):
    _laddered(url, (5, 20))
    with Storage.open(url) as db:
        rungs = db.ladder_rungs("tiny")
    fit = fit_study_ladders_joint(rungs)
    assert fit.joint and fit.designs == (0, 1)
    assert fit.beta == pytest.approx(BETA, rel=1e-2) and fit.alpha == pytest.approx(ALPHA, rel=1e-2)
    assert fit.token_coefficient == pytest.approx(B, rel=5e-2)
    with pytest.raises(LadderFitError, match="one tokens-per-parameter ratio cannot fit L"):
        fit_study_ladders_joint([r for r in rungs if r.tokens_per_param == 20])
    # The law in N alone of one recipe is unchanged by the second ratio's rungs.
    one = fit_study_ladders([r for r in rungs if r.tokens_per_param == 20])
    assert not one.joint


def test_export_tokens_predicts_the_joint_law_at_the_users_ratio_with_both_distances(url, tmp_path):
    _laddered(url, (5, 20))
    result = _export(url, tmp_path / "out", "2.6T")
    assert result.exit_code == 0, result.output
    scaled = ArchConfig.from_dict(json.loads((tmp_path / "out" / "archsearch.json").read_text())["config"])
    truth = _law(scaled, 2.6e12)
    line = next(x for x in result.stdout.splitlines() if x.startswith("predicted loss: "))
    assert float(line.split()[2]) == pytest.approx(truth, rel=2e-3), line
    assert "x past the top rung in non-embedding parameters" in line
    assert re.search(
        r"\d+\.\dx past the largest ratio laddered \([12],\d{3} tokens per parameter against 5-20\)", line
    )
    assert "at 5 and 20 tokens per parameter and batch 16" in result.stdout
    assert "beta 0.28" in result.stdout and "L(N, D))" in result.stdout
    assert re.search(r"2\.6T training tokens \([12],\d{3} per parameter\)", result.stdout)
    assert "note: predicted at" not in result.stderr


def test_export_tokens_with_one_ratio_laddered_predicts_at_it_and_says_so_in_one_line(url, tmp_path):
    _laddered(url, (20,))
    result = _export(url, tmp_path / "out", "2.6T")
    assert result.exit_code == 0, result.output
    assert "predicted loss: " in result.stdout and "(20 per parameter)" in result.stdout
    [note] = [x for x in result.stderr.splitlines() if x.startswith("note: predicted at")]
    assert re.fullmatch(
        r"note: predicted at 20 tokens per parameter; you train at [12],\d{3} \(\d+x past\): ladder a second "
        r"ratio \(--tokens-per-param 5,20\) for the loss at yours",
        note,
    ), note


def test_pareto_at_size_with_tokens_ranks_by_the_joint_law(url):
    _laddered(url, (5, 20))
    args = ["pareto", "--study", "tiny", "--at-size", "1.3B", "--tokens", "2.6T", "--storage", url]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["tokens"] == 2_600_000_000_000 and doc["note"] is None
    assert [r["trial"] for r in doc["ranked"]] == [1, 0]  # swiglu's A is the smaller
    for r in doc["ranked"]:
        assert r["ratios_laddered"] == [5.0, 20.0] and r["ratio_distance"] > 10 and r["distance"] > 1
        assert r["low"] <= r["loss"] <= r["high"]
    table = CliRunner().invoke(app, args)
    assert table.exit_code == 0 and "L(N, D) at 2.6T tokens" in table.stdout and "past ratio" in table.stdout


def test_pareto_at_size_with_tokens_and_one_ratio_notes_the_ladders_ratio(url):
    _laddered(url, (20,))
    args = ["pareto", "--study", "tiny", "--at-size", "1.3B", "--tokens", "2.6T", "--storage", url]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "(20 tokens per parameter, batch 16)" in result.stdout
    assert (
        "note: predicted at 20 tokens per parameter; you train at 2,000 (100x past): ladder a second ratio"
        in (result.stderr)
    )
    alone = CliRunner().invoke(app, ["pareto", "--study", "tiny", "--tokens", "2.6T", "--storage", url])
    assert alone.exit_code == 2 and alone.stderr == "error: --tokens only goes with --at-size\n"


@pytest.mark.parametrize(
    "text, message",
    [
        ("5,x", "--tokens-per-param takes numbers separated by commas (5,20), got '5,x'"),
        ("5,0", "--tokens-per-param must be a finite number > 0, got 0.0"),
        ("5,-1", "--tokens-per-param must be a finite number > 0, got -1.0"),
        ("20,20", "--tokens-per-param gives 20 twice"),
        ("5,,20", "--tokens-per-param takes numbers separated by commas (5,20), got '5,,20'"),
    ],
    ids=["not-a-number", "zero", "negative", "duplicate", "empty-entry"],
)
def test_a_bad_list_of_ratios_is_refused_in_one_line_exit_2_and_stores_nothing(url, text, message):
    with pytest.raises(LadderError, match=re.escape(message)):
        parse_ratios(text)
    result = CliRunner().invoke(
        app, ["ladder", "--study", "tiny", "--trial", "0", "--tokens-per-param", text, "--storage", url]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: {message}\n" and result.stdout == ""
    with Storage.open(url) as db:
        assert db.ladder_rungs("tiny") == [] and db.ladder_fits("tiny") == []


def _fake_run(log: str, request: dict) -> dict:
    """A rung without training: the law's loss at its tokens; each call logged by shape and tokens."""
    cfg = ArchConfig.from_dict(request["config"])
    tokens = request["settings"]["tokens"]
    with open(log, "a") as f:
        f.write(f"{shape_key(cfg)}@{tokens}\n")
    return dict(
        status="complete", reason=None, val_loss=_law(cfg, tokens), tokens=tokens, val_curve=[],
        wall_time_s=0.0, corpus_fingerprint="c", device_fingerprint="d",
    )  # fmt: skip


def _logged(log: Path):
    def run(request: dict) -> dict:  # a plain function: Ray's remote takes no partial
        return _fake_run(str(log), request)

    return run


def test_ladder_at_two_ratios_trains_both_fits_the_joint_law_and_a_rerun_trains_nothing(
    url, tmp_path, ray_session, monkeypatch
):
    log = tmp_path / "runs.log"
    monkeypatch.setattr("archsearch.search.validate.long_run", _logged(log))
    argv = ["ladder", "--study", "tiny", "--storage", url, "--trial", "0", "--trial", "1", "--rungs", "3",
            "--batch-size", "16", "--tokens-per-param", "5,20"]  # fmt: skip
    first = CliRunner().invoke(app, argv)
    assert first.exit_code == 0, first.output
    assert len(log.read_text().split()) == 12 and len(set(log.read_text().split())) == 12
    assert "12 rungs trained, 0 reused" in first.stderr
    assert "Ladders of 'tiny' at 5 tokens per parameter" in first.stdout
    assert "Ladders of 'tiny' at 20 tokens per parameter" in first.stdout
    [joint] = [x for x in first.stdout.splitlines() if x.startswith("joint law: ")]
    assert "over 2 designs at 5 and 20 tokens per parameter, batch 16" in joint, joint
    with Storage.open(url) as db:
        rungs = db.ladder_rungs("tiny")
        assert sorted({r.tokens_per_param for r in rungs}) == [5.0, 20.0] and len(rungs) == 12
        assert len(db.ladder_fits("tiny")) == 2  # one per ratio, as one ratio's ladder stores
    log.unlink()
    again = CliRunner().invoke(app, [*argv, "--json"])
    assert again.exit_code == 0, again.output
    assert not log.exists()  # nothing trained twice
    doc = json.loads(again.stdout)
    assert [(d["trained"], d["skipped"]) for d in doc["ladders"]] == [(0, 6), (0, 6)]
    assert doc["joint_fit"]["beta"] == pytest.approx(BETA, rel=1e-2) and doc["joint_fit_error"] is None
