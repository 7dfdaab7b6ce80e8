"""What every command shares: the Typer apps, the options defined once, output helpers.

Data goes to stdout (a table, or JSON with `--json`), messages to stderr; every error is one line
and an exit code, chosen at the command boundary (`cli.boundary`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from archsearch.cli.boundary import CommandGroup
from archsearch.errors import ConfigError, quoted
from archsearch.fileio import names_no_path
from archsearch.space import ArchConfig, load_config, preset
from archsearch.units import format_si

app = typer.Typer(
    cls=CommandGroup,
    help="Hardware-aware architecture search for transformer language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
config_app = typer.Typer(
    cls=CommandGroup, help="Write and check ArchConfig JSON files.", no_args_is_help=True
)


def _print_version(value: bool) -> None:
    if value:
        from archsearch.version import __version__

        typer.echo(f"archsearch {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print archsearch's version and exit.", callback=_print_version, is_eager=True
        ),
    ] = False,
) -> None:
    pass


app.add_typer(config_app, name="config")
space_app = typer.Typer(cls=CommandGroup, help="Check search-space files.", no_args_is_help=True)
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
