"""What every command shares: the Typer apps, the options defined once, output helpers.

Data goes to stdout (a table, or JSON with `--json`), messages to stderr. A user error (an
`ArchsearchError`) becomes one line, `error: ...`, and exit code 2; a failure of the environment
(`EnvironmentFailure`, or an `OSError` such as an output path that cannot be written) one line and
exit code 1 (so does running out of memory); Ctrl-C one line and 130. A bug keeps its traceback.
"""

from __future__ import annotations

import errno
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from archsearch.errors import ArchsearchError, ConfigError, Terminated, error_line, quoted
from archsearch.fileio import names_no_path
from archsearch.space import ArchConfig, load_config, preset
from archsearch.units import format_si

EXIT_USAGE = 2  # Click's code for bad usage; archsearch uses it for every bad input
EXIT_ENVIRONMENT = 1  # a failure of what the command depends on (`errors.EnvironmentFailure`)
EXIT_SIGINT = 130  # 128 + SIGINT, as shells report a process Ctrl-C stopped
EXIT_SIGTERM = 143  # 128 + SIGTERM
OUT_OF_MEMORY = (
    "out of memory: this process hit its memory limit (the machine's or GPU's, ulimit -v, a "
    "container's); raise it or use a smaller shape, batch or context"
)
# How the dynamic loader says a library did not fit the address space (ImportError's text):
# `profile` under `ulimit -v 500000` ended in a traceback importing torch (issue 26 probe 6).
_MAP_FAILURES = ("failed to map segment from shared object", "Cannot allocate memory")
# Click's usage error class, from the Click that Typer runs: recent Typers vendor a copy whose
# classes are not `click`'s. The public typer.BadParameter derives from it in both cases.
_USAGE_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def _allocation_failure(exc: BaseException) -> bool:
    """Python's MemoryError, or torch's allocation failure, a RuntimeError (the CPU allocator's
    "can't allocate memory", CUDA's OutOfMemoryError): `profile --serve --context 100000000` on the
    CPU under `ulimit -v` ended in torch's traceback. Only torch raises those, so only once it is
    loaded is `evaluators.device` (which imports it) asked."""
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, ImportError):  # a shared library that cannot be mapped: torch under `ulimit -v`
        return any(text in str(exc) for text in _MAP_FAILURES)
    if "torch" not in sys.modules:
        return False
    from archsearch.evaluators.device import is_memory_error

    return is_memory_error(exc)


def os_error_text(exc: OSError) -> str:
    """An `OSError` as `cannot use PATH: Permission denied`, the file named when known."""
    what = exc.strerror or type(exc).__name__
    paths = [p for p in (exc.filename, exc.filename2) if p is not None]
    if paths:
        return f"cannot use {' -> '.join(map(str, paths))}: {what}"
    # No file named: a write to stdout (`> /dev/full`) said "No space left on device: [Errno 28]
    # No space left on device".
    return what if exc.strerror else f"{what}: {exc}"


def interrupted(exc: KeyboardInterrupt, again: str | None = None) -> int:
    """Says which signal stopped the command, in one line on stderr (with `again`, the command that
    continues its work); returns its exit code.

    Read by the command boundary (`_Group.invoke`), by `cli.main` around it, for a signal while
    Typer builds the command line from the signatures, before any command runs, and by `search`
    for a second signal that cut its clean-up short.
    """
    terminated = isinstance(exc, Terminated)
    then = f"; continue with `{again}`" if again else ""
    typer.echo(f"error: interrupted by {'SIGTERM' if terminated else 'SIGINT'}{then}", err=True)
    return EXIT_SIGTERM if terminated else EXIT_SIGINT


def usage_error_line(exc: Exception) -> str:
    """Click's usage error as the one line archsearch prints, whatever Click wraps."""
    return "error: " + " ".join(exc.format_message().split()) + " (see --help)"  # type: ignore[attr-defined]


