"""Ray's own messages (its log records and the errors it publishes to the driver) sent to a file,
so a local search, validate or ladder prints only archsearch's lines on the user's terminal."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Where Ray's own log records go (appended), so a local search prints only archsearch's lines.
RAY_LOG = Path(tempfile.gettempdir()) / "archsearch" / "ray.log"


class _RayRecordsToFile(logging.Handler):
    """Python's last-resort log handler, but with the `ray` loggers' records sent to a file.

    `ray.init(configure_logging=False)` clears the `ray` logger's handlers, so Ray's warnings (its
    token-authentication notice, worker warnings) reach stderr through `logging.lastResort`; this
    stands in for it, leaving every other logger's records where they went.
    """

    def __init__(self, path: Path, fallback: logging.Handler | None) -> None:
        super().__init__(logging.WARNING)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = logging.FileHandler(path, delay=True)  # the file appears once Ray says something
        self.file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.fallback = fallback

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "ray" or record.name.startswith("ray."):
            self.file.handle(record)
        elif self.fallback is not None:
            self.fallback.handle(record)

    def close(self) -> None:
        self.file.close()
        super().close()


@contextmanager
def ray_logs_to(path: Path) -> Iterator[None]:
    """Ray's log records go to `path` (appended) instead of stderr while inside."""
    fallback = logging.lastResort
    handler = _RayRecordsToFile(path, fallback)
    logging.lastResort = handler
    try:
        yield
    finally:
        logging.lastResort = fallback
        handler.close()


@contextmanager
def ray_errors_to(ray: Any, path: Path) -> Iterator[None]:
    """The errors Ray publishes to the driver (a raylet's death with its log's tail, a monitor's
    traceback), which Ray's error thread prints to stdout whatever `log_to_driver` says, are
    appended to `path` instead (`ray._private.worker.print_to_stdstream`, where this Ray has it).

    For as long as Ray stays connected: after a node's death the driver skips Ray's shutdown
    (`pool.RayPool.__exit__`), and the thread lives on until the process ends.
    """
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    original = getattr(worker, "print_to_stdstream", None)
    if original is None:
        yield
        return

    def to_file(data: dict[str, Any], ignore_prefix: bool = False) -> None:
        with open(path, "a") as handle:
            handle.writelines(f"({data.get('pid')}) {line}\n" for line in data.get("lines", ()))

    worker.print_to_stdstream = to_file
    try:
        yield
    finally:
        if not ray.is_initialized():
            worker.print_to_stdstream = original
