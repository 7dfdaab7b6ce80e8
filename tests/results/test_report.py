"""The study report's contents (`results.report`) and its page (`results.html`), on studies built
through the storage API."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.errors import ArchsearchError, UnknownNameError
from archsearch.evaluators.step_kernels import ProfileReport
from archsearch.results.html import render, write_report
from archsearch.results.report import (
    TOP_KERNELS,
    ReportError,
    build_report,
    rank_interval,
    step_breakdown,
)
from archsearch.search.selection import Choice, select
from archsearch.space.export import EXPORT_FORMATS
from archsearch.storage import Storage
from archsearch.trial import TrialOutcome
from tests.helpers import store_promotions
from tests.results.studies import FRONT, KNEE, SHAPES, ladder_study, small_study


def _report(url: str, *studies: str, **kwargs):
    with Storage.open(url, create=False) as db:
        return build_report(db, list(studies), **kwargs)


def test_a_section_holds_the_front_the_knee_and_every_trial(url):
    [s] = _report(url, "b").sections
    assert s.front.front.numbers == FRONT and s.knee.number == KNEE == s.front.front.knee
    numbers = [row[0] for row in s.table.rows]
    assert numbers == [0, 1, 2, 3, 4, None] and s.total_trials == 6  # and the failed one, never numbered
    assert set(s.shapes) == set(range(len(SHAPES)))  # the failed trial never had a shape
    assert s.record.counts == {"complete": 5, "failed": 1}


def test_the_knee_is_the_one_export_knee_writes_with_the_study_s_loss_objective(url):
    # "a" ranks loss - 0.2 ln(params / 1M): every shape is on its front, the knee stays trial 1.
    [s] = _report(url, "a").sections
    assert s.front.size_beta == 0.2 and s.front.front.numbers == (4, 3, 2, 1, 0)
    assert s.knee.number == KNEE


def test_studies_that_rank_different_losses_need_one_named(url):
    with pytest.raises(ArchsearchError, match="rank different loss objectives: pass --loss"):
        _report(url, "a", "b")  # a credits size (beta 0.2), b ranks the proxy loss
    report = _report(url, "a", "b", loss="proxy")
    assert [s.front.size_beta for s in report.sections] == [None, None]
    with Storage.open(url, create=False) as db:  # the knee section stays export's, by a's own loss
        assert report.sections[0].knee.number == select(db, "a", Choice("json", knee=True)).knee


def test_the_knee_section_says_when_the_plot_ranks_another_loss(url):
    report = _report(url, "b")
    [s] = report.sections
    assert "The plot's knee" not in render(report)
    other = next(r for r in s.front.records if r.number != s.front.front.knee)
    page = render(dataclasses.replace(report, sections=(dataclasses.replace(s, knee=other),)))
    assert f"The plot's knee, trial {s.front.front.knee}, is that of the loss the fronts rank" in page


def test_a_study_with_promotions_is_ranked_and_said_to_be_ranked_at_their_budget(url):
    with Storage.open(url) as db:
        small_study(db, "p")  # b's trials; 4 overtakes 3 and 1 at twice the proxy's 2,048 tokens
        store_promotions(db, "p", 4096, {1: 2.35, 3: 2.15, 4: 2.0})
    report = _report(url, "p")
    [s] = report.sections
    assert s.front.front.numbers == (4, 3, 1, 0) and s.front.ranking.budget == 4096
    with Storage.open(url, create=False) as db:
        assert s.knee.number == select(db, "p", Choice("json", knee=True)).knee  # as export --knee
    page = render(report)
    line = (
        "ranked at 4,096 tokens (2x the proxy) for the 3 promoted contenders (trials 1, 3, 4); the other "
        "trials estimated there: their value at the proxy&#x27;s 2,048 tokens plus the contenders&#x27; "
        "median change"
    )
    assert f'<p class="ranked-at">{line}</p>' in page
    assert 'class="ranked-at"' not in render(_report(url, "b"))  # a study without promotions: as before


def test_the_table_is_cut_to_max_rows_but_keeps_the_front(url):
    [s] = _report(url, "b", max_rows=4).sections
    assert [row[0] for row in s.table.rows] == [0, 1, 2, 3]  # the front (0, 1, 3) and trial 2
    [s] = _report(url, "b", max_rows=1).sections
    assert sorted(row[0] for row in s.table.rows) == sorted(FRONT)  # never fewer than the front
    page = render(_report(url, "b", max_rows=4))
    assert "The table shows 4 of 6 trials" in page and "archsearch trials --study b --format csv" in page


@pytest.mark.parametrize("fmt", EXPORT_FORMATS.names())
def test_each_export_format_shows_the_files_export_writes_or_its_refusal(url, tmp_path, fmt):
    [s] = _report(url, "b").sections
    assert [e.fmt for e in s.exports] == list(EXPORT_FORMATS)
    (e,) = (e for e in s.exports if e.fmt == fmt)
    out = tmp_path / fmt
    args = ["export", "--study", "b", "--knee", "--format", fmt, "-o", str(out), "--storage", url]
    result = CliRunner().invoke(app, args)
    if e.refused is not None:  # nanogpt: the knee has RMSNorm
        assert result.exit_code == 2 and e.refused in result.stderr
        assert e.refused == EXPORT_FORMATS[fmt].refusal(s.knee.config) and not e.files and e.target is None
        return
    assert result.exit_code == 0, result.output
    written = {p.name: p.read_text() for p in out.iterdir()}
    assert dict(e.files) == written and e.target in result.stdout


def test_the_knee_of_the_fixture_is_refused_by_one_format_only(url):
    [s] = _report(url, "b").sections  # so the test above sees both outcomes
    assert [e.fmt for e in s.exports if e.refused] == ["nanogpt"]


def test_a_validation_shows_the_bootstrap_intervals_validate_stored():
    from archsearch.results.report import validation_view
    from archsearch.storage import ValidationRecord

    correlations = {k: {"spearman": 0.5, "kendall": 0.4} for k in ("proxy", "params", "flops")}
    report = {"trials": list(range(12)), "correlations": correlations, "iso_pairs": {}}
    stored = {
        "spearman": {"value": 0.5, "low": 0.1, "high": 0.8},
        "kendall": {"value": 0.4, "low": None, "high": 0.7},
    }
    deciding = {"proxy": stored, "params": stored, "flops": stored}
    view = validation_view(ValidationRecord(1, "s", 10.0, 1, {**report, "deciding": deciding}, 0.0))
    proxy = view.correlations[0]
    assert proxy.spearman_interval == (0.1, 0.8)  # validate's own bootstrap over the trials
    assert proxy.kendall_interval is None  # an undefined bound: no interval rather than a guess
    older = validation_view(ValidationRecord(1, "s", 10.0, 1, report, 0.0)).correlations[0]
    assert older.spearman_interval == rank_interval(0.5, 12, "spearman")  # stored before: Fisher z


def test_rank_intervals_by_fisher_z():
    # Spearman: z = atanh(0.5) = 0.549306, sd = sqrt((1 + 0.125) / 9) = 0.353553, z +- 0.692952.
    low, high = rank_interval(0.5, 12, "spearman")
    assert low == pytest.approx(math.tanh(0.549306 - 0.692952), abs=1e-5) == pytest.approx(-0.14267, abs=1e-5)
    assert high == pytest.approx(0.84610, abs=1e-5)
    # Kendall: sd = sqrt(0.437 / 8) = 0.233720, z +- 0.458083.
    low, high = rank_interval(0.5, 12, "kendall")
    assert (low, high) == (pytest.approx(0.09097, abs=1e-5), pytest.approx(0.76468, abs=1e-5))
    low, high = rank_interval(-0.3, 40, "spearman")  # symmetric in the sign of r
    assert (-high, -low) == pytest.approx(rank_interval(0.3, 40, "spearman"))
    assert rank_interval(0.5, 3, "spearman") is None and rank_interval(0.5, 4, "kendall") is None
    assert rank_interval(1.0, 12, "spearman") is None and rank_interval(None, 12, "kendall") is None
    with pytest.raises(ValueError, match="no interval for a 'pearson'"):
        rank_interval(0.5, 12, "pearson")


def test_a_stored_validation_is_shown_with_intervals(recorded_url):
    report = _report(recorded_url, "tiny-recorded")
    v = report.sections[0].validation
    assert v is not None and v.trials == 14 and v.earlier == 0
    assert [c.objective for c in v.correlations] == [False, False, False, True]  # the adjusted loss
    for c in v.correlations:
        assert c.spearman_interval[0] < c.spearman < c.spearman_interval[1]
        assert c.kendall_interval[0] < c.kendall < c.kendall_interval[1]
    page = render(report)
    assert "never validated" not in page and 'id="correlations-0"' in page
    regime = re.search(r'<p class="note" id="s0-regime">(.*?)</p>', page)
    assert regime and "the figures above are this study&#x27;s own" in regime[1]
    low, high = v.correlations[0].spearman_interval
    assert f"{v.correlations[0].spearman:.3f} [{low:.2f}, {high:.2f}]" in page


def test_a_study_never_validated_says_so(url):
    page = render(_report(url, "b"))
    warning = re.search(r'<div class="warning" role="alert" id="s0-not-validated">(.*?)</div>', page)
    assert warning and "was never validated" in warning[1] and "archsearch validate --study b" in warning[1]
    regime = re.search(r'<p class="note" id="s0-regime">(.*?)</p>', page)
    # The fixture's trials trained 2,048 tokens each: far fewer per parameter than either regime ranked.
    assert regime and regime[1].startswith("regime: this study&#x27;s proxy (1.43M parameters at 0.0014")
    assert "sits outside the regimes where a ranking was measured" in regime[1]


def test_the_knee_s_step_breakdown_adds_up_to_its_step(url):
    [s] = _report(url, "b").sections
    modelled, local = sorted(s.breakdowns, key=lambda b: b.device)
    assert modelled.device == "h100-sxm" and modelled.modelled and modelled.source
    assert sum(seconds for _, seconds, _ in modelled.parts) == pytest.approx(modelled.step_time_s)
    assert 0 < len(modelled.kernels) <= TOP_KERNELS
    assert [k[2] for k in modelled.kernels] == sorted((k[2] for k in modelled.kernels), reverse=True)
    # The local profile was stored without its report: its step time, no parts.
    assert local.device == "local" and local.source is None and not local.parts
    assert local.step_time_s == pytest.approx(0.01 * (KNEE + 1))


def test_a_measured_step_s_breakdown_has_a_residual(url):
    with Storage.open(url, create=False) as db:
        knee = db.trials_by_number("b", [KNEE])[0]
        stored = next(p for p in db.profiles(knee.id) if p.device == "h100-sxm")
    measured = ProfileReport.from_dict(stored.report).with_measured_step(0.05, 9)
    b = step_breakdown(dataclasses.replace(stored, step_time_s=0.05, report=measured.to_dict()))
    assert [what for what, _, _ in b.parts][-1] == "residual" and "median of 9" in b.source
    assert sum(seconds for _, seconds, _ in b.parts) == pytest.approx(0.05)


def test_settings_devices_and_versions_are_stated(url):
    report = _report(url, "b")
    [s] = report.sections
    assert s.search_runs[0].settings["sampler"] == "tpe"
    [device] = s.devices
    assert device.info["name"] == "Test CPU" and device.trials == 5 and device.long_runs == 0
    versions = dict(report.versions)
    assert {"python", "archsearch", "optuna", "plotly"} <= set(versions)
    page = render(report)
    assert "[proxy]" in page and "Test CPU" in page and "2.13.0+cpu" in page  # the space file as written
    assert f"python {versions['python']}" in page


def test_several_studies_share_one_plot_and_one_reference_point(url):
    report = _report(url, "b", "c")
    assert [s.name for s in report.sections] == ["b", "c"]
    assert report.fronts[0].front.reference == report.fronts[1].front.reference
    page = render(report)
    assert page.count('id="front-plot"') == 1 and 'id="study-1"' in page and 'id="trials-1"' in page


def test_the_page_needs_no_network_and_escapes_what_it_shows(url):
    page = render(_report(url, "b"))
    assert not re.search(r"<(script|link|img|iframe)[^>]*\b(src|href)=", page)  # nothing fetched
    assert "Plotly" in page and len(page) > 1_000_000  # plotly.js itself is inline
    # A failure reason from the database is text, never markup.
    assert "worker died: &lt;boom&gt; &amp; more" in page and "<boom>" not in page


def test_a_study_name_is_escaped_everywhere(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    name = '<img src=x onerror="alert(1)">'
    with Storage.open(url) as db:
        small_study(db, name)
    page = render(_report(url, name))
    assert name not in page and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page


@pytest.mark.parametrize(
    ("studies", "kwargs", "error", "match"),
    [
        ((), {}, ReportError, "give at least one --study"),
        (("b", "b"), {}, ArchsearchError, "--study b given more than once"),  # pareto.study_fronts
        (("b",), {"max_rows": 0}, ReportError, "--max-rows must be at least 1"),
        (("nope",), {}, UnknownNameError, "unknown study 'nope'"),
    ],
    ids=["none", "twice", "no-rows", "unknown"],
)
def test_bad_requests_are_one_line_errors(url, studies, kwargs, error, match):
    with pytest.raises(error, match=match):
        _report(url, *studies, **kwargs)


def test_a_study_without_a_front_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    with Storage.open(url) as db:
        db.create_study("empty", spec_fingerprint="f", spec_source="", spec={}, objectives=("loss", "flops"))
        with pytest.raises(ArchsearchError, match="no complete trial with every objective in 'empty'"):
            build_report(db, ["empty"])


def test_the_report_is_written_as_html_only(url, tmp_path):
    with Storage.open(url, create=False) as db:
        with pytest.raises(ReportError, match=r"ending in \.html, not 'report\.png'"):
            write_report(db, ["b"], tmp_path / "report.png")
        path = write_report(db, ["b"], tmp_path / "report.html")
    assert path.read_text().startswith("<!DOCTYPE html>")


def test_a_report_of_a_study_with_no_complete_trial_says_what_its_trials_are(tmp_path):
    """`report` of a study whose trials all failed said only `no complete trial with every
    objective`; it now counts them by state and names the command that lists their reasons."""

    url = ladder_study(f"sqlite:///{tmp_path / 't.db'}")
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
