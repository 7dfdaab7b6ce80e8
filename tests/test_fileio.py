from __future__ import annotations

import os

import pytest

from archsearch.fileio import _umask, write_atomic


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
