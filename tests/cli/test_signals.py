"""A signal or a failure that stops a command: one line, exit 128 + N (or 1 for the environment),
nothing left half-done, and the command that continues a stopped search, which, followed
literally, finishes it. Waits are on the processes' state, never on sleeps."""

from __future__ import annotations

import json
import shlex
import signal
import sqlite3
import sys
from pathlib import Path

import pytest
import typer.main
from ray import cloudpickle  # Ray vendors it
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.cli import main as cli_main
from archsearch.errors import Terminated
from archsearch.search import driver as driver_module
from archsearch.search import pool as pool_module
from archsearch.storage import Storage
from tests.helpers import one_line, space_file
from tests.processes import descendants, start_archsearch, wait_for
from tests.search.test_driver import instant
from tests.specs import tiny_toml
from tests.storage.test_query import fill_study

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers need not import tests/


def _cli_args(line: str) -> list[str]:
    """The archsearch arguments of the command quoted in backticks at the end of `line`."""
    command = shlex.split(line.rsplit("`", 2)[-2])
    assert command[0] == "archsearch", command
    return command[1:]


@pytest.mark.usefixtures("ray_session")
def test_a_database_failure_ends_the_cli_with_exit_1_and_the_command_that_continues(tmp_path, monkeypatch):
    from sqlalchemy.exc import OperationalError

    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    space = space_file(tmp_path, search="trials = 3\nprune = false")
    monkeypatch.setattr(driver_module, "evaluate", instant)
    original, calls = Storage.finish_trial, []

    def finish_trial(self, trial_id, outcome):
        calls.append(trial_id)
        if len(calls) == 2:
            with self._session():
                raise OperationalError("UPDATE ...", {}, sqlite3.OperationalError("disk I/O error"))
        return original(self, trial_id, outcome)

    monkeypatch.setattr(Storage, "finish_trial", finish_trial)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    result = CliRunner().invoke(app, ["search", "--space", str(space), "--study", "s", "--storage", url])
    line = one_line(result, 1, f"the database {url} failed while recording trial", "disk I/O", progress=True)
    args = _cli_args(line)
    assert ["--storage", url] == args[args.index("--storage") :][:2] and "--trials" in args
    monkeypatch.setattr(Storage, "finish_trial", original)
    done = CliRunner().invoke(app, args)  # followed literally
    assert done.exit_code == 0, done.output
    with Storage.open(url, create=False) as db:
        counts = db.counts("s")
    assert counts["complete"] == 3 and set(counts) <= {"complete", "interrupted", "duplicate"}, counts
    assert list(cwd.iterdir()) == []  # nothing written where the command ran


