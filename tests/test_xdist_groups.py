"""The test command's xdist groups reach the scheduler.

README's test command runs `-n 2 --dist loadgroup`, and `tests/conftest.py` groups the tests that
share a costly resource (one in-process Ray, one `ray start --head`, one Chromium install). xdist
groups a test by the suffix `@<group>` it adds to the test's node id; a pytest release that stops
reading that rename (pytest 9.2 with pytest-xdist 3.8) scatters every group without an error, and
two workers then install Chromium at once (one fails on dpkg's lock and its browser tests skip)
and start two Ray heads. This test fails instead.
"""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("groups-check")
def test_a_grouped_test_is_scheduled_by_its_group(request):
    config = request.config
    if not hasattr(config, "workerinput") or not config.getvalue("loadgroup"):
        pytest.skip("checks the scheduling of README's test command (-n 2 --dist loadgroup)")
    assert request.node.nodeid.endswith("@groups-check"), request.node.nodeid


def test_the_long_tests_are_collected_first(request):
    items = request.session.items
    long = [i for i, item in enumerate(items) if item.get_closest_marker("long") is not None]
    if not long:
        pytest.skip("no test marked long was collected in this run")
    late = [items[i].nodeid for i in long if i >= len(long)]
    assert not late, f"{len(late)} long tests collected after short ones, first {late[0]}"
