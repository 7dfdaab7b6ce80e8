"""Make a file or folder read-only for this process, also when the tests run as root.

`chmod` alone stops every user but root: root's CAP_DAC_OVERRIDE ignores permission bits, and
containers and CI often run tests as root. So when the path is still writable after `chmod`,
it is made immutable (`chattr +i`), which root's writes obey too; that needs
CAP_LINUX_IMMUTABLE and a file system with the attribute (ext4, xfs, btrfs; not tmpfs or
overlayfs), else the test is skipped and says why. Other ways were weighed and dropped:
SQLite's `?mode=ro` URL makes the *connection* read-only, which is the application's choice, not
the file's; a read-only bind mount needs mount privileges a test cannot assume; and dropping
CAP_DAC_OVERRIDE (`setpriv --bounding-set=-dac_override`) works only for a child process, not for
in-process `CliRunner` tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[str]:
    """`path` (a file or a folder) read-only inside the block; yields how ("chmod" or "chattr")."""
    mode = path.stat().st_mode
    path.chmod(0o555 if path.is_dir() else 0o444)
    immutable = False
    try:
        if os.access(path, os.W_OK):  # root: permission bits do not apply
            chattr = shutil.which("chattr")
            if chattr is None:
                pytest.skip(f"running as root, and no chattr to make {path.name} immutable")
            done = subprocess.run([chattr, "+i", str(path)], capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"running as root, and chattr +i {path.name} failed: {done.stderr.strip()}")
            immutable = True
            assert not os.access(path, os.W_OK)
        yield "chattr" if immutable else "chmod"
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(mode)


def as_an_ordinary_user() -> list[str]:
    """A command prefix under which permission bits apply, for a child process: none for an
    ordinary user; for root, `setpriv` dropping the capabilities that override them (the child
    stays root, so it can still read this checkout and Python). Skips when that is unavailable."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    drop = [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner"] if setpriv else []
    if not drop or subprocess.run([*drop, "true"], capture_output=True).returncode != 0:
        pytest.skip("running as root, and setpriv cannot drop CAP_DAC_OVERRIDE for a child process")
    return drop  # type: ignore[return-value]