def _reaper_started(pid: int) -> bool:
    """Whether the search `pid` has started the watcher of its local Ray: Ray is starting."""
    for child in descendants(pid):
        try:
            if b"archsearch.search.reaper" in Path(f"/proc/{child}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


@pytest.mark.long
@pytest.mark.parametrize(
    ("signum", "code", "name"), [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")]
)
def test_a_signal_while_ray_starts_exits_128_plus_n_with_one_line_and_leaves_no_study(
    tmp_path, signum, code, name
):
    url = f"sqlite:///{tmp_path / 't.db'}"
    space = space_file(tmp_path, search="trials = 2\nprune = false")
    args = ["search", "--space", str(space), "--study", "s", "--storage", url]
    proc = start_archsearch(*args, cwd=tmp_path)
    # Waited for by state: the point where Ray starts.
    wait_for(lambda: _reaper_started(proc.pid) or proc.poll() is not None, 120, "Ray to start", every=0.02)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert err.strip().splitlines() == [f"error: interrupted by {name}"], err
    with Storage.open(url, create=False) as db:
        assert db.study_names() == []  # a plain rerun is not refused


def _catches_sigterm(pid: int) -> bool:
    """Whether process `pid` has a SIGTERM handler installed (its /proc status's SigCgt mask)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_the_command_line_loads_is_one_line(tmp_path, signum, code):
    """From the moment the entry's handlers are in place (2 ms into the import; waited for by
    state), a signal ends in one line: before, one during the imports was a traceback (SIGINT)
    or a silent exit 143 (SIGTERM)."""
    proc = start_archsearch("space", "check", str(space_file(tmp_path)), cwd=tmp_path)
    wait_for(lambda: _catches_sigterm(proc.pid) or proc.poll() is not None, 60, "the handlers", every=0.001)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (code, f"error: interrupted by {signal.Signals(signum).name}\n")


@pytest.mark.parametrize(
    ("interrupt", "code", "name"), [(KeyboardInterrupt, 130, "SIGINT"), (Terminated, 143, "SIGTERM")]
)
def test_a_signal_while_typer_reads_the_signatures_is_one_line(monkeypatch, capsys, interrupt, code, name):
    """Between the entry's handlers and the command boundary, Typer builds the command line from
    the signatures (up to a second on a loaded machine): a signal there was a KeyboardInterrupt
    (or Terminated) traceback."""

    def signalled(_app):
        raise interrupt

    monkeypatch.setattr(typer.main, "get_command", signalled)
    monkeypatch.setattr(sys, "argv", ["archsearch", "studies"])
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as exited:
            cli_main()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (exited.value.code, capsys.readouterr().err) == (code, f"error: interrupted by {name}\n")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_interpreter_tears_down_keeps_the_command_s_exit_code(tmp_path, signum):
    """`export` signalled as it exited (its folder written, its lines printed) died by the
    signal's default action, which Python puts back while it finalises: exit 130 / 143, no line.
    Waited for by state: the signal is sent once the output is complete."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    with Storage.open(url) as db:
        fill_study(db)
    out = tmp_path / "out"
    proc = start_archsearch(
        "export",
        "--study",
        "s",
        "--front",
        "--format",
        "json",
        "-o",
        str(out),
        "--storage",
        url,
        cwd=tmp_path,
    )
    wait_for(lambda: (out / "index.json").exists() or proc.poll() is not None, 120, "the export", every=0.002)
    if proc.poll() is None:  # still running: printing its lines, or tearing down
        proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    assert json.loads((out / "index.json").read_text())  # written whole either way
    if proc.returncode != 0:  # the signal came before the command had ended (its last lines): it says so
        assert (proc.returncode, stderr) == (
            128 + signum,
            f"error: interrupted by {signal.Signals(signum).name}\n",
        )
    else:  # it came while the interpreter tore down: the command's own code, not a silent 130 / 143
        assert stderr == "" and "trial" in stdout


def test_the_teardown_ignores_signals_and_is_bounded(monkeypatch):
    from archsearch import __main__ as entry

    calls = []
    monkeypatch.setattr(entry.signal, "signal", lambda s, h: calls.append((s, h)))
    monkeypatch.setattr(entry.signal, "alarm", lambda s: calls.append(("alarm", s)))
    entry._settled()
    assert calls == [
        (signal.SIGINT, signal.SIG_IGN),
        (signal.SIGTERM, signal.SIG_IGN),
        ("alarm", entry.TEARDOWN_BOUND_S),
    ]


@pytest.mark.parametrize(
    ("signal_error", "code", "name"), [(KeyboardInterrupt, 130, "SIGINT"), (Terminated, 143, "SIGTERM")]
)
def test_a_second_signal_during_the_clean_up_still_says_how_to_continue(
    tmp_path, monkeypatch, signal_error, code, name
):
    """A second Ctrl-C (which stops waiting for the first one's clean-up) printed
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
    stop = pool_module.Stop()
    stop(signal.SIGINT, None)
    with pytest.raises(Terminated):
        stop(signal.SIGTERM, None)


@pytest.mark.parametrize(
    ("interrupt", "code", "name"), [(KeyboardInterrupt, 130, "SIGINT"), (Terminated, 143, "SIGTERM")]
)
def test_a_signal_while_the_arguments_are_parsed_is_one_line(monkeypatch, interrupt, code, name):
    """A SIGTERM 0.2 s into `archsearch studies` (Click parsing the command line, before
    the command boundary) exited 130 with nothing said, in about half of 24 tries."""
    from typer.core import TyperGroup

    def signalled(self, ctx, args):
        raise interrupt

    monkeypatch.setattr(TyperGroup, "parse_args", signalled)
    result = CliRunner().invoke(app, ["studies"])
    assert (result.exit_code, result.stderr) == (code, f"error: interrupted by {name}\n")
