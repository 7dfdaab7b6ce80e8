"""What a run depends on, checked before any compute, and the one line each failure ends in: shapes
too large to store, an empty corpus, a setup every trial fails on, output paths that cannot be
written, and the command that continues a stopped search (storage and trial count included)."""

from __future__ import annotations

import shlex
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import typer.main
from ray import cloudpickle  # Ray vendors it
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.cli import main as cli_main
from archsearch.errors import Terminated
from archsearch.search import driver as driver_module
from archsearch.search.driver import SearchOptions, SetupFailureError, run_search
from archsearch.space.knobs import config_from_knobs
from archsearch.storage import Storage
from archsearch.trial import TrialOutcome
from tests.processes import archsearch_env, descendants, start_archsearch, wait_for
from tests.readonly import read_only
from tests.specs import tiny_spec, tiny_toml

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers need not import tests/

HUGE = """vocab_size = 256
seq_len = 32
d_model = [1_000_000_000]
aspect_ratio = 32
head_dim = 64"""
PROXY = "tokens = 2048\nbatch_size = 4\nevals = 4\neval_batches = 1\ndevice = 'cpu'"


def _one_line(result, code: int | tuple[int, ...], *fragments: str, progress: bool = False) -> str:
    """The one error line (the only line on stderr; with `progress`, after the search's progress
    lines), checked for the exit code and `fragments`."""
    codes = code if isinstance(code, tuple) else (code,)
    assert result.exit_code in codes, result.output
    lines = result.stderr.strip().splitlines()
    if progress:
        assert all(line.startswith("[") for line in lines[:-1]), result.stderr
        lines = lines[-1:]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _space(tmp_path: Path, **tables: str) -> Path:
    path = tmp_path / "space.toml"
    path.write_text(tiny_toml(**tables))
    return path


