"""A value given on the command line is the value used: `search
--trials 0` ran the space file's trial count and `--sampler ''` its sampler (exit 0, trials added
to the study), where `--trials -3` and `--sampler nope` were refused. A given value that is falsy
is refused as any other bad value is: one line, exit 2, the database as it was."""

from __future__ import annotations

import hashlib

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.storage import Storage
from tests.helpers import one_line, space_file
from tests.storage.test_query import fill_study

REFUSED = {
    "trials-0": (["--trials", "0"], "error: --trials must be at least 1, got 0"),
    "sampler-empty": (["--sampler", ""], "error: sampler '' is unknown; valid: tpe, nsga2, random, gp"),
}


@pytest.mark.parametrize("resume", [False, True], ids=["new", "resume"])
@pytest.mark.parametrize(("args", "line"), REFUSED.values(), ids=REFUSED.keys())
def test_a_falsy_search_option_is_refused_not_replaced_by_the_file_s(tmp_path, args, line, resume):
    database = tmp_path / "trials.db"
    with Storage.open(f"sqlite:///{database}") as db:
        fill_study(db)
    before = hashlib.sha256(database.read_bytes()).hexdigest()
    study = ["--study", "s", "--resume"] if resume else ["--study", "new"]
    result = CliRunner().invoke(
        app,
        ["search", "--space", str(space_file(tmp_path)), *study, *args, "--storage", f"sqlite:///{database}"],
    )
    assert one_line(result, 2) == line
    assert hashlib.sha256(database.read_bytes()).hexdigest() == before
    with Storage.open(f"sqlite:///{database}", read_only=True) as db:
        assert db.study_names() == ["s"]


def test_a_study_given_twice_to_pareto_is_refused_as_report_refuses_it(tmp_path):
    """`pareto --study s --study s` overlaid the study on itself, exit 0, where `report` refused
    it: the rule is now `pareto.study_fronts`', which both read."""
    database = tmp_path / "trials.db"
    with Storage.open(f"sqlite:///{database}") as db:
        fill_study(db)
    args = ["pareto", "--study", "s", "--study", "s", "--storage", f"sqlite:///{database}"]
    assert one_line(CliRunner().invoke(app, args), 2) == "error: --study s given more than once"
