from __future__ import annotations

import os

import pytest

from archsearch.errors import ArchsearchError
from archsearch.fileio import _umask, write_atomic, write_tree


def test_write_atomic_gives_the_mode_a_plain_open_would(tmp_path):
    plain = tmp_path / "plain"
    plain.write_bytes(b"x")
    write_atomic(tmp_path / "atomic", b"data")
    assert (tmp_path / "atomic").read_bytes() == b"data"
    assert (tmp_path / "atomic").stat().st_mode & 0o777 == plain.stat().st_mode & 0o777
    assert sorted(p.name for p in tmp_path.iterdir()) == ["atomic", "plain"]  # no temporary left


def test_the_umask_is_read_without_being_changed():
    before = os.umask(0o027)
    try:
        assert _umask() == 0o027
        assert os.umask(0o027) == 0o027  # still what was set
    finally:
        os.umask(before)


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    def broken(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(tmp_path / "f", b"data")
    assert list(tmp_path.iterdir()) == []


def test_write_tree_writes_every_file_with_plain_modes(tmp_path):
    plain = tmp_path / "plain-dir"
    plain.mkdir()
    write_tree(tmp_path / "out", {"a.json": b"{}", "sub/b.txt": b"b"})
    out = tmp_path / "out"
    assert (out / "a.json").read_bytes() == b"{}" and (out / "sub" / "b.txt").read_bytes() == b"b"
    assert out.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777  # not mkdtemp's private 0700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "plain-dir"]  # no staging folder


@pytest.mark.parametrize("occupied", ["file", "non-empty-folder"])
def test_write_tree_onto_something_there_fails_and_leaves_it_alone(tmp_path, occupied):
    out = tmp_path / "out"
    if occupied == "file":
        out.write_bytes(b"keep")
    else:
        out.mkdir()
        (out / "keep").write_bytes(b"keep")
    with pytest.raises(ArchsearchError, match=f"cannot write {out}"):
        write_tree(out, {"a": b"new"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (out.read_bytes() if occupied == "file" else (out / "keep").read_bytes()) == b"keep"


def test_write_tree_leaves_nothing_when_a_file_fails(tmp_path, monkeypatch):
    import archsearch.fileio as fileio

    real = fileio.write_atomic

    def second_fails(path, data):
        if path.name == "b":
            raise KeyboardInterrupt
        real(path, data)

    monkeypatch.setattr(fileio, "write_atomic", second_fails)
    with pytest.raises(KeyboardInterrupt):
        write_tree(tmp_path / "out", {"a": b"1", "b": b"2"})
    assert list(tmp_path.iterdir()) == []


def _reaped() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_writers_staging_is_swept_by_the_next_write_tree(tmp_path):
    import signal
    import subprocess
    import sys

    # A writer SIGKILLed while its staging folder exists (what the OOM killer or a second Ctrl-C
    # does: no cleanup runs), waited for by state: it says when the folder is there.
    script = (
        "import sys, tempfile, time\n"
        "from archsearch.fileio import owned\n"
        f"d = tempfile.mkdtemp(prefix=owned('.out.'), suffix='.tmp', dir={str(tmp_path)!r})\n"
        "open(d + '/config.json', 'w').write('{}')\n"
        "print(d, flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    staging = proc.stdout.readline().strip()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert os.path.isdir(staging)
    live = tmp_path / f".out.{os.getpid()}-abc.tmp"  # this process's: a concurrent write of its own
    live.mkdir()
    other = tmp_path / ".out.notapid.tmp"  # no process id in the name: never ours to remove
    other.mkdir()
    write_tree(tmp_path / "out", {"config.json": b"{}"})
    assert not os.path.exists(staging)
    assert live.exists() and other.exists() and (tmp_path / "out" / "config.json").exists()


def test_sweep_orphans_removes_only_the_dead_processes_entries(tmp_path):
    from archsearch.fileio import sweep_orphans

    dead = _reaped()
    (tmp_path / f".build-{dead}-x").mkdir()
    (tmp_path / f".build-{dead}-y.part").write_bytes(b"x")
    (tmp_path / f".build-{os.getppid()}-z").mkdir()  # the parent (pytest's runner) is alive
    (tmp_path / f".other-{dead}-w").mkdir()
    assert sweep_orphans(tmp_path, ".build-") == 2
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([f".build-{os.getppid()}-z", f".other-{dead}-w"])
    assert sweep_orphans(tmp_path / "absent", ".build-") == 0