class _Group(TyperGroup):
    """Turns library errors into one line on stderr and exit code 2, at the command boundary.

    Click's usage errors in a command's arguments (a bad value, an unknown flag or command) are
    raised here too, while the command's arguments are parsed: they get the same one line instead
    of Click's usage box; so do those before the command name (`parse_args`).
    """

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        # Before the command boundary: Typer's own handler turned a signal while the arguments were
        # parsed into a silent exit 130, SIGTERM too (probe 10).
        try:
            return super().make_context(info_name, args, parent, **extra)
        except KeyboardInterrupt as exc:
            raise typer.Exit(interrupted(exc)) from None

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except _USAGE_ERROR as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # no arguments: the help, not an error
                raise
            typer.echo(usage_error_line(exc), err=True)
            raise typer.Exit(EXIT_USAGE) from None

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return self._invoke(ctx)
        finally:
            # The command has ended: a signal in Click's teardown replaced its exit (0, or the code
            # just chosen) with a KeyboardInterrupt traceback and death by SIGINT (-2), a race the
            # suite met under load. Only the console script sets it: in-process callers keep theirs.
            if on_command_end is not None and ctx.parent is None:
                on_command_end()

    def _invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ArchsearchError as exc:
            typer.echo(error_line(str(exc)), err=True)
            raise typer.Exit(exc.exit_code) from None
        except _USAGE_ERROR as exc:
            typer.echo(usage_error_line(exc), err=True)
            raise typer.Exit(EXIT_USAGE) from None
        except OSError as exc:  # an output path that cannot be written, a full disk
            typer.echo(error_line(os_error_text(exc)), err=True)
            # A name longer than the file system takes is the input's fault, not the environment's.
            raise typer.Exit(EXIT_USAGE if exc.errno == errno.ENAMETOOLONG else EXIT_ENVIRONMENT) from None
        # A memory limit hit outside a trial, even on import (a library the loader could not map).
        except (MemoryError, RuntimeError, ImportError) as exc:
            if not _allocation_failure(exc):
                raise
            typer.echo(error_line(OUT_OF_MEMORY), err=True)  # the frames that held the memory are gone
            raise typer.Exit(EXIT_ENVIRONMENT) from None
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (`errors.Terminated`) before a search runs
            raise typer.Exit(interrupted(exc)) from None


# What the console script (`cli.main`) has the boundary call once a command has ended; None in
# process (tests' CliRunner, a notebook).
on_command_end: Callable[[], None] | None = None

app = typer.Typer(
    cls=_Group,
    help="Hardware-aware architecture search for transformer language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
config_app = typer.Typer(cls=_Group, help="Write and check ArchConfig JSON files.", no_args_is_help=True)
app.add_typer(config_app, name="config")
space_app = typer.Typer(cls=_Group, help="Check search-space files.", no_args_is_help=True)
app.add_typer(space_app, name="space")


def path_value(text: str) -> Path:
    """A path option's text as a Path; text that names nothing (`fileio.names_no_path`) is refused."""
    if names_no_path(text):
        raise typer.BadParameter(f"must name a file or folder, got {quoted(text)}")
    return Path(text)


# Options shared by several commands, defined once.
JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")]
ConfigArg = Annotated[
    Path | None,
    typer.Argument(
        help="ArchConfig JSON file, or the archsearch.json of `export --format json`.", parser=path_value
    ),
]
PresetOpt = Annotated[str | None, typer.Option("--preset", help="A built-in shape (see `presets`).")]
SpaceArg = Annotated[Path, typer.Argument(help="Search-space TOML file (see examples/).", parser=path_value)]
StorageOpt = Annotated[
    str | None,
    typer.Option(
        "--storage", help="Database URL (default: $ARCHSEARCH_STORAGE, else sqlite:///archsearch.db)."
    ),
]
StudyOpt = Annotated[str, typer.Option(help="Study name (see `studies`).")]
# A complete trial's shape instead of CONFIG or --preset (`resolve_shape`).
FromStudyOpt = Annotated[
    str | None, typer.Option("--study", help="Take the shape of --trial N of this study (see `trials`).")
]
FromTrialOpt = Annotated[int | None, typer.Option("--trial", help="Trial number in --study.", min=0)]
# `train` and `profile` choose a CPU step's threads by one rule (`trainer.step_threads`).
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        help="CPU threads of the step (default: chosen from the shape's micro-batch and the free cores, "
        "the same rule for train and profile)."
    ),
]


def stdout() -> Console:
    # Piped output gets a wide fixed width instead of rich's 80 columns, so rows do not wrap.
    console = Console(highlight=False)
    return console if console.is_terminal else Console(highlight=False, width=160)


