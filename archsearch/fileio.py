"""Small file helpers shared by the library."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from archsearch.errors import HUGE_INTEGER, quoted


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write `path` whole or not at all: a unique temporary file in the same folder, then a rename.

    A crash or a concurrent writer never leaves a half-written file; the last rename wins.

    Raises:
        ArchsearchError: `path` is there and is not a regular file (`check_special`).
        OSError: `path` cannot be written (a full disk, a read-only folder), named in the error:
            the write of the hidden temporary file names no file, and the CLI prints the name.
    """
    path = Path(path)
    check_special(path)
    # A link is written through, as `>` writes: the rename would replace the link itself and
    # leave the file it points to as it was, and `trials -o link.csv` would say it wrote it.
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise named(exc, path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # mkstemp makes the file private (0600); give it the mode a plain open() would.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise named(exc, path) from None
        raise


def named(exc: OSError, path: str | Path) -> OSError:
    """`exc` as the same kind of error naming `path`, the file being written, rather than the
    hidden scratch file behind it (or none): `cannot use PATH: No space left on device`."""
    return type(exc)(exc.errno, exc.strerror or str(exc), str(path)) if exc.errno else exc


def check_special(path: str | Path) -> None:
    """Refuse an output that is there and is not a regular file (or a link to one): a device, a
    FIFO, a socket. The rename that writes an output whole would replace it: `trials -o /dev/full`
    put a CSV file where the device was (as root, the device node itself is gone).

    Raises:
        ArchsearchError: one line naming the path.
    """
    from archsearch.errors import ArchsearchError

    try:
        mode = os.stat(path).st_mode  # a link is followed: a link to a regular file is written
    except OSError as exc:  # absent (or a dangling link): the write makes it, or names why not
        if exc.errno == errno.ELOOP:  # links that lead to each other: nothing to write through
            raise ArchsearchError(f"cannot write {path}: a loop of symbolic links") from None
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # a folder is check_writable's to name
        raise ArchsearchError(
            f"cannot write {path}: not a regular file (a device, a FIFO or a socket), which the output "
            "would replace"
        )


def names_no_path(text: str) -> bool:
    """Whether a path's text names nothing: empty, only spaces, or holding a NUL. `Path("")` is the
    working folder, so `train --data ''` and `[proxy] data = ""` read whatever lay there."""
    return not text.strip() or "\x00" in text


def check_writable(
    path: str | Path, *, folder: bool = False, inputs: Mapping[Path, str] | None = None
) -> None:
    """Refuse, before any work is spent, an output path that cannot be written: a file that is an
    existing folder, a path below a regular file, one whose nearest existing folder this process
    may not write (the folders below it are made when written), or one of the command's `inputs`
    (a file, and what to call it: `trials --format csv -o trials.db` replaced the database it read
    with the CSV).

    Raises:
        ArchsearchError: one line naming the path and why.
    """
    from archsearch.errors import ArchsearchError

    for other, what in (inputs or {}).items():
        if _same_file(path, other):
            raise ArchsearchError(f"cannot write {path}: it is {what}, which this command reads")
    path = Path(path).absolute()
    check_special(path)
    if not folder and path.is_dir():
        raise ArchsearchError(f"cannot write {path}: it is a folder")
    parent = path.parent
    while not parent.exists():  # False too below a regular file (ENOTDIR)
        parent = parent.parent
    if not parent.is_dir():
        raise ArchsearchError(f"cannot write {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):  # an immutable folder refuses root too
        raise ArchsearchError(f"cannot write {path}: the folder {parent} is not writable here")
    try:  # /proc grants root write access and takes no new file: the write then said "No such file"
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise ArchsearchError(
            f"cannot write {path}: the folder {parent} takes no new files ({exc.strerror or exc})"
        ) from None


def _same_file(a: str | Path, b: str | Path) -> bool:
    """Whether paths `a` and `b` name one file: the same inode where both exist (hard links, other
    spellings), else the same path once symlinks are resolved."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def write_tree(output: str | Path, tree: dict[str, bytes]) -> None:
    """All of `tree` (relative path -> bytes) under the folder `output`, or nothing.

    The files go into a hidden sibling folder, each with `write_atomic`, and the folder is renamed
    onto `output` at the end: `output` must be absent or an empty folder.

    Raises:
        ArchsearchError: `output` is taken (a file, a folder with files in it), naming it.
        OSError: the files cannot be written (a full disk), naming `output`.
        Either way nothing is left behind.
    """
    from archsearch.errors import ArchsearchError

    output = Path(output).absolute()
    output.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{output.name}."
    sweep_orphans(output.parent, prefix)  # a staging folder of a killed writer (SIGTERM, SIGKILL)
    staging = Path(tempfile.mkdtemp(prefix=owned(prefix), suffix=".tmp", dir=output.parent))
    try:
        try:
            for name, data in tree.items():
                write_atomic(staging / name, data)
            os.chmod(staging, 0o777 & ~_umask())  # mkdtemp's folder is private (0700); the tree is not
        except OSError as exc:  # the environment's failure (exit 1), not the path's
            raise named(exc, output) from None
        try:
            os.replace(staging, output)  # rename(2) onto an absent or empty folder
        except OSError as exc:
            raise ArchsearchError(f"cannot write {output}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def owned(prefix: str) -> str:
    """`prefix` followed by this process's id: the name of a scratch file or folder that
    `sweep_orphans` removes once the process that made it is gone."""
    return f"{prefix}{os.getpid()}-"


def sweep_orphans(folder: str | Path, prefix: str) -> int:
    """Remove the entries of `folder` named `owned(prefix)` by processes that no longer exist.

    A process killed by a signal it cannot catch (SIGKILL from the OOM killer, say) never runs its
    cleanup, so its scratch stays; the next writer of the same kind clears it. Entries of live
    processes (a concurrent writer), of this process, and names without a process id are kept.

    Returns:
        How many entries were removed.
    """
    removed = 0
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        pid_text = entry.name[len(prefix) :].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid() or _alive(int(pid_text)):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
        removed += not entry.exists()
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process (or no such process id)
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _umask() -> int:
    """The process umask, read without changing it where Linux shows it (os.umask can only be
    read by setting it, which races with other threads creating files)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def read_text(path: Path, what: str, error: type[Exception]) -> str:
    """A UTF-8 file's text, or `error` with one line naming `what` and the path.

    Args:
        path: the file.
        what: how messages name it, e.g. "config file" or "search spec".
        error: the exception type raised (the caller's own, e.g. ConfigError).
    """
    try:
        if not stat.S_ISREG(path.stat().st_mode) and not path.is_dir():
            # A FIFO or a device: opening one to read waits for a writer, without end.
            raise error(f"cannot read {what} {path}: not a regular file")
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {what} {path}: {exc}") from None


class _DuplicateKey(ValueError):
    """A JSON object that names a key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict, refusing a key given twice: `json` keeps the last silently, so
    `{"d_ff": 384, "d_ff": 512}` passed `config check` as 512 (a space file's TOML refuses it)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def parse_json(text: str, source: str, error: type[Exception], kind: str, hint: str = "") -> Any:
    """JSON text as Python data, or `error` with one line: where (`source`), why, then `hint`.

    The one reader of JSON that users give or that lies on disk (configs, recorded runs, caches):
    a syntax error names its line and column, a key given twice the key; text nested past the
    decoder's recursion (`[` x 100,000) is not `kind` ("a config"); an integer of more than 4,300
    digits, which Python refuses to convert, is said as such. Left to `json`, each would be a
    traceback or a silent choice.
    """
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        why = f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
    except _DuplicateKey as exc:
        why = f"invalid JSON: the key {quoted(exc.args[0])} is given twice"
    except RecursionError:
        why = f"invalid JSON: nested too deeply to be {kind}"
    except ValueError:
        why = f"invalid JSON: {HUGE_INTEGER}"
    raise error(f"{source}: {why}{hint}") from None


def read_json(path: Path, what: str, error: type[Exception], kind: str, hint: str = "") -> Any:
    """A JSON file's data (`read_text`, then `parse_json` naming the file as `what PATH`)."""
    return parse_json(read_text(path, what, error), f"{what} {path}", error, kind, hint)
