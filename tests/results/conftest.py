"""Trial databases for the report tests (built through the storage API in a temporary SQLite file)."""

from __future__ import annotations

import pytest

from archsearch.storage import Storage
from tests.results.studies import recorded_study, small_study


@pytest.fixture
def url(tmp_path):
    """Studies "a" (adjusted loss, beta 0.2), "b" (proxy loss) and "c" (b's trials, 0.1 better)."""
    url = f"sqlite:///{tmp_path / 'report.db'}"
    with Storage.open(url) as db:
        small_study(db, "a", size_beta=0.2)
        small_study(db, "b")
        small_study(db, "c", shift=-0.1)
    return url


@pytest.fixture
def recorded_url(tmp_path, monkeypatch):
    """The recorded calibration set as a validated study "tiny-recorded", in ./tiny.db of a
    temporary working directory (the URL a user would type, shown in the report's header)."""
    monkeypatch.chdir(tmp_path)
    url = "sqlite:///tiny.db"
    with Storage.open(url) as db:
        recorded_study(db, "tiny-recorded")
    return url