def finite_json(obj: Any) -> Any:
    """`obj` with every non-finite float (NaN, +-inf) as None: JSON has no NaN or Infinity, and
    `json.dumps` wrote them as tokens strict parsers refuse (`pareto --json` printed
    `"hypervolume": Infinity`)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def print_json(obj: Any) -> None:
    """`obj` as strict JSON on stdout: a non-finite number is null (`finite_json`)."""
    typer.echo(json.dumps(finite_json(obj), indent=2, allow_nan=False))


def si(value: float, unit: str = "") -> str:
    """`124439808` -> `124.4M`: short magnitudes for tables (JSON is exact)."""
    return format_si(value, unit)


def fmt_value(value: float | None, spec: str) -> str:
    """`value` formatted, or `-` when there is none."""
    return "-" if value is None else format(value, spec)


def threads_text(used: int | None, asked: int | None) -> str:
    """What a CPU step ran on, `2 threads (chosen from the shape and the free cores)` or `4 threads
    (--threads)`; `-` off the CPU (None: the GPU runs the step)."""
    if used is None:
        return "-"
    how = "--threads" if asked is not None else "chosen from the shape and the free cores"
    return f"{used} thread{'s' if used != 1 else ''} ({how})"


def floats(text: str, option: str) -> tuple[float, ...]:
    """ "3.0,1e9" -> (3.0, 1e9), or a one-line error naming `option`: finite numbers only (float()
    reads "nan" and "inf", and a NaN reference point gave a hypervolume of 0 and exit 0)."""
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not values or not all(math.isfinite(v) for v in values):
        raise ConfigError(f"{option} takes finite numbers separated by commas, got {quoted(text)}")
    return values


def long_cell(entry: tuple[float, float, int] | None) -> str:
    """`3.1234 (10x)` or `3.1234 (10x, 3 seeds)`: a trial's long-run loss where one exists."""
    if entry is None:
        return "-"
    multiplier, loss, seeds = entry
    return f"{loss:.4f} ({multiplier:g}x{f', {seeds} seeds' if seeds > 1 else ''})"


def note_if_unfit(cfg: ArchConfig, device: str, batch: int) -> None:
    """On stderr, where a catalogued GPU's training step is modelled for a batch its memory could
    not hold (`evaluators.trainer.train_memory_bytes`: weights, gradients, Adam, activations): the
    figures are still printed, as if it fitted, which a sharded or recomputing run may make true."""
    from archsearch.evaluators.catalogue import ACCELERATORS
    from archsearch.evaluators.trainer import train_memory_bytes

    have = ACCELERATORS[device].memory_bytes if device in ACCELERATORS else 0
    need = train_memory_bytes(cfg, batch, cfg.seq_len)
    if have and need > have:
        typer.echo(
            f"note: batch {batch:,} x {cfg.seq_len} needs about {si(need, 'B')} to train without sharding "
            f"or recomputation; {device} has {si(have, 'B')}: modelled as if it fitted",
            err=True,
        )


def resolve_config(path: Path | None, preset_name: str | None) -> ArchConfig:
    """The shape a command runs on: a config file or a preset, exactly one."""
    if (path is None) == (preset_name is None):
        raise ConfigError("give a CONFIG file or --preset NAME (exactly one)")
    return load_config(path) if path is not None else preset(preset_name)  # type: ignore[arg-type]


def resolve_shape(
    path: Path | None, preset_name: str | None, study: str | None, trial: int | None, storage: str | None
) -> ArchConfig:
    """`resolve_config` for the commands that also take a complete trial's shape (`--study S
    --trial N`, read from `--storage`): exactly one of the three."""
    if (study is None) != (trial is None):
        raise ConfigError("--study S and --trial N go together")
    if storage is not None and study is None:
        raise ConfigError("--storage is where --study S --trial N is read from: give those too")
    if sum(x is not None for x in (path, preset_name, study)) != 1:
        raise ConfigError("give a CONFIG file, --preset NAME or --study S --trial N (exactly one)")
    if study is None:
        return resolve_config(path, preset_name)
    from archsearch.search.selection import trial_config
    from archsearch.storage import Storage

    with Storage.open(storage, read_only=True) as db:
        return trial_config(db, study, trial)  # type: ignore[arg-type]
