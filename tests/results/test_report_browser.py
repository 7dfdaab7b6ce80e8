"""The report in a real browser: headless Chromium opens it with the network cut off, logs no
error, draws the front with every member, sorts the trials table, and a screenshot is written.

Chromium is Debian's `chromium` package: the session's setup installs it where it can (root with
apt-get; set ARCHSEARCH_INSTALL_CHROMIUM=0 to forbid that) and the test skips, saying why, where
it cannot. ARCHSEARCH_CHROMIUM names a browser binary to use instead.

The docs' screenshot is this test's, of the recorded calibration set:
    ARCHSEARCH_REPORT_SCREENSHOT=docs/images/report.png python -m pytest tests/results/test_report_browser.py
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from archsearch.results.html import write_report
from archsearch.storage import Storage
from tests.results.browser import CHROMIUM_ENV, Page, find_chromium, install_chromium

SCREENSHOT_ENV = "ARCHSEARCH_REPORT_SCREENSHOT"  # also copy the screenshot here
# Resolved now, against the directory pytest started in: the study fixture changes directory.
SCREENSHOT = Path(os.environ[SCREENSHOT_ENV]).resolve() if os.environ.get(SCREENSHOT_ENV) else None


@pytest.fixture(scope="session")
def chromium() -> str:
    given = os.environ.get(CHROMIUM_ENV)
    if given:
        if not Path(given).is_file():
            pytest.skip(f"{CHROMIUM_ENV}={given} is not a file")
        return given
    path = find_chromium()
    if path is None and os.environ.get("ARCHSEARCH_INSTALL_CHROMIUM", "1") != "0":
        why = install_chromium()
        path = find_chromium()
        if path is None:
            pytest.skip(
                f"headless Chromium is not installed and could not be: {why or 'not found after install'}"
            )
    if path is None:
        pytest.skip(
            "headless Chromium is not installed (ARCHSEARCH_INSTALL_CHROMIUM=0 forbids installing it)"
        )
    return path


@pytest.fixture(scope="module")
def browser(chromium, tmp_path_factory):
    """One Chromium for the module: its start and its teardown were most of each test's time."""
    with Page(chromium, tmp_path_factory.mktemp("chromium") / "profile") as page:
        yield page


@pytest.fixture
def page(browser):
    """The module's browser on a blank page, nothing of an earlier test's page in its records."""
    browser.reset()
    return browser


def test_the_report_renders_offline_with_the_front_and_a_sortable_table(recorded_url, page, tmp_path):
    out = tmp_path / "report.html"
    with Storage.open(recorded_url, create=False) as db:
        write_report(db, ["tiny-recorded"], out)
        trials = db.trials("tiny-recorded")  # every trial, for the expected orders
    page.open(out)
    page.wait_for("document.querySelectorAll('#front-plot .scatterlayer .trace').length === 3")
    page.settle()
    assert page.errors == [] and page.requests == []

    # The front: the plot's front trace and the page's tables hold exactly its members.
    members = page.evaluate(
        "Array.from(document.querySelectorAll('#front-0 tr[data-front-member]'), r => +r.dataset.frontMember)"
    )
    with Storage.open(recorded_url, create=False) as db:
        from archsearch.search.pareto import study_front

        expected = study_front(db, "tiny-recorded").front
    assert members == list(expected.numbers)
    traces = page.evaluate(
        "document.getElementById('front-plot').data.map(t => [t.name, t.x.length, t.text || null])"
    )
    (all_name, all_n, _), (front_name, front_n, front_text), (knee_name, knee_n, _) = traces
    assert all_name.endswith("all trials") and front_name.endswith(": front")
    assert all_n == len(trials) and front_n == len(members) and knee_n == 1
    assert sorted(int(t.split(":")[0].removeprefix("trial ")) for t in front_text) == sorted(members)
    assert f"knee (trial {expected.knee})" in knee_name
    front_trace = "document.querySelectorAll('#front-plot .scatterlayer .trace')[1]"
    drawn = page.evaluate(f"{front_trace}.querySelectorAll('path.point').length")
    assert drawn == len(members)  # every member is a point in the SVG, not only in the data
    shaded = page.evaluate(
        "Array.from(document.querySelectorAll('#trials-0 tr.front'), r => +r.dataset.number)"
    )
    assert sorted(shaded) == sorted(members)
    assert page.evaluate("document.querySelector('#trials-0 tr.knee').dataset.number") == str(expected.knee)

    # Sorting: a click on "loss" orders the rows by it, a second click reverses them.
    by_loss = [t.number for t in sorted(trials, key=lambda t: (t["loss"], t.number))]
    order = "Array.from(document.querySelectorAll('#trials-0 tbody tr'), r => +r.dataset.number)"
    click = (
        "Array.from(document.querySelectorAll('#trials-0 th')).find(h => h.textContent === 'loss').click()"
    )
    page.evaluate(click)
    assert page.evaluate(order) == by_loss
    page.evaluate(click)
    assert page.evaluate(order) == by_loss[::-1]

    png = page.screenshot()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000  # a drawn page, not a blank one
    (tmp_path / "report.png").write_bytes(png)
    if SCREENSHOT is not None:
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tmp_path / "report.png", SCREENSHOT)
    page.settle()
    assert page.errors == []


def test_an_unvalidated_study_shows_its_warning_in_the_browser(url, page, tmp_path):
    out = tmp_path / "b.html"
    with Storage.open(url, create=False) as db:
        write_report(db, ["b"], out)
    page.open(out)
    page.wait_for("document.querySelectorAll('#front-plot .scatterlayer .trace').length === 3")
    warning = page.evaluate(
        "(() => { const w = document.getElementById('s0-not-validated'); const r = w.getBoundingClientRect();"
        " return [w.textContent, r.width > 0 && r.height > 0]; })()"
    )
    assert "was never validated" in warning[0] and warning[1]  # laid out, not hidden
    page.settle()
    assert page.errors == [] and page.requests == []


def test_the_harness_sees_errors_and_fetches(page, tmp_path):
    # What the report tests assert is absent, this page has: they would see it.
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><body><img src="http://192.0.2.1/x.png">'
        '<script>console.error("logged"); throw new Error("thrown");</script></body></html>'
    )
    page.open(bad)
    page.settle()
    assert any("logged" in e for e in page.errors) and any("thrown" in e for e in page.errors)
    assert "http://192.0.2.1/x.png" in page.requests
