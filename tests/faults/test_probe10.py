"""Probe 10's broken promises (issue 26) and probe 9's leftovers: each now one line, the right
exit code, nothing changed."""

from __future__ import annotations

import shlex

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.errors import Terminated
from archsearch.search import driver as driver_module
from archsearch.storage import Storage
from tests.search.test_driver import instant
from tests.specs import tiny_toml


@pytest.mark.parametrize(
    ("signal_error", "code", "name"), [(KeyboardInterrupt, 130, "SIGINT"), (Terminated, 143, "SIGTERM")]
)
def test_a_second_signal_during_the_clean_up_still_says_how_to_continue(
    tmp_path, monkeypatch, signal_error, code, name
):
    """Probe 9: a second Ctrl-C (which stops waiting for the first one's clean-up) printed
    `interrupted by SIGINT` and no command to continue; a second SIGTERM exited 130."""
    real = driver_module.run_search

    def second_signal(spec, db, options, on_update=None, continue_with=None):
        def update(progress):
            if progress.finished >= 1:  # where the second signal's handler raises, in the loop
                raise signal_error()

        return real(spec, db, options, on_update=update, continue_with=continue_with, evaluate_fn=instant)

    monkeypatch.setattr(driver_module, "run_search", second_signal)
    space = tmp_path / "space.toml"
    space.write_text(tiny_toml(search="trials = 3\nprune = false"))
    url = f"sqlite:///{tmp_path / 't.db'}"
    result = CliRunner().invoke(app, ["search", "--space", str(space), "--study", "s", "--storage", url])
    assert result.exit_code == code, result.output
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: interrupted by {name}; continue with `archsearch search "), line
    command = shlex.split(line.split("`")[1])
    assert "--resume" in command and command[command.index("--storage") + 1] == url
    assert command[command.index("--trials") + 1] == "3"
    with Storage.open(url, create=False) as db:
        assert db.counts("s")["complete"] >= 1  # what finished before the signals is kept


def test_a_second_sigterm_is_a_sigterm():
    import signal

    stop = driver_module._Stop()
    stop(signal.SIGINT, None)
    with pytest.raises(Terminated):
        stop(signal.SIGTERM, None)


def test_a_huge_objectives_value_is_quoted_once_and_shortened(tmp_path, monkeypatch):
    """Probe 9: `--objectives` of 100k characters was echoed twice and cut to one line saying
    199,212 characters were cut."""
    monkeypatch.chdir(tmp_path)  # the default database's folder
    huge = "x" * 100_000
    result = CliRunner().invoke(app, ["pareto", "--study", "s", "--objectives", huge])
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert "\n" not in line and "characters cut" not in line and len(line) < 400, line
    assert line.startswith("error: unknown objective 'xxx") and "must be loss then" in line
