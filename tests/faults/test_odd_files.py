"""Input files that are not plain files, outputs onto a disk that fills, and a memory limit: each ends
in one line with the right exit code (2 for the user's input, 1 for the environment), no wait
without end, and nothing left behind."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.errors import quoted
from tests.helpers import fill_disk, one_line
from tests.specs import TINY_TOML

PROFILE_CACHE = ["profile", "--preset", "byte-1m", "--device", "cpu", "--steps", "1", "--cache"]


# --- a FIFO where a file is read ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "what"),
    [
        (["space", "check"], "search spec"),
        (["config", "check"], "config file"),
        (PROFILE_CACHE, "measurement cache"),
    ],
    ids=["space", "config", "profile-cache"],
)  # fmt: skip
def test_a_fifo_given_as_an_input_file_is_refused_at_once(tmp_path, command, what):
    """Opening a FIFO to read waits for a writer that never comes: run in a child process, bounded,
    so a regression fails the test instead of hanging it."""
    fifo = tmp_path / "input.toml"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-m", "archsearch", *command, str(fifo)], capture_output=True, text=True, timeout=60,
        env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"error: cannot read {what} {fifo}: not a regular file"


@pytest.mark.parametrize("kind", ["fifo", "folder"])
@pytest.mark.parametrize(
    "command", [["trials", "--study", "s"], ["search", "--space", "{space}", "--trials", "1"]]
)
def test_a_storage_path_that_is_not_a_file_says_what_it_is(tmp_path, kind, command):
    """A FIFO given as the SQLite database was 'no database at' it to a reader and 'disk I/O
    error' (exit 1, the environment's fault) to a search; a folder was SQLite's 'unable to open'."""
    space = tmp_path / "space.toml"
    space.write_text(TINY_TOML)
    path = tmp_path / "trials.db"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    args = [a.format(space=space) for a in command]
    result = CliRunner().invoke(app, [*args, "--storage", f"sqlite:///{path}"])
    what = "not a regular file" if kind == "fifo" else "a folder"
    assert one_line(result, 2) == f"error: {path} is {what}, not a SQLite database"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.toml", "trials.db"]


def test_a_folder_given_as_the_space_still_says_so(tmp_path):
    folder = tmp_path / "space.toml"
    folder.mkdir()
    result = CliRunner().invoke(app, ["space", "check", str(folder)])
    one_line(result, 2, "Is a directory")


# --- outputs onto a full disk -------------------------------------------------------------------------
OUTPUTS = {  # command, and the output's name
    "report": (["report", "--study", "s", "-o", "{out}"], "report.html"),
    "export": (["export", "--study", "s", "--trial", "0", "--format", "json", "-o", "{out}"], "export"),
    "trials-csv": (["trials", "--study", "s", "--format", "csv", "-o", "{out}"], "trials.csv"),
    "pareto-plot": (["pareto", "--study", "s", "--plot", "{out}"], "front.html"),
}


@pytest.mark.parametrize(("command", "name"), OUTPUTS.values(), ids=OUTPUTS.keys())
def test_an_output_onto_a_full_disk_is_one_line_naming_it_exit_1(study_url, small_disk, command, name):
    fill_disk(small_disk)
    out = small_disk / name
    result = CliRunner().invoke(app, [*(a.format(out=out) for a in command), "--storage", study_url])
    assert one_line(result, 1) == f"error: cannot use {out}: No space left on device"
    assert [p.name for p in small_disk.iterdir()] == ["filler"]  # no hidden scratch file or folder


FIFO_OUTPUTS = {  # each replaced the FIFO with a regular file, exit 0 (as root, /dev/full too)
    "report": ["report", "--study", "s", "-o", "{out}.html"],
    "trials-csv": ["trials", "--study", "s", "--format", "csv", "-o", "{out}.csv"],
    "pareto-plot": ["pareto", "--study", "s", "--plot", "{out}.png"],
    "config-new": ["config", "new", "--d-model", "64", "--n-layers", "2", "-o", "{out}.json"],
}


@pytest.mark.parametrize("command", FIFO_OUTPUTS.values(), ids=FIFO_OUTPUTS.keys())
def test_an_output_that_is_a_fifo_is_refused_and_left_as_it_was(study_url, tmp_path, command):
    out = tmp_path / "out"
    args = [a.format(out=out) for a in command]
    fifo = Path(args[-1])
    os.mkfifo(fifo)
    storage = ["--storage", study_url] if command[0] != "config" else []
    result = CliRunner().invoke(app, [*args, *storage])
    assert one_line(result, 2) == (
        f"error: cannot write {fifo}: not a regular file (a device, a FIFO or a socket), which the output "
        "would replace"
    )
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["trials.db", fifo.name])  # no scratch file


@pytest.mark.parametrize("command", FIFO_OUTPUTS.values(), ids=FIFO_OUTPUTS.keys())
def test_an_output_through_a_symlink_writes_the_file_it_points_to(study_url, tmp_path, command):
    """The rename that writes an output whole replaced the link itself, exit 0, and the
    file it pointed to kept its old contents."""
    args = [a.format(out=tmp_path / "out") for a in command]
    link = Path(args[-1])
    target = tmp_path / "kept" / f"real{link.suffix}"
    target.parent.mkdir()
    target.write_text("old")
    link.symlink_to(target)
    storage = ["--storage", study_url] if command[0] != "config" else []
    result = CliRunner().invoke(app, [*args, *storage])
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and link.resolve() == target
    assert target.read_bytes() != b"old"
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]  # no scratch file