# --- checked before anything is written ---------------------------------------------------------------
@pytest.mark.parametrize("command", ["check", "search"])
def test_a_shape_over_2_63_parameters_is_refused_before_anything_is_written(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    space = _space(tmp_path, model=HUGE)
    args = ["space", "check", str(space)] if command == "check" else ["search", "--space", str(space)]
    result = CliRunner().invoke(app, args)
    _one_line(result, 2, "no config in the space can be searched", "params too large to store")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.toml"]


@pytest.mark.parametrize("command", ["check", "search"])
def test_an_empty_corpus_is_refused_before_any_trial(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.txt").write_bytes(b"")
    space = _space(tmp_path, proxy=f'{PROXY}\ndata = "empty.txt"')
    args = ["space", "check", str(space)] if command == "check" else ["search", "--space", str(space)]
    result = CliRunner().invoke(app, args)
    _one_line(result, 2, "[proxy].data: ", "empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "space.toml"]


# --- a setup every trial fails on ---------------------------------------------------------------------
def _broken_install(request, known=None, board=None):
    raise ImportError("libtorch_cpu.so: cannot open shared object file")


def _instant(request, known=None, board=None):
    loss = 2.0 + request.config.d_model / 1000 + request.config.n_layers / 100
    return TrialOutcome(status="complete", train={"val_loss": loss, "tokens": 64, "val_curve": [[64, loss]]})


@pytest.mark.usefixtures("ray_session")
def test_a_search_whose_trials_all_fail_the_same_way_stops_and_re_queues_them(tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    with Storage.open(url) as db, pytest.raises(SetupFailureError) as info:
        run_search(tiny_spec(), db, SearchOptions(study="s", trials=5), evaluate_fn=_broken_install)
    assert str(info.value).startswith(
        "the first 3 trials of this run all failed with the same error in the evaluation: ImportError: "
        "libtorch_cpu.so: cannot open shared object file (trials 0, 1, 2, re-queued): fix the setup"
    )
    with Storage.open(url) as db:
        failed = db.trials("s")
        assert [r.status for r in failed] == ["interrupted"] * 3  # not counted: the setup's fault
        run_search(tiny_spec(), db, SearchOptions(study="s", trials=5, resume=True), evaluate_fn=_instant)
        counts = db.counts("s")
        assert counts["complete"] == 5 and set(counts) <= {"complete", "interrupted", "duplicate"}, counts
        rerun = [r.params for r in db.trials("s")[3:6]]
        assert rerun == [r.params for r in failed]  # the re-queued points ran first
    assert "RUNNING" not in {t.state.name for t in optuna.load_study(study_name="s", storage=url).trials}


# --- output paths that cannot be written ---------------------------------------------------------------
@pytest.fixture
def study_url(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 't.db'}"
    with Storage.open(url) as db:
        db.create_study("s", spec_fingerprint="f", spec_source="", spec={}, objectives=("loss", "flops"))
        for number, d_model in enumerate((64, 128)):
            cfg = config_from_knobs(d_model=d_model, n_layers=2, head_dim=32, vocab_size=256, seq_len=32)
            slot = db.claim_trial("s", 10, 60)
            db.assign_trial(slot, number=number, optuna_trial_id=number, params={}, config=cfg)
            db.finish_trial(slot, TrialOutcome(status="complete", train={"val_loss": 3.0 - number}))
    return url


def _no_staging_left(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]


def test_export_into_a_read_only_folder_is_one_line(study_url, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    with read_only(folder):
        result = CliRunner().invoke(
            app, ["export", "--study", "s", "--trial", "0", "--format", "json", "-o", str(folder / "out"),
                  "--storage", study_url],
        )  # fmt: skip
    _one_line(result, (1, 2), str(folder))
    assert list(folder.iterdir()) == []


def test_export_below_a_regular_file_is_one_line(study_url, tmp_path):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "out"
    args = ["export", "--study", "s", "--trial", "0", "--format", "json", "-o", str(out)]
    result = CliRunner().invoke(app, [*args, "--storage", study_url])
    _one_line(result, (1, 2), str(tmp_path / "file"))
    assert (tmp_path / "file").read_text() == "x"


def test_a_plot_into_a_read_only_folder_is_one_line(study_url, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    with read_only(folder):
        result = CliRunner().invoke(
            app, ["pareto", "--study", "s", "--storage", study_url, "--plot", str(folder / "f.png")]
        )
    _one_line(result, (1, 2), str(folder))
    assert list(folder.iterdir()) == []


def test_a_plot_onto_an_existing_directory_is_one_line(study_url, tmp_path):
    (tmp_path / "f.png").mkdir()
    result = CliRunner().invoke(
        app, ["pareto", "--study", "s", "--storage", study_url, "--plot", str(tmp_path / "f.png")]
    )
    _one_line(result, (1, 2), "f.png")
    assert list((tmp_path / "f.png").iterdir()) == []
    _no_staging_left(tmp_path)


ONTO_THE_DATABASE = {  # the database's name, the command, the output
    "trials-csv": ("trials.db", ["trials", "--study", "s", "--format", "csv", "-o", "{db}"]),
    "trials-by-symlink": ("trials.db", ["trials", "--study", "s", "--format", "json", "-o", "{link}"]),
    "trials-another-spelling": ("trials.db", ["trials", "--study", "s", "--format", "csv", "-o", "{other}"]),
    "report": ("trials.html", ["report", "--study", "s", "-o", "{db}"]),
    "pareto-plot": ("trials.html", ["pareto", "--study", "s", "--plot", "{db}"]),
    "ladder-plot": ("trials.png", ["ladder", "--study", "s", "--trial", "0", "--plot", "{db}"]),
}


@pytest.mark.parametrize(("name", "args"), ONTO_THE_DATABASE.values(), ids=ONTO_THE_DATABASE.keys())
def test_an_output_onto_the_database_read_is_refused_and_the_database_kept(tmp_path, name, args):
    """`trials --format csv -o trials.db --storage sqlite:///trials.db` replaced the database with
    the CSV (exit 0): every study in it lost. Issue 26, third probe."""
    import hashlib

    from tests.storage.test_query import fill_study

    path = tmp_path / name
    with Storage.open(f"sqlite:///{path}") as db:
        fill_study(db)
    (tmp_path / "link.csv").symlink_to(path)
    (tmp_path / "sub").mkdir()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    spelled = {"db": path, "link": tmp_path / "link.csv", "other": tmp_path / "sub" / ".." / name}
    filled = [a.format(**spelled) for a in args]
    result = CliRunner().invoke(app, [*filled, "--storage", f"sqlite:///{path}"])
    output = filled[filled.index("-o") + 1] if "-o" in filled else filled[filled.index("--plot") + 1]
    assert _one_line(result, 2) == (
        f"error: cannot write {output}: it is the database sqlite:///{path}, which this command reads"
    )
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["link.csv", name, "sub"])


def test_a_ladder_plot_that_cannot_be_written_is_refused_before_any_rung_trains(study_url, tmp_path):
    """It was refused after the rungs had trained (35 s here, hours at real sizes), as 'File exists'."""
    (tmp_path / "file").write_text("x")
    plot = tmp_path / "file" / "ladder.png"
    args = ["ladder", "--study", "s", "--trial", "0", "--plot", str(plot), "--storage", study_url]
    result = CliRunner().invoke(app, args)
    assert _one_line(result, 2) == f"error: cannot write {plot}: {tmp_path / 'file'} is a file, not a folder"
    with Storage.open(study_url, read_only=True) as db:
        assert db.ladder_rungs("s") == []


# --- the command that continues ------------------------------------------------------------------------
def _cli_args(line: str) -> list[str]:
    """The archsearch arguments of the command quoted in backticks at the end of `line`."""
    command = shlex.split(line.rsplit("`", 2)[-2])
    assert command[0] == "archsearch", command
    return command[1:]


@pytest.mark.usefixtures("ray_session")
def test_a_database_failure_ends_the_cli_with_exit_1_and_the_command_that_continues(tmp_path, monkeypatch):
    from sqlalchemy.exc import OperationalError

    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    space = _space(tmp_path, search="trials = 3\nprune = false")
    monkeypatch.setattr(driver_module, "evaluate", _instant)
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
    line = _one_line(result, 1, f"the database {url} failed while recording trial", "disk I/O", progress=True)
    args = _cli_args(line)
    assert ["--storage", url] == args[args.index("--storage") :][:2] and "--trials" in args
    monkeypatch.setattr(Storage, "finish_trial", original)
    done = CliRunner().invoke(app, args)  # followed literally
    assert done.exit_code == 0, done.output
    with Storage.open(url, create=False) as db:
        counts = db.counts("s")
    assert counts["complete"] == 3 and set(counts) <= {"complete", "interrupted", "duplicate"}, counts
    assert list(cwd.iterdir()) == []  # nothing written where the command ran


SLOW_PROXY = 'seconds = 1.5\nbatch_size = 4\nevals = 2\neval_batches = 1\ndevice = "cpu"'


def test_the_resume_hint_after_an_interrupt_continues_the_same_study_when_followed_literally(tmp_path):
    url = f"sqlite:///{tmp_path / 'db' / 'trials.db'}"
    (tmp_path / "db").mkdir()
    space = _space(tmp_path, proxy=SLOW_PROXY, search="trials = 3\nprune = false")
    env = archsearch_env()
    args = ["search", "--space", str(space), "--study", "s", "--storage", url, "--trials", "3"]
    proc = start_archsearch(*args, cwd=tmp_path)
    # Waited for by state: a first trial recorded.
    wait_for(lambda: _complete(url) >= 1 or proc.poll() is not None, 180, "a first trial")
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    hint = err.strip().splitlines()[-1]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    command = _cli_args(hint)
    assert command[command.index("--storage") + 1] == url and command[command.index("--trials") + 1] == "3"
    done = subprocess.run(
        [sys.executable, "-m", "archsearch", *command], cwd=elsewhere, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _complete(url) == 3 and list(elsewhere.iterdir()) == []


def _complete(url: str) -> int:
    try:
        with Storage.open(url, create=False) as db:
            return db.counts("s").get("complete", 0)
    except Exception:
        return 0


def _reaper_started(pid: int) -> bool:
    """Whether the search `pid` has started the watcher of its local Ray: Ray is starting."""
    for child in descendants(pid):
        try:
            if b"archsearch.search.reaper" in Path(f"/proc/{child}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


@pytest.mark.parametrize(
    ("signum", "code", "name"), [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")]
)
def test_a_signal_while_ray_starts_exits_128_plus_n_with_one_line_and_leaves_no_study(
    tmp_path, signum, code, name
):
    url = f"sqlite:///{tmp_path / 't.db'}"
    space = _space(tmp_path, search="trials = 2\nprune = false")
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


def test_an_error_line_folds_line_breaks_and_cuts_a_huge_value():
    from archsearch.errors import MAX_LINE, error_line

    line = error_line("bad value:\n" + "x" * 10_000_000)
    assert "\n" not in line and len(line) <= MAX_LINE + len("error: ")
    assert line.startswith("error: bad value: xxx") and line.endswith("characters cut)")


def test_trials_output_into_a_read_only_folder_is_refused_before_the_query(study_url, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    with read_only(folder):
        args = ["trials", "--study", "s", "--format", "csv", "-o", str(folder / "t.csv")]
        result = CliRunner().invoke(app, [*args, "--storage", study_url])
    _one_line(result, 2, f"the folder {folder} is not writable")


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
    proc = start_archsearch("space", "check", str(_space(tmp_path)), cwd=tmp_path)
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
    (or Terminated) traceback (issue 26 probe 5)."""

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
