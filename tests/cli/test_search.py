"""`archsearch search`, `studies` and `space check` from the command line, in process and as real
processes (signals, killed workers and concurrent drivers need real processes)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.storage import Storage
from tests.postgres import postgres_database
from tests.processes import alive, archsearch_env, descendants, running_task, start_archsearch, wait_for
from tests.specs import tiny_toml
from tests.terminal import under_a_terminal

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SLOW_PROXY = 'seconds = {seconds}\nbatch_size = 4\nevals = 2\neval_batches = 1\ndevice = "cpu"'


def _space(tmp_path: Path, trials: int = 3, seconds: float | None = None, **tables: str) -> Path:
    if seconds is not None:
        tables["proxy"] = SLOW_PROXY.format(seconds=seconds)
    path = tmp_path / "space.toml"
    path.write_text(tiny_toml(search=f"trials = {trials}\nprune = false", **tables))
    return path


def _counts(url: str, study: str = "s") -> dict[str, int]:
    try:
        with Storage.open(url, create=False) as db:
            return db.counts(study)
    except Exception:
        return {}


def _no_running(url: str, study: str = "s") -> None:
    assert "running" not in _counts(url, study)
    states = {t.state.name for t in optuna.load_study(study_name=study, storage=url).trials}
    assert "RUNNING" not in states, states


# --- bad input: exit 2, one line, nothing written -------------------------------------------------
@pytest.mark.parametrize(
    ("tables", "storage", "message"),
    [
        ({"model": "vocab_size = 256\nseq_len = 32\nd_model = [64]\naspect_ratio = 32\nwidth = 3"}, None,
         r"\[model\].width"),
        ({"budget": "params = { max = 10 }"}, None, "no config in the space meets the budget"),
        ({}, "sqlite:///missing/folder/x.db", "no folder"),
    ],
    ids=["unknown-key", "impossible-budget", "missing-folder"],  # an unreachable server: exit 1, in faults
)  # fmt: skip
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, monkeypatch, tables, storage, message):
    monkeypatch.chdir(tmp_path)
    space = _space(tmp_path, **tables)
    args = ["search", "--space", str(space), "--study", "s"] + (["--storage", storage] if storage else [])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert __import__("re").search(message, lines[0]), lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.toml"]


PROXY = "batch_size = 4\nevals = 4\neval_batches = 1"


def _bad(name: str, table: str, body: str, message: str):
    return pytest.param({table: body}, message, id=name)


# Values `space check` used to accept and that then burned compute.
BAD_VALUES = [
    _bad("lr-negative", "proxy", f"tokens = 2048\nlr = -1.0\n{PROXY}", r"\[proxy\]: lr must be positive"),
    _bad("lr-nan", "proxy", f"tokens = 2048\nlr = nan\n{PROXY}", r"\[proxy\]: lr must be a finite number"),
    _bad("grad-clip-nan", "proxy", f"tokens = 2048\ngrad_clip = nan\n{PROXY}", r"grad_clip must be a finite"),
    _bad("flops-nan", "proxy", f"flops = nan\n{PROXY}", r"\[proxy\]: flops must be a finite number"),
    _bad("seconds-inf", "proxy", f"seconds = inf\n{PROXY}", r"\[proxy\]: seconds must be a finite number"),
    _bad("device-tpu", "proxy", f"tokens = 2048\ndevice = 'tpu'\n{PROXY}",
         r"\[proxy\]: device 'tpu' is unknown; valid: cpu, cuda, cuda:N, auto"),
    _bad("min-run-time-nan", "profile", "local = true\nmin_run_time = nan",
         r"\[profile\].min_run_time: must be finite and positive, got nan"),
    _bad("extrapolate-negative", "objectives", "extrapolate = -1.0",
         r"\[objectives\].extrapolate: must be a finite number >= 0, got -1.0$"),
    _bad("seed-too-large", "search", "trials = 3\nprune = false\nseed = 4294967296",
         r"\[search\].seed: must be in 0\.\.4294967295"),
    # made before the first step: 1e9 of either exhausted the host's memory
    _bad("evals-1e9", "proxy", "tokens = 2048\nbatch_size = 4\nevals = 1e9\neval_batches = 1",
         r"\[proxy\]: evals must be at most 10,000, got 1000000000$"),
    _bad("eval-batches-1e9", "proxy", "tokens = 2048\nbatch_size = 4\nevals = 4\neval_batches = 1e9",
         r"\[proxy\]: eval_batches must be at most 10,000, got 1000000000$"),
]  # fmt: skip


def _study_to_resume(space: Path, url: str) -> None:
    """The study a search of `space` made: archsearch's record, Optuna's study, complete trials."""
    from archsearch.search.spec import load_spec
    from tests.storage.test_query import TRIALS

    spec = load_spec(space)
    with Storage.open(url) as db:
        db.create_study(
            "s", spec_fingerprint=spec.fingerprint, spec_source=spec.source, spec=spec.to_dict(),
            objectives=spec.objectives,
        )  # fmt: skip
        rows = [dict(number=n, status="complete", config=TRIALS[n][0], loss=TRIALS[n][2]) for n in (0, 1, 2)]
        db.add_trials("s", rows)
        optuna.create_study(study_name="s", storage=db.optuna_storage(), directions=["minimize"] * 2)


def test_a_resumed_search_with_every_trial_in_starts_no_ray_and_prints_the_front(tmp_path, monkeypatch):
    """Nothing left to train: the search says so and prints the front without starting Ray (a local
    start is seconds of CPU for nothing), and writes no trial."""
    import ray

    from archsearch.search import pool as pool_module

    space = _space(tmp_path)
    url = f"sqlite:///{tmp_path / 't.db'}"
    _study_to_resume(space, url)
    starts: list[str] = []

    def no_start(*args, **kwargs):
        starts.append("ray")
        raise AssertionError("Ray was started")

    # As if no Ray ran in this process (another test's may): a start would go through these.
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", no_start)
    monkeypatch.setattr(pool_module, "start_local_ray", no_start)
    result = CliRunner().invoke(app, ["search", "--space", str(space), "--resume", "--study", "s",
                                      "--storage", url])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert starts == []
    assert "3/3 finished: 3 complete" in result.stderr, result.stderr
    front = CliRunner().invoke(app, ["pareto", "--study", "s", "--storage", url])
    assert front.exit_code == 0 and result.stdout == front.stdout and "Pareto front of 's'" in front.stdout
    assert _counts(url) == {"complete": 3}


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_read_only_database_is_one_error_line_for_search_and_is_still_read(tmp_path, monkeypatch, what):
    import hashlib

    from tests.readonly import read_only

    monkeypatch.chdir(tmp_path)
    space = _space(tmp_path)
    folder = tmp_path / "db"
    folder.mkdir()
    path = folder / "ro.db"
    url = f"sqlite:///{path}"
    _study_to_resume(space, url)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with read_only(path if what == "file" else folder):
        result = CliRunner().invoke(app, ["search", "--space", str(space), "--resume", "--study", "s",
                                          "--storage", url])  # fmt: skip
        # was a 406-line traceback from Optuna ending in "attempt to write a readonly database"
        assert result.exit_code == 2, result.output
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
        if what == "file":
            assert result.stderr.startswith(
                f"error: cannot write the database {url}: attempt to write a readonly database; check the "
                "permissions of the file and its folder, or give another --storage"
            ), result.stderr
            for reader in (["trials", "--study", "s"], ["pareto", "--study", "s"], ["studies"]):
                read = CliRunner().invoke(app, [*reader, "--storage", url])
                assert read.exit_code == 0, (reader, read.output)
            # validate writes its long runs: refused before any is trained
            validate = CliRunner().invoke(app, ["validate", "--study", "s", "--storage", url])
            assert validate.exit_code == 2 and validate.stderr == result.stderr, validate.output
        else:
            # SQLite cannot create a WAL database's -wal and -shm files there, even to read. Its
            # reason depends on how the folder is read-only: READONLY_DIRECTORY for permission
            # bits ("its folder is read-only", our line), CANTOPEN for an immutable folder.
            assert result.stderr.startswith(f"error: cannot use the database {url}: "), result.stderr
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    with Storage.open(url, create=False) as db:
        assert db.counts("s") == {"complete": 3}


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_database_made_read_only_by_chmod_is_one_error_line_in_a_real_process(tmp_path, what):
    # The user's case exactly: permission bits, which root's capabilities would ignore.
    from tests.readonly import as_an_ordinary_user

    prefix = as_an_ordinary_user()
    space = _space(tmp_path)
    folder = tmp_path / "db"
    folder.mkdir()
    url = f"sqlite:///{folder / 'ro.db'}"
    _study_to_resume(space, url)
    target = folder / "ro.db" if what == "file" else folder
    target.chmod(0o444 if what == "file" else 0o555)
    try:

        def archsearch(*args: str) -> subprocess.CompletedProcess:
            command = [*prefix, sys.executable, "-m", "archsearch", *args, "--storage", url]
            return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=archsearch_env())

        done = archsearch("search", "--space", str(space), "--resume", "--study", "s")
        read = archsearch("studies")
    finally:
        target.chmod(0o644 if what == "file" else 0o755)
    assert done.returncode == 2, done.stderr[-3000:]
    if what == "file":
        assert done.stderr == (
            f"error: cannot write the database {url}: attempt to write a readonly database; check the "
            "permissions of the file and its folder, or give another --storage\n"
        )
        assert read.returncode == 0 and read.stdout.startswith("┏"), read.stderr
    else:
        message = (
            f"error: cannot use the database {url}: its folder is read-only, and SQLite must create the "
            "database's -wal and -shm files there, even to read it; make the folder writable or copy the "
            "database to one\n"
        )
        assert done.stderr == read.stderr == message


@pytest.mark.parametrize("command", ["space-check", "search"])
def test_a_space_file_nested_too_deeply_is_one_error_line(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    space = tmp_path / "space.toml"
    space.write_text("[model]\nd_model = " + "[" * 100_000)  # was a RecursionError traceback
    args = ["space", "check", str(space)] if command == "space-check" else ["search", "--space", str(space)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: {space}: invalid TOML: nested too deeply to be a search spec\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.toml"]


@pytest.mark.parametrize("command", ["space-check", "search"])
@pytest.mark.parametrize(("tables", "message"), BAD_VALUES)
def test_bad_values_in_a_space_file_are_refused_when_read(tmp_path, monkeypatch, command, tables, message):
    monkeypatch.chdir(tmp_path)
    space = tmp_path / "space.toml"
    space.write_text(tiny_toml(**{"search": "trials = 3\nprune = false", **tables}))
    args = ["space", "check", str(space)] if command == "space-check" else ["search", "--space", str(space)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert __import__("re").search(message, lines[0]), lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.toml"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--cpus-per-trial", "nan"], r"--cpus-per-trial must be a finite number >= 0.0001, got nan"),
        (["--cpus-per-trial", "inf"], r"--cpus-per-trial must be a finite number >= 0.0001, got inf"),
        (["--cpus-per-trial", "1e-9"], r"--cpus-per-trial must be a finite number >= 0.0001, got 1e-09"),
        (["--gpus-per-trial", "nan"], r"--gpus-per-trial must be 0 or a finite number >= 0.0001, got nan"),
        (["--seed", "-1"], r"--seed must be in 0\.\.4294967295 \(Optuna's seed range\), got -1"),
        (["--seed", "99999999999"], r"--seed must be in 0\.\.4294967295 .*, got 99999999999"),
        (["--study", ""], r"--study must be a name of 1 to 512 printable characters, got ''"),
        # a line break split the error line and the command that continues it in two
        (["--study", "a\nb"], r"--study must be a name of 1 to 512 printable characters, got 'a\\nb'$"),
        # checked before Ray starts, as the other flags are (was after a local Ray's start-up)
        (["--replay", "nosuch"], r"^error: --replay: no study 'nosuch' in this database$"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_flags_exit_2_with_one_line_before_any_study_is_written(tmp_path, monkeypatch, flags, message):
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 't.db'}"
    Storage.open(url).close()  # an existing database: the refusal must leave it without a study

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray started before the flags were checked")

    monkeypatch.setattr("archsearch.search.driver.RayPool", no_ray)
    args = ["search", "--space", str(_space(tmp_path)), "--storage", url, *flags]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert __import__("re").search(message, lines[0]), lines[0]
    with Storage.open(url, create=False) as db:
        assert db.study_names() == []


def test_studies_needs_an_existing_database(tmp_path):
    result = CliRunner().invoke(app, ["studies", "--storage", f"sqlite:///{tmp_path / 'none.db'}"])
    assert result.exit_code == 2 and "no database at" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_studies_json_lists_the_settings_each_driver_ran(tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    with Storage.open(url) as db:
        db.create_study("s", spec_fingerprint="f", spec_source="", spec={}, objectives=("loss", "flops"))
        db.add_search_run("s", {"sampler": "random", "seed": 1, "prune": False})
    result = CliRunner().invoke(app, ["studies", "--storage", url, "--json"])
    assert result.exit_code == 0, result.output
    (study,) = json.loads(result.stdout)
    (run,) = study["runs"]
    assert run["settings"] == {"sampler": "random", "seed": 1, "prune": False} and run["host"]


def test_space_check_prints_the_space_and_sampled_costs():
    result = CliRunner().invoke(app, ["space", "check", str(EXAMPLES / "tiny.toml"), "--samples", "3"])
    assert result.exit_code == 0, result.output
    assert "aspect_ratio" in result.stdout and "[16, 32, 64]" in result.stdout
    assert "feasible:" in result.stdout and result.stdout.count("d_model ") >= 3


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.toml")))
def test_every_example_space_is_valid_and_feasible(example):
    result = CliRunner().invoke(app, ["space", "check", str(EXAMPLES / example), "--json", "--samples", "1"])
    assert result.exit_code == 0, result.output
    assert '"feasible": 0' not in result.stdout


# --- real processes --------------------------------------------------------------------------------
@pytest.mark.long
@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["int", "term"]
)
def test_a_signal_stops_cleanly_and_resume_finishes_exactly_n(tmp_path, signum, code):
    """A signalled search ends with the command that continues it; that command, followed literally
    from another folder, keeps the database and the trial count and finishes exactly N."""
    (tmp_path / "db").mkdir()
    url = f"sqlite:///{tmp_path / 'db' / 't.db'}"
    # One trial at a time (one worker): the signal comes as the second one starts or runs.
    space = _space(tmp_path, trials=3, seconds=1.0)
    args = ["search", "--space", str(space), "--study", "s", "--storage", url, "--trials", "3"]
    proc = start_archsearch(*args, cwd=tmp_path)
    # Waited for by state: a first trial recorded.
    wait_for(lambda: _counts(url).get("complete", 0) >= 1 or proc.poll() is not None, 180, "a first trial")
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    hint = err.strip().splitlines()[-1]
    assert "--resume" in hint
    _no_running(url)
    command = shlex.split(hint.rsplit("`", 2)[-2])
    assert command[0] == "archsearch", command
    assert command[command.index("--storage") + 1] == url and command[command.index("--trials") + 1] == "3"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "archsearch", *command[1:]],
        cwd=elsewhere, env=archsearch_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # Piped, the progress is one plain line per finished trial, each with an ETA: from the first
    # line on, as the interrupted run's finished trials give the resume their wall times.
    lines = [line for line in done.stderr.splitlines() if re.match(r"\[ *\d+ s\] ", line)]
    assert lines and all(re.search(r"; ETA \d+:\d\d:\d\d$", line) for line in lines), done.stderr
    assert "3/3 finished: 3 complete" in lines[-1] and lines[-1].endswith("ETA 0:00:00"), done.stderr
    counts = _counts(url)
    assert counts["complete"] == 3 and set(counts) <= {"complete", "interrupted", "duplicate"}, counts
    _no_running(url)
    assert list(elsewhere.iterdir()) == []  # nothing written where the command ran


@pytest.mark.long
def test_the_search_bar_counts_running_trials_shows_an_eta_and_keeps_the_final_counts(tmp_path):
    # Seconds budgets keep each trial running long enough for the terminal to draw it (rich redraws
    # ten times a second; the first trial's worker also imports torch before it trains).
    space = _space(tmp_path, trials=2, seconds=1.0)
    args = ["search", "--space", str(space), "--study", "s", "--storage", f"sqlite:///{tmp_path / 't.db'}"]
    code, stdout, shown = under_a_terminal([*args, "--json"], tmp_path)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)  # the bar's colours and cursor moves
    assert code == 0, text[-2000:]
    assert json.loads(stdout)["counts"]["complete"] == 2
    assert "Traceback" not in text, text[-2000:]
    assert "RAY_AUTH_MODE" not in text  # Ray's token notice goes to its log file, not the terminal
    assert re.search(r"search .*0/2 finished: .*; 1 running; .* ETA -:--:--", text), text[-2000:]
    # Once a trial has finished, the ETA is its wall time for the one trial left (1 worker).
    assert re.search(r"search .*1/2 finished: .*; 1 running; .* ETA \d+:\d\d:\d\d", text), text[-2000:]
    last = [line for line in text.splitlines() if line.strip()][-1]
    assert last.startswith("search: 2/2 finished: 2 complete") and "0 running" in last, text[-2000:]


@pytest.mark.long
def test_a_worker_killed_with_sigkill_is_retried_and_the_search_completes(tmp_path):
    # Holds under load: the kill waits for the state it needs (the trial running in the database
    # and a worker of this driver executing it), comes at once (a poll of 0.1 s), and the victim,
    # the first trial of a fresh worker, imports torch (seconds) before it trains for 1 s of a
    # budget in seconds, which a busy machine stretches rather than shortens.
    # One trial: the killed one, which the retry must finish for the search to complete.
    url = f"sqlite:///{tmp_path / 't.db'}"
    space = _space(tmp_path, trials=1, seconds=1.0)
    proc = start_archsearch(
        "search", "--space", str(space), "--study", "s", "--storage", url, "--retries", "1", cwd=tmp_path
    )

    def victim() -> int | None:
        return _counts(url).get("running") and running_task(proc.pid)

    pid = wait_for(victim, 180, "a worker of this search running a trial")
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    with Storage.open(url, create=False) as db:
        records = db.trials("s")
    assert [r.status for r in records if r.status != "duplicate"] == ["complete"]
    [retried] = [r for r in records if r.attempts == 2]
    assert "worker died" in retried.reason, retried.reason
    _no_running(url)


@pytest.mark.long
def test_a_local_ray_does_not_outlive_a_sigkilled_driver(tmp_path):
    # Ray's agents used to live on for 60-90 s after the driver died by SIGKILL.
    url = f"sqlite:///{tmp_path / 't.db'}"
    space = _space(tmp_path, trials=2, seconds=30.0)
    proc = start_archsearch("search", "--space", str(space), "--study", "s", "--storage", url, cwd=tmp_path)
    wait_for(lambda: _counts(url).get("running") and running_task(proc.pid), 180, "a running trial")
    ray_processes = descendants(proc.pid)  # GCS, raylet, agents, workers: the whole local cluster
    assert len(ray_processes) >= 3, ray_processes
    proc.kill()
    proc.communicate(timeout=60)
    wait_for(lambda: not alive(ray_processes), 30, f"Ray's processes {sorted(ray_processes)} to end")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head() -> Iterator[tuple[str, dict[str, str]]]:
    """One `ray start --head` that the parallel-driver tests join, as a shared cluster's drivers do:
    (its address, the environment its drivers need). Started once for the module: a head's start
    is seconds of the machine's CPUs, and each test's drivers are jobs of their own on it."""
    port = _free_port()
    # Ray >= 2.59 authenticates with a token: the head and the drivers share one.
    env = {**archsearch_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    # Ray's command line by its module: a virtual environment made with --system-site-packages
    # has Ray importable but no `ray` script of its own. A CPU for each of the three drivers'
    # trials: with two, the third driver's worker started only once another's first trial had
    # ended, and the other two then waited on its trial's lease (about ten seconds of the test).
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={port}",
         "--num-cpus=3", "--include-dashboard=false", "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:

        def head_up() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_for(head_up, 120, "the Ray head")
        yield f"127.0.0.1:{port}", env
    finally:
        # Its drivers are done: SIGKILL after a short grace, as a clean stop of the head's
        # processes was half a minute of the test's time under load (its raylet was still up 5 s
        # after the SIGTERM). The head's processes are all in its group.
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=1)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=60)


# Three drivers prove what eight did: more than two processes claim, ask and tell at once on one
# study, and there are twice as many trials as drivers, so each driver comes back for more.
@pytest.mark.long
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_parallel_drivers_share_one_study_and_finish_exactly_n(tmp_path, ray_head, backend):
    """Drivers started together on one study (`--resume`), each a process of its own: no lock or
    duplicate-key error, exactly the N trials finished, nothing left running."""
    with contextlib.ExitStack() as stack:
        url = (
            f"sqlite:///{tmp_path / 't.db'}"
            if backend == "sqlite"
            else stack.enter_context(postgres_database())
        )
        _drivers_share_one_study(tmp_path, url, ray_head, n_drivers=3, n_trials=6)


def _drivers_share_one_study(
    tmp_path: Path, url: str, head: tuple[str, dict[str, str]], n_drivers: int, n_trials: int
) -> None:
    # 32 shapes, so that drivers sampling at once seldom repeat one, each of one or two layers 64
    # wide: a trial is over in a second or two (up to 16 layers 256 wide, one took about ten).
    wide = (
        'd_model = [64]\naspect_ratio = [32, 64]\nactivation = ["gelu", "swiglu"]\nbias = [true, false]\n'
        "qk_norm = [true, false]\ntie_embeddings = [true, false]"
    )
    model = f"vocab_size = 256\nseq_len = 32\nhead_dim = 32\n{wide}"
    space = _space(tmp_path, trials=n_trials, model=model)
    address, env = head
    args = ["search", "--space", str(space), "--study", "s", "--storage", url, "--resume",
            "--address", address]  # fmt: skip
    drivers = [start_archsearch(*args, cwd=tmp_path, env=env) for _ in range(n_drivers)]
    outputs = [d.communicate(timeout=600) for d in drivers]
    for driver, (_, err) in zip(drivers, outputs, strict=True):
        assert driver.returncode == 0, err
        assert "locked" not in err.lower() and "duplicate key" not in err, err
    counts = _counts(url)
    with Storage.open(url, create=False) as db:  # a trial that failed says why (seen once under load)
        why = [
            (t.number, t.status, t.reason)
            for t in db.trials("s")
            if t.status not in ("complete", "duplicate")
        ]
    assert counts["complete"] == n_trials and set(counts) <= {"complete", "duplicate"}, (counts, why)
    _no_running(url)


# The constant schedule with its warm-up in tokens, so each promotion resumes its trial's kept state.
PROMOTED_PROXY = (
    "tokens = 2048\nbatch_size = 4\nevals = 2\neval_batches = 1\ndevice = 'cpu'\nprecision = 'fp32'\n"
    "schedule = 'constant'\nwarmup_tokens = 512\nthreads = 1"
)


@pytest.mark.long
@pytest.mark.usefixtures("ray_session")
def test_parallel_drivers_promote_each_contender_once(tmp_path, monkeypatch):
    """Two drivers (processes) resuming one SQLite study whose first pass is done race for the same
    promotions: both finish, each contender is promoted and stored once, none trained again."""
    import ray

    import archsearch.search.driver as driver_module

    url = f"sqlite:///{tmp_path / 't.db'}"
    space = tmp_path / "space.toml"
    search = "trials = 3\nprune = false\nseed = 3\npromote = { cap = 2, margin = 1.0 }"
    space.write_text(tiny_toml(proxy=PROMOTED_PROXY, search=search))
    args = ["search", "--space", str(space), "--study", "s", "--storage", url]
    # The first pass in process, its promotion held back, so both drivers start at promotion at once.
    monkeypatch.setattr(driver_module, "run_promotions", lambda *a, **k: None)
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    # They join the tests' Ray rather than start one each: a start is most of their time.
    address = ray.get_runtime_context().gcs_address
    joined = [*args, "--resume", "--json", "--address", address]
    drivers = [start_archsearch(*joined, cwd=tmp_path) for _ in range(2)]
    outputs = [d.communicate(timeout=300) for d in drivers]
    for driver, (_, err) in zip(drivers, outputs, strict=True):
        assert driver.returncode == 0, err
        assert "locked" not in err.lower(), err
    reports = [json.loads(out)["promotion"] for out, _ in outputs]
    assert reports[0]["contenders"] == reports[1]["contenders"] and reports[0]["budgets"] == [4096]
    contenders = reports[0]["contenders"]
    with Storage.open(url, create=False) as db:
        stored = db.promotions("s")
    counts = _counts(url)  # the first pass was not run again
    assert counts["complete"] == 3 and set(counts) <= {"complete", "duplicate"}, counts
    # One row per contender at 4,096 tokens, each complete and resumed from the first pass's state:
    # a contender trained twice would have a second row, or one trained from step 0.
    rows = sorted((p.trial_number, p.budget_tokens) for p in stored)
    assert rows == [(n, 4096) for n in sorted(contenders)]
    assert {p.status for p in stored} == {"complete"} and {p.resumed_tokens for p in stored} == {2048}
    for report in reports:  # both count the same tokens: each promotion once, 2,048 more each
        assert report["promotion_tokens"] == 2048 * len(contenders)
        assert (report["resumed"], report["afresh"]) == (len(contenders), 0)
    _no_running(url)