@pytest.mark.parametrize("command", FIFO_OUTPUTS.values(), ids=FIFO_OUTPUTS.keys())
def test_a_loop_of_symlinks_as_an_output_is_one_line_and_left_as_it_was(study_url, tmp_path, command):
    """A link to a link back to it was replaced by a regular file, exit 0."""
    args = [a.format(out=tmp_path / "out") for a in command]
    link, other = Path(args[-1]), tmp_path / "other"
    link.symlink_to(other)
    other.symlink_to(link)
    storage = ["--storage", study_url] if command[0] != "config" else []
    result = CliRunner().invoke(app, [*args, *storage])
    assert one_line(result, 2) == f"error: cannot write {link}: a loop of symbolic links"
    assert link.is_symlink() and other.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["trials.db", link.name, "other"])


@pytest.mark.parametrize("command", FIFO_OUTPUTS.values(), ids=FIFO_OUTPUTS.keys())
def test_an_output_that_is_a_folder_is_one_line_exit_2(study_url, tmp_path, command):
    """`config new -o FOLDER` ran, then failed at the write with exit 1."""
    args = [a.format(out=tmp_path / "out") for a in command]
    folder = Path(args[-1])
    (folder / "kept").mkdir(parents=True)
    storage = ["--storage", study_url] if command[0] != "config" else []
    result = CliRunner().invoke(app, [*args, *storage])
    assert one_line(result, 2) == f"error: cannot write {folder}: it is a folder"
    assert [p.name for p in folder.iterdir()] == ["kept"]


# --- a memory limit -----------------------------------------------------------------------------------
def test_running_out_of_memory_outside_a_trial_is_one_line_exit_1(tmp_path, monkeypatch):
    """A `ulimit -v` hit while a command imports torch or builds a shape raises MemoryError there."""
    import archsearch.search.spec as spec_module

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(spec_module, "parse_spec", no_memory)
    space = tmp_path / "space.toml"
    space.write_text(TINY_TOML)
    result = CliRunner().invoke(app, ["space", "check", str(space)])
    one_line(result, 1, "out of memory", "ulimit -v")


def test_a_fifo_given_as_the_data_is_refused_for_what_it_is(tmp_path):
    """It was reported as "data file is empty" (its size is 0), which sent the user looking for
    a missing file's contents."""
    from archsearch.evaluators.data import DataError, load_dataset

    fifo = tmp_path / "corpus.txt"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match=f"^data path {fifo} is neither a file nor a folder$"):
        load_dataset(str(fifo), vocab_size=256)


@pytest.mark.parametrize("kind", ["loop", "no-such-user"])
def test_a_data_path_that_cannot_be_resolved_is_one_line(tmp_path, kind):
    """`[proxy] data` naming a loop of symlinks, or `~user` of no user, was Path.resolve's
    RuntimeError traceback in `space check` and `search`."""
    if kind == "loop":
        (tmp_path / "a").symlink_to(tmp_path / "b")
        (tmp_path / "b").symlink_to(tmp_path / "a")
        data, why = str(tmp_path / "a"), f"Symlink loop from '{tmp_path / 'a'}'"
    else:
        data, why = "~no-such-user-of-archsearch/corpus.txt", "Could not determine home directory."
    space = tmp_path / "space.toml"
    space.write_text(TINY_TOML.replace("[proxy]\n", f'[proxy]\ndata = "{data}"\n', 1))
    result = CliRunner().invoke(app, ["space", "check", str(space)])
    assert one_line(result, 2) == f"error: {space}: [proxy].data: cannot resolve {quoted(data)}: {why}"


@pytest.mark.parametrize(
    ("error", "out_of_memory"),
    [
        (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                      "memory: you tried to allocate 6400000064 bytes. Error code 12"), True),
        (RuntimeError("a bug's own error"), False),
    ],
    ids=["torch-allocator", "another-runtime-error"],
)  # fmt: skip
def test_torch_running_out_of_memory_is_the_same_one_line(tmp_path, monkeypatch, error, out_of_memory):
    """`profile --serve --device cpu --context 100000000` under `ulimit -v 6000000`: torch's CPU
    allocator raises a RuntimeError, not MemoryError, and it ended in a traceback.
    Any other RuntimeError is a bug and keeps its traceback."""
    import archsearch.evaluators.serve_profiler as serve_profiler
    from archsearch.space import preset

    def measure_serve(*args, **kwargs):
        raise error

    monkeypatch.setattr(serve_profiler, "measure_serve", measure_serve)
    config = tmp_path / "cfg.json"
    config.write_text(preset("gpt2-small").to_json())
    result = CliRunner().invoke(app, ["profile", str(config), "--serve", "--device", "cpu"])
    if out_of_memory:
        one_line(result, 1, "out of memory", "ulimit -v", "smaller shape, batch or context")
    else:
        assert result.exit_code == 1 and result.exception is error
