"""The `archsearch` command line: a thin layer over the library.

Data goes to stdout (a table, or JSON with `--json`), messages to stderr. A user error (an
`ArchsearchError`) becomes one line, `error: ...`, and exit code 2; a bug keeps its traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from archsearch.errors import ArchsearchError, ConfigError
from archsearch.space import (
    PRESETS,
    ArchConfig,
    cost_report,
    load_config,
    param_counts,
    preset,
    relu_feature_loss,
    save_config,
)
from archsearch.space.knobs import DEFAULT_MULTIPLE_OF, config_from_knobs
from archsearch.space.width import gated_d_ff

EXIT_USAGE = 2  # Click's code for bad usage; archsearch uses it for every bad input
# Click's usage error class, from the Click that Typer runs: recent Typers vendor a copy whose
# classes are not `click`'s. The public typer.BadParameter derives from it in both cases.
_USAGE_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


class _Group(TyperGroup):
    """Turns library errors into one line on stderr and exit code 2, at the command boundary.

    Click's usage errors in a command's arguments (a bad value, an unknown flag or command) are
    raised here too, while the command's arguments are parsed: they get the same one line instead
    of Click's usage box. An unknown flag before the command name is parsed earlier and keeps it.
    """

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ArchsearchError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(EXIT_USAGE) from None
        except _USAGE_ERROR as exc:
            message = " ".join(exc.format_message().split())  # one line, whatever Click wraps
            typer.echo(f"error: {message} (see --help)", err=True)
            raise typer.Exit(EXIT_USAGE) from None


app = typer.Typer(
    cls=_Group,
    help="Hardware-aware architecture search for transformer language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
config_app = typer.Typer(cls=_Group, help="Write and check ArchConfig JSON files.", no_args_is_help=True)
app.add_typer(config_app, name="config")

# Options shared by several commands, defined once.
JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")]
ConfigArg = Annotated[Path | None, typer.Argument(help="ArchConfig JSON file.")]
PresetOpt = Annotated[str | None, typer.Option("--preset", help="A built-in shape (see `presets`).")]


def _stdout() -> Console:
    # Piped output gets a wide fixed width instead of rich's 80 columns, so rows do not wrap.
    console = Console(highlight=False)
    return console if console.is_terminal else Console(highlight=False, width=160)


def _print_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2))


def _si(value: float, unit: str = "") -> str:
    """`124439808` -> `124.4M`, `0.00034` -> `340u`: short magnitudes for tables (JSON is exact)."""
    prefixes = (
        (1e15, "P"),
        (1e12, "T"),
        (1e9, "G"),
        (1e6, "M"),
        (1e3, "k"),
        (1, ""),
        (1e-3, "m"),
        (1e-6, "u"),
    )
    for factor, prefix in prefixes:
        if abs(value) >= factor:
            return f"{value / factor:.4g}{prefix}{unit}"
    return f"{value:.4g}{unit}"


def _resolve_config(path: Path | None, preset_name: str | None) -> ArchConfig:
    if (path is None) == (preset_name is None):
        raise ConfigError("give a CONFIG file or --preset NAME (exactly one)")
    return load_config(path) if path is not None else preset(preset_name)  # type: ignore[arg-type]


@app.command()
def cost(
    config: ConfigArg = None,
    preset_name: PresetOpt = None,
    dtype: Annotated[str, typer.Option(help="Dtype for weight and KV-cache bytes.")] = "bf16",
    as_json: JsonFlag = False,
) -> None:
    """Exact parameters, FLOPs per token and memory of one shape."""
    cfg = _resolve_config(config, preset_name)
    report = cost_report(cfg, dtype)
    if as_json:
        _print_json({"config": cfg.to_dict(), **report})
        return
    table = Table()
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_column("exact", justify="right")
    rows = [
        ("params total", "params_total", ""),
        ("  non-embedding", "params_non_embedding", ""),
        ("  embedding", "params_embedding", ""),
        ("  attention", "params_attention", ""),
        ("  mlp", "params_mlp", ""),
        ("  norms", "params_norms", ""),
        ("  lm head (untied)", "params_head", ""),
        ("forward / token", "flops_forward_per_token", "FLOP"),
        ("  causal", "flops_forward_per_token_causal", "FLOP"),
        ("train / token (3x fwd)", "flops_train_per_token", "FLOP"),
        (f"weights ({dtype})", "weight_bytes", "B"),
        (f"kv cache / token ({dtype})", "kv_cache_bytes_per_token", "B"),
    ]
    for label, key, unit in rows:
        table.add_row(label, _si(report[key], unit), f"{report[key]:,}")
    risk = report["relu_feature_loss_log10"]
    if risk is not None:
        table.add_row("relu feature loss log10 P(K<n)", f"{risk:.4g}", "")
    console = _stdout()
    console.print(cfg.describe())
    console.print(table)
    console.print(f"conventions: {report['conventions']}")


@app.command()
def presets(as_json: JsonFlag = False) -> None:
    """List the built-in shapes with their exact and published parameter counts."""
    if as_json:
        _print_json(
            [
                {
                    "name": name,
                    "params_total": param_counts(p.config).total,
                    "published_params": p.published_params,
                    "source": p.source,
                    "config": p.config.to_dict(),
                }
                for name, p in PRESETS.items()
            ]
        )
        return
    table = Table("name", "params", "published", "d_model", "layers", "heads", "kv", "head_dim",
                  "d_ff", "activation", "norm", "pos")  # fmt: skip
    for name, p in PRESETS.items():
        c = p.config
        published = f"{p.published_params:,}" if p.published_params is not None else "-"
        table.add_row(
            name, f"{param_counts(c).total:,}", published, *map(str, (c.d_model, c.n_layers, c.n_heads,
            c.n_kv_heads, c.head_dim, c.d_ff)), c.activation, f"{c.norm_placement} {c.norm}", c.pos_embedding,
        )  # fmt: skip
    _stdout().print(table)


@app.command()
def width(
    d_model: Annotated[int, typer.Argument(help="Residual width n.", min=1)],
    multiple_of: Annotated[int, typer.Option(help="Round gated widths up to this.", min=1)] = 256,
    as_json: JsonFlag = False,
) -> None:
    """MLP width analysis: gated parity size and the ReLU feature-loss risk by expansion ratio."""
    rows = []
    for ratio in (1, 2, 3, 4, 8):
        loss = relu_feature_loss(d_model, ratio * d_model)
        rows.append(
            {"ratio": ratio, "d_ff": ratio * d_model, "log10_risk": loss.log10_risk, "risk": loss.risk}
        )
    result = {
        "d_model": d_model,
        "gated_d_ff": gated_d_ff(d_model, multiple_of),
        "multiple_of": multiple_of,
        "relu_feature_loss": rows,
    }
    if as_json:
        _print_json(result)
        return
    typer.echo(f"gated parity d_ff (8/3 rule, multiple of {multiple_of}): {result['gated_d_ff']}")
    table = Table("d_ff / d_model", "d_ff", "P(K < n)", "log10 P(K < n)")
    for row in rows:
        table.add_row(str(row["ratio"]), str(row["d_ff"]), f"{row['risk']:.4g}", f"{row['log10_risk']:.6g}")
    _stdout().print(table)


@config_app.command("new")
def config_new(
    ctx: typer.Context,
    d_model: Annotated[int | None, typer.Option(help="Residual width.")] = None,
    n_layers: Annotated[int | None, typer.Option(help="Blocks (or give --aspect-ratio).")] = None,
    aspect_ratio: Annotated[float | None, typer.Option(help="d_model / n_layers.")] = None,
    n_heads: Annotated[int | None, typer.Option(help="Query heads (default d_model / head_dim).")] = None,
    head_dim: Annotated[int | None, typer.Option(help="Per-head width (default 64).")] = None,
    n_kv_heads: Annotated[int | None, typer.Option(help="KV heads (default n_heads: MHA).")] = None,
    d_ff: Annotated[int | None, typer.Option(help="MLP width (or give --d-ff-ratio).")] = None,
    d_ff_ratio: Annotated[float, typer.Option(help="Plain-MLP ratio; gated get 2/3.")] = 4.0,
    multiple_of: Annotated[int, typer.Option(help="Round d_ff up to this.")] = DEFAULT_MULTIPLE_OF,
    vocab_size: Annotated[int, typer.Option(help="Vocabulary (256: bytes).")] = 256,
    seq_len: Annotated[int, typer.Option(help="Context length.")] = 256,
    activation: Annotated[str, typer.Option(help="relu gelu silu reglu geglu swiglu.")] = "swiglu",
    norm: Annotated[str, typer.Option(help="layernorm or rmsnorm.")] = "rmsnorm",
    norm_placement: Annotated[str, typer.Option(help="pre, post or sandwich.")] = "pre",
    pos_embedding: Annotated[str, typer.Option(help="rope, learned or none.")] = "rope",
    parallel_block: Annotated[bool, typer.Option(help="GPT-J style parallel block.")] = False,
    bias: Annotated[bool, typer.Option(help="Biases in linears and LayerNorm.")] = False,
    tie_embeddings: Annotated[bool, typer.Option(help="Tie LM head to embeddings.")] = False,
    qk_norm: Annotated[bool, typer.Option(help="Norm queries and keys.")] = False,
    from_preset: Annotated[str | None, typer.Option(help="Start from a preset; flags override.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write here, else stdout.")] = None,
) -> None:
    """Write an ArchConfig JSON from flags, deriving n_layers, heads and d_ff from ratios."""
    if from_preset is not None:
        base = preset(from_preset).to_dict()
        given = {n for n, v in ctx.params.items() if ctx.get_parameter_source(n).name != "DEFAULT"}
        knobs = sorted(given - set(base) - {"from_preset", "output"})
        if knobs:
            flags = ", ".join("--" + k.replace("_", "-") for k in knobs)
            raise ConfigError(f"{flags} cannot be combined with --from-preset; give the sizes")
        cfg = ArchConfig.from_dict({**base, **{n: ctx.params[n] for n in given & set(base)}})
    else:
        if d_model is None:
            raise ConfigError("--d-model is required (or start from --from-preset)")
        cfg = config_from_knobs(
            d_model=d_model, n_layers=n_layers, aspect_ratio=aspect_ratio, n_heads=n_heads,
            head_dim=head_dim, n_kv_heads=n_kv_heads, d_ff=d_ff, d_ff_ratio=d_ff_ratio,
            multiple_of=multiple_of, vocab_size=vocab_size, seq_len=seq_len, activation=activation,
            norm=norm, norm_placement=norm_placement, pos_embedding=pos_embedding,
            parallel_block=parallel_block, bias=bias, tie_embeddings=tie_embeddings, qk_norm=qk_norm,
        )  # fmt: skip
    if output is None:
        typer.echo(cfg.to_json())
    else:
        save_config(cfg, output)
        typer.echo(f"wrote {output}: {cfg.describe()}", err=True)


@config_app.command("check")
def config_check(config: Annotated[Path, typer.Argument(help="ArchConfig JSON file.")]) -> None:
    """Validate a config file and summarise it."""
    cfg = load_config(config)
    typer.echo(f"ok: {cfg.describe()}; {param_counts(cfg).total:,} params")


@app.command()
def train(
    config: ConfigArg = None,
    preset_name: PresetOpt = None,
    tokens: Annotated[int | None, typer.Option(help="Budget: training tokens.")] = None,
    flops: Annotated[float | None, typer.Option(help="Budget: training FLOPs.")] = None,
    seconds: Annotated[float | None, typer.Option(help="Budget: seconds of training.")] = None,
    data: Annotated[
        Path | None,
        typer.Option(help="Text file or folder (bytes), or .bin token file(s); default: bundled corpus."),
    ] = None,
    vocab_size: Annotated[int | None, typer.Option(help="Vocabulary of .bin token files.")] = None,
    token_dtype: Annotated[str, typer.Option(help="dtype of .bin token files.")] = "uint16",
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto.")] = "auto",
    precision: Annotated[str, typer.Option(help="bf16, fp32 or auto.")] = "auto",
    batch_size: Annotated[int, typer.Option(help="Sequences per step.")] = 16,
    lr: Annotated[float, typer.Option(help="Peak learning rate at --base-width.")] = 3e-3,
    base_width: Annotated[int, typer.Option(help="Width at which --lr applies unscaled.")] = 128,
    schedule: Annotated[str, typer.Option(help="cosine or wsd.")] = "cosine",
    seed: Annotated[int, typer.Option(help="Seed for init and batches.")] = 0,
    compile_model: Annotated[bool, typer.Option("--compile", help="torch.compile the model.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Train a shape's proxy LM on a budget; report held-out loss, throughput and MFU.

    Exit code 1 when the run fails (NaN loss, out of memory, too large), with the reason.
    """
    from archsearch.evaluators.data import load_dataset
    from archsearch.evaluators.trainer import TrainSettings
    from archsearch.evaluators.trainer import train as run_training

    cfg = _resolve_config(config, preset_name)
    settings = TrainSettings(
        tokens=tokens, flops=flops, seconds=seconds, batch_size=batch_size, lr=lr, base_width=base_width,
        schedule=schedule, seed=seed, device=device, precision=precision, compile=compile_model,
    )  # fmt: skip
    dataset = load_dataset(data, vocab_size=vocab_size, dtype=token_dtype, seq_len=cfg.seq_len)
    with _progress_bar("training") as update:
        result = run_training(cfg, dataset, settings, progress=update)
    if as_json:
        _print_json(result.to_dict())
    else:
        console = _stdout()
        console.print(cfg.describe())
        table = Table("result", "value")
        rows = [
            ("status", result.status + (f" ({result.reason})" if result.reason else "")),
            ("val loss (nats/token)", _fmt(result.val_loss, ".4f")),
            ("bits per byte", _fmt(result.bits_per_byte, ".4f")),
            ("tokens", f"{result.tokens:,} in {result.steps:,} steps"),
            ("tokens / s", f"{result.tokens_per_second:,.0f}"),
            (
                "step time",
                _fmt(result.step_time_s, ".4g")
                + f" s, median of {result.step_time_steps} steady-state steps",
            ),
            ("achieved FLOP/s", _si(result.achieved_flops_per_second, "FLOP/s")),
            ("MFU", _fmt(result.mfu, ".1%") + f" of {_si(result.peak_flops_per_second or 0, 'FLOP/s')} peak"),
            ("precision", result.precision),
            ("device", result.device),
            ("wall time", f"{result.wall_time_s:.1f} s"),
            ("corpus", f"{dataset.name} ({result.corpus_fingerprint})"),
        ]
        for row in rows:
            table.add_row(*row)
        console.print(table)
    if result.status == "failed":
        raise typer.Exit(1)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


@app.command()
def profile(
    config: ConfigArg = None,
    preset_name: PresetOpt = None,
    device: Annotated[
        str, typer.Option(help="cpu, cuda, cuda:N (measured) or a catalogued GPU (modelled, see `devices`).")
    ] = "cpu",
    batch: Annotated[int, typer.Option(help="Sequences per micro-batch.", min=1)] = 8,
    dtype: Annotated[
        str,
        typer.Option(
            help="bf16, fp16, fp32 or auto: what training runs in here (fp32 on a CPU without native "
            "bf16); bf16 on a modelled GPU."
        ),
    ] = "auto",
    steps: Annotated[
        int,
        typer.Option(
            help="Measured: real training steps timed (median, after 3 warm-up steps) so the kernels "
            "read as its breakdown with a residual line; 0: kernels only.",
            min=0,
        ),
    ] = 10,
    cache: Annotated[Path | None, typer.Option(help="JSON file caching measurements across runs.")] = None,
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage", help="Trial database whose kernel table caches measurements (shared with searches)."
        ),
    ] = None,
    min_run_time: Annotated[float, typer.Option(help="Seconds of repeats per kernel.")] = 0.1,
    top: Annotated[int, typer.Option(help="Kernels shown in the table (JSON has all).")] = 20,
    as_json: JsonFlag = False,
) -> None:
    """Kernel-by-kernel time of one training step: measured here, or modelled for a GPU."""
    cfg = _resolve_config(config, preset_name)
    from archsearch.evaluators.hardware import ACCELERATORS, device_model, predict_step
    from archsearch.evaluators.kernels import step_kernels

    if device not in ACCELERATORS and device.split(":")[0] not in ("cpu", "cuda"):
        raise ConfigError(
            f"unknown device {device!r}; measured: cpu, cuda, cuda:N; modelled: {', '.join(ACCELERATORS)}"
        )
    if device in ACCELERATORS:
        dtype = "bf16" if dtype == "auto" else dtype  # what a GPU trains in
        report = predict_step(device_model(device), step_kernels(cfg, batch, dtype), dtype)
    else:
        from archsearch.evaluators.profiler import InMemoryCache, JsonFileCache, profile_step
        from archsearch.evaluators.trainer import measure_step

        def measure(store: Any) -> Any:
            kernels = profile_step(cfg, batch, device, dtype, store, min_run_time, progress=interactive)
            if not steps:
                return kernels
            seconds, timed = measure_step(cfg, batch, device, kernels.dtype, steps, cache=store)
            return kernels.with_measured_step(seconds, timed)

        if cache is not None and storage is not None:
            raise ConfigError("give --cache FILE or --storage URL, not both")
        interactive = Console(stderr=True).is_terminal
        if storage is not None:
            from archsearch.storage import KernelCache, Storage

            with Storage.open(storage) as db:
                report = measure(KernelCache(db.measurements(), db))  # new times are written through
        else:
            report = measure(JsonFileCache(cache) if cache is not None else InMemoryCache())
    if as_json:
        _print_json(report.to_dict())
        return
    console = _stdout()
    how = "modelled" if report.modelled else "measured"
    console.print(
        f"{cfg.describe()}\n{how} on {report.device['name']}, {report.dtype}, batch {batch} x {cfg.seq_len}"
    )
    table = Table("kernel", "m", "n", "k", "count", "time/call", "total", "TFLOP/s", "share")
    rows = sorted(report.kernels, key=lambda r: r.total_s, reverse=True)
    for r in rows[:top]:
        table.add_row(
            r.name, str(r.m), str(r.n), str(r.k), str(r.count), _si(r.time_s, "s"), _si(r.total_s, "s"),
            f"{r.tflops:.3g}", f"{r.total_s / report.step_time_s:.1%}",
        )  # fmt: skip
    console.print(table)
    mem = Table("memory-bound op", "bytes", "time", "share")
    for op in sorted(report.memory_ops, key=lambda o: o.time_s, reverse=True):
        mem.add_row(op.name, _si(op.bytes, "B"), _si(op.time_s, "s"), f"{op.time_s / report.step_time_s:.1%}")
    console.print(mem)
    console.print(_step_breakdown(report))


def _step_breakdown(report: Any) -> str:
    """The lines that add up to the step: matmuls and attention, memory-bound ops and, when the
    real step was measured, the residual (what the kernels timed one by one leave out)."""
    step = report.step_time_s
    parts = [
        f"  matmuls and attention   {_si(report.kernel_time_s, 's'):>8} {report.kernel_time_s / step:7.1%}",
        f"  memory-bound ops        {_si(report.memory_time_s, 's'):>8} {report.memory_time_s / step:7.1%}",
    ]
    if report.residual_s is not None:
        parts.append(
            f"  residual                {_si(report.residual_s, 's'):>8} {report.residual_s / step:7.1%}"
            "  (launches, framework overhead, elementwise ops, optimizer)"
        )
        how = f"measured training step, median of {report.measured_steps}"
    else:
        how = "sum of the kernels" + ("" if report.modelled else "; real step not measured")
    head = f"step {_si(step, 's')} ({how}), {report.tokens_per_second:,.0f} tokens/s"
    return "\n".join([head, *parts])


@app.command()
def align(
    config: ConfigArg = None,
    preset_name: PresetOpt = None,
    device: Annotated[str, typer.Option(help="A catalogued GPU (see `devices`).")] = "h100-sxm",
    batch: Annotated[int, typer.Option(help="Sequences per micro-batch.", min=1)] = 8,
    dtype: Annotated[str, typer.Option(help="bf16, fp16, fp8, tf32 or fp32.")] = "bf16",
    as_json: JsonFlag = False,
) -> None:
    """Is each GEMM width tile- and wave-friendly on the target, and which nearby sizes run better?"""
    from archsearch.evaluators.hardware import alignment_report, device_model

    cfg = _resolve_config(config, preset_name)
    report = alignment_report(device_model(device), cfg, batch, dtype)
    if as_json:
        _print_json(report.to_dict())
        return
    console = _stdout()
    console.print(f"{cfg.describe()}\nmodelled on {report.device}, {dtype}, batch {batch} x {cfg.seq_len}")
    table = Table(
        "width", "value", "aligned", "tiles", "waves", "better sizes (step gain, GEMM efficiency gain)"
    )
    for d in report.dimensions:
        better = ", ".join(
            f"{o.value} ({o.step_gain_pct:+.1f}%, {o.gemm_gain_pct:+.1f}%)" for o in d.better_options
        )
        aligned = "yes" if d.well_aligned else ("8-aligned" if d.aligned else "NO")
        table.add_row(
            d.name, str(d.value), aligned, "ok" if d.tile_friendly else "partial",
            f"{d.wave_efficiency:.0%}" + ("" if d.wave_friendly else " (low)"), better or "-",
        )  # fmt: skip
    console.print(table)


@app.command()
def devices(as_json: JsonFlag = False) -> None:
    """The catalogue of GPUs that `profile` and `align` model, with their sources."""
    from archsearch.evaluators.hardware import ACCELERATORS

    if as_json:
        _print_json([{"key": key, **dataclasses.asdict(acc)} for key, acc in ACCELERATORS.items()])
        return
    table = Table("key", "name", "SMs", "dense TFLOP/s", "bandwidth", "source")
    for key, acc in ACCELERATORS.items():
        peaks = ", ".join(f"{d} {t:g}" for d, t in acc.peak_tflops)
        table.add_row(key, acc.name, str(acc.units), peaks, _si(acc.memory_bandwidth, "B/s"), acc.source)
    _stdout().print(table)


# ------------------------------------------------------------------------------------------------
# The search: space files, searches and studies
# ------------------------------------------------------------------------------------------------
space_app = typer.Typer(cls=_Group, help="Check search-space files.", no_args_is_help=True)
app.add_typer(space_app, name="space")

SpaceArg = Annotated[Path, typer.Argument(help="Search-space TOML file (see examples/).")]
StorageOpt = Annotated[
    str | None,
    typer.Option(
        "--storage", help="Database URL (default: $ARCHSEARCH_STORAGE, else sqlite:///archsearch.db)."
    ),
]


@space_app.command("check")
def space_check(
    space: SpaceArg,
    samples: Annotated[int, typer.Option(help="Sampled configs to show with their costs.", min=0)] = 5,
    seed: Annotated[int, typer.Option(help="Seed of the sampled configs.")] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Validate a space file; print its knobs, size, feasible share and a few sampled configs."""
    from archsearch.search.spec import load_spec
    from archsearch.space.search_space import sample_configs

    spec = load_spec(space)
    feasibility = spec.space.feasibility()
    configs = sample_configs(spec.space, samples, seed)
    if as_json:
        _print_json(
            {
                "spec": spec.to_dict(),
                "fingerprint": spec.fingerprint,
                "size": spec.space.size(),
                "feasibility": dataclasses.asdict(feasibility),
                "samples": [{"config": c.to_dict(), **_costs(c)} for c in configs],
            }
        )
    else:
        console = _stdout()
        table = Table("knob", "values")
        for domain in spec.space.domains:
            table.add_row(domain.name, escape(domain.describe()))
        for name, value in spec.space.fixed:
            table.add_row(name, escape(f"{value!r} (fixed)"))
        console.print(table)
        size = spec.space.size()
        how = "all" if feasibility.exhaustive else "random"
        console.print(
            f"size: {'continuous' if size is None else f'{size:,} points'}; "
            f"budget: {spec.space.budget.describe()}\n"
            f"feasible: {feasibility.feasible:,} of {feasibility.checked:,} checked ({how} points)"
        )
        for reason, count in feasibility.reasons:
            console.print(f"  rejected {count:,}: {escape(reason)}")
        console.print(
            f"objectives: {', '.join(spec.objectives)}; proxy: {_budget_text(spec.proxy)}; "
            f"sampler {spec.defaults.sampler}, {spec.defaults.trials} trials"
        )
        if configs:
            sample = Table("sampled config", "params", "FLOPs/token")
            for c in configs:
                costs = _costs(c)
                sample.add_row(
                    c.describe(), _si(costs["params_total"]), _si(costs["flops_forward_per_token"])
                )
            console.print(sample)
    if feasibility.feasible == 0:
        spec.space.check_feasible()  # raises with the reasons: exit 2


def _costs(cfg: ArchConfig) -> dict[str, float]:
    from archsearch.space.costs import flop_counts

    return {"params_total": param_counts(cfg).total, "flops_forward_per_token": flop_counts(cfg).forward}


def _budget_text(proxy: Any) -> str:
    if proxy.tokens is not None:
        return f"{proxy.tokens:,} tokens"
    return f"{_si(proxy.flops, 'FLOP')}" if proxy.flops is not None else f"{proxy.seconds:g} s"


@app.command()
def search(
    space: Annotated[Path, typer.Option("--space", help="Search-space TOML file (see examples/).")],
    study: Annotated[str | None, typer.Option(help="Study name (default: the space file's name).")] = None,
    trials: Annotated[
        int | None, typer.Option(help="Finished trials to reach (default: the file's).")
    ] = None,
    workers: Annotated[int, typer.Option(help="Trials run at once.", min=1)] = 1,
    storage: StorageOpt = None,
    sampler: Annotated[
        str | None, typer.Option(help="tpe, nsga2, random or gp (default: the file's).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Sampler seed (default: the file's).")] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the study (created if missing).")
    ] = False,
    prune: Annotated[
        bool, typer.Option("--prune/--no-prune", help="Stop dominated trials at the rungs.")
    ] = True,
    address: Annotated[
        str | None, typer.Option(help="Ray cluster to join (default: start one here).")
    ] = None,
    cpus_per_trial: Annotated[float, typer.Option(help="Ray CPUs per trial.")] = 1.0,
    gpus_per_trial: Annotated[
        float, typer.Option(help="Ray GPUs per trial (GPU trials queue for GPUs).")
    ] = 0.0,
    retries: Annotated[int, typer.Option(help="Re-runs of a trial whose worker died.", min=0)] = 1,
    as_json: JsonFlag = False,
) -> None:
    """Search a space: sample shapes with Optuna, train and profile them on Ray, store every trial.

    Ctrl-C or SIGTERM stops dispatching, cancels the running trials (recorded as interrupted and
    re-queued) and exits 130 / 143; `--resume` then continues to the requested number.
    """
    from archsearch.search.driver import SearchOptions, run_search
    from archsearch.search.spec import load_spec
    from archsearch.storage import Storage

    spec = load_spec(space)
    options = SearchOptions(
        study=spec.name if study is None else study,  # "" is refused, not replaced
        trials=trials or spec.defaults.trials,
        workers=workers,
        sampler=sampler or spec.defaults.sampler,
        seed=spec.defaults.seed if seed is None else seed,
        resume=resume,
        prune=prune and spec.defaults.prune,
        address=address,
        cpus_per_trial=cpus_per_trial,
        gpus_per_trial=gpus_per_trial,
        retries=retries,
    )
    spec.space.check_feasible()  # an impossible budget fails here, before anything is written
    with Storage.open(storage) as db, _search_display(options.trials) as update:
        summary = run_search(spec, db, options, on_update=update)
    front = summary.front
    if as_json:
        report = {"study": summary.study, "counts": summary.progress.counts, "interrupted_by": summary.signal}
        _print_json({**report, **(_front_json(front) if front else {"front": []})})
    elif front is not None:
        _print_study_front(front)
    else:
        typer.echo(f"no complete trials in study {options.study!r}", err=True)
    if summary.signal is not None:
        typer.echo(
            f"interrupted: {summary.progress.finished} of {options.trials} trials finished; continue with "
            f"`archsearch search --space {space} --study {options.study} --resume`",
            err=True,
        )
        raise typer.Exit(128 + summary.signal)


@contextlib.contextmanager
def _search_display(target: int) -> Iterator[Callable[[Any], None]]:
    """Live progress on stderr: a bar on a terminal, one line per finished trial otherwise."""
    console = Console(stderr=True)
    last = {"finished": -1}

    def text(p: Any) -> str:
        c = p.counts
        best = "-" if p.best_loss is None else f"{p.best_loss:.4f}"
        return (
            f"{p.finished}/{p.target} finished: {c.get('complete', 0)} complete, "
            f"{c.get('pruned', 0)} pruned, "
            f"{c.get('failed', 0)} failed, {c.get('rejected', 0)} rejected, "
            f"{c.get('duplicate', 0)} duplicate; {c.get('running', 0)} running; "
            f"best loss {best}; front {p.front_size}"
        )

    if not console.is_terminal:

        def log_line(p: Any) -> None:
            if p.finished != last["finished"]:
                last["finished"] = p.finished
                typer.echo(f"[{p.elapsed_s:6.0f} s] {text(p)}", err=True)

        yield log_line
        return
    columns = (TextColumn("search "), BarColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("starting Ray", total=target)

        def update(p: Any) -> None:
            bar.update(task, completed=p.finished, description=text(p))

        yield update


@app.command()
def pareto(
    study: Annotated[list[str], typer.Option("--study", help="Study name; repeat to overlay studies.")],
    objectives: Annotated[
        str | None,
        typer.Option(help="loss,flops | loss,step_time | loss,flops,step_time (default: the study's)."),
    ] = None,
    reference: Annotated[
        str | None,
        typer.Option(
            help="Hypervolume reference point, one value per objective, e.g. 3.0,1e9 (default: the worst "
            "value over all the studies' trials plus 10%, of a decade for FLOPs and time)."
        ),
    ] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a plot: FILE.png or FILE.html.")] = None,
    storage: StorageOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """The Pareto front of a study: non-dominated trials along the front, the knee, the hypervolume."""
    import numpy as np

    from archsearch.search.pareto import parse_objectives, reference_point, study_front
    from archsearch.storage import Storage

    names = parse_objectives(objectives) if objectives else None
    ref = _floats(reference, "--reference") if reference else None
    with Storage.open(storage, create=False) as db:
        fronts = [study_front(db, s, names, ref) for s in study]
        if ref is None and len(fronts) > 1 and all(fronts):
            # One reference for all, so the hypervolumes compare.
            if len({f.front.objectives for f in fronts}) > 1:
                raise ConfigError("studies with different objectives: pass --objectives")
            pooled = np.concatenate([f.trial_values for f in fronts])
            ref = reference_point(pooled, fronts[0].front.objectives)
            fronts = [study_front(db, s, fronts[0].front.objectives, ref) for s in study]
        long = {s: db.long_run_losses(s) for s in study}
    missing = [s for s, f in zip(study, fronts, strict=True) if f is None]
    if missing:
        raise ConfigError(f"no complete trial with every objective in {', '.join(map(repr, missing))}")
    if plot is not None:
        from archsearch.search.plots import plot_fronts

        plot_fronts(fronts, plot)
    if as_json:
        _print_json([_front_json(f, long[f.study]) for f in fronts])
    else:
        for f in fronts:
            _print_study_front(f, long[f.study])
    if plot is not None:
        typer.echo(f"wrote {plot}", err=True)


def _floats(text: str, option: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"{option} takes numbers separated by commas, got {text!r}") from None


def _front_json(f: Any, long: dict[int, tuple[float, float, int]] | None = None) -> dict[str, Any]:
    """The front as JSON; `long` (`Storage.long_run_losses`) adds each member's long-run loss."""
    rows = []
    for r, values in zip(f.records, f.front.values, strict=True):
        tps = f.throughput.get(r.number)
        extra = {}
        if long:
            multiplier, loss, seeds = long.get(r.number, (None, None, 0))
            extra = {"long_loss": loss, "long_multiplier": multiplier, "long_seeds": seeds}
        rows.append(
            {
                "number": r.number,
                "knee": r.number == f.front.knee,
                **dict(zip(f.front.objectives, map(float, values), strict=True)),
                "params_total": r["params_total"],
                "tokens_per_second": tps[0] if tps else None,
                "throughput_device": tps[1] if tps else None,
                "throughput_modelled": tps[2] if tps else None,
                **extra,
                "config": r.config.to_dict(),
            }
        )
    return {
        "study": f.study,
        "objectives": list(f.front.objectives),
        "trials": len(f.trial_numbers),
        "hypervolume": f.front.hypervolume,
        "reference": list(f.front.reference),
        "knee": f.front.knee,
        "front": rows,
    }


def _print_study_front(f: Any, long: dict[int, tuple[float, float, int]] | None = None) -> None:
    """The front as a table; with `long` (`Storage.long_run_losses`), a long-run loss column."""
    console = _stdout()
    objectives = f.front.objectives
    title = f"Pareto front of {f.study!r}: {len(f.front.numbers)} of {len(f.trial_numbers)} complete trials"
    table = Table(title=title)
    for column in ("", "trial", "shape", "params", "FLOPs/token", "loss", "bits/byte", "throughput"):
        table.add_column(column, justify="left" if column in ("", "shape") else "right")
    if "step_time" in objectives:
        table.add_column("step time", justify="right")
    if long:
        table.add_column("long loss", justify="right")
    for r in f.records:
        tps = f.throughput.get(r.number)
        speed = f"{_si(tps[0])} tok/s {tps[1]}{' (model)' if tps[2] else ''}" if tps else "-"
        row = [
            "knee" if r.number == f.front.knee else "", str(r.number), escape(r.config.describe()),
            _si(r["params_total"]), _si(r["flops_forward_per_token"]), f"{r['loss']:.4f}",
            _fmt(r["bits_per_byte"], ".3f"), speed,
        ]  # fmt: skip
        if "step_time" in objectives:
            row.append(_si(r["step_time_s"], "s"))
        if long:
            row.append(_long_cell(long.get(r.number)))
        table.add_row(*row)
    console.print(table)
    ref = ", ".join(f"{x:.4g}" for x in f.front.reference)
    scale = " (log10 for " + ", ".join(o for o in objectives if o != "loss") + ")"
    axes = ", ".join(objectives)
    console.print(f"hypervolume {f.front.hypervolume:.4g} against reference ({ref}) in ({axes}){scale}")


@app.command()
def validate(
    study: Annotated[str, typer.Option(help="Study name (see `studies`).")],
    storage: StorageOpt = None,
    trials: Annotated[
        int, typer.Option(help="Calibration-set size: the Pareto front plus a sample of the rest.")
    ] = 12,
    trial: Annotated[
        list[int] | None, typer.Option("--trial", help="Retrain trial N (repeat); instead of --trials.")
    ] = None,
    multiplier: Annotated[float, typer.Option(help="Long runs train K x the proxy's tokens (> 1).")] = 10.0,
    seeds: Annotated[int, typer.Option(help="Long runs per trial (seeds 0..R-1); > 1 measures noise.")] = 1,
    workers: Annotated[int, typer.Option(help="Long runs at once.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the calibration sample.")] = 0,
    address: Annotated[
        str | None, typer.Option(help="Ray cluster to join (default: start one here).")
    ] = None,
    cpus_per_run: Annotated[float, typer.Option(help="Ray CPUs per long run.")] = 1.0,
    gpus_per_run: Annotated[float, typer.Option(help="Ray GPUs per long run.")] = 0.0,
    as_json: JsonFlag = False,
) -> None:
    """Rank fidelity of a study's proxy: retrain a calibration set for longer and compare rankings.

    Long runs use the study's stored [proxy] settings and corpus at --multiplier x its tokens, with
    the cosine schedule; each is stored as it finishes, so a rerun (or one after Ctrl-C, exit 130)
    trains only what is missing. The report is stored with the study.
    """
    from archsearch.search.validate import ValidateOptions, run_validate
    from archsearch.storage import Storage

    options = ValidateOptions(
        study=study, trials=trials, numbers=tuple(trial or ()), multiplier=multiplier, seeds=seeds,
        workers=workers, sample_seed=seed, address=address, cpus_per_trial=cpus_per_run,
        gpus_per_trial=gpus_per_run,
    )  # fmt: skip
    with Storage.open(storage, create=False) as db, _validate_display() as update:
        summary = run_validate(db, options, on_update=update)
    for line in summary.failed:
        typer.echo(f"failed: {line}", err=True)
    if summary.report is None:
        typer.echo(
            f"interrupted: {summary.trained} long runs trained and stored; rerun the same command to "
            "train the rest",
            err=True,
        )
        raise typer.Exit(128 + (summary.signal or 2))
    if as_json:
        _print_json({"study": summary.study, "trained": summary.trained, "skipped": summary.skipped,
                     "failed": list(summary.failed), **summary.report})  # fmt: skip
    else:
        _print_validation(summary.study, summary.report)
    typer.echo(f"{summary.trained} long runs trained, {summary.skipped} reused from earlier runs", err=True)


@contextlib.contextmanager
def _validate_display() -> Iterator[Callable[[Any], None]]:
    """Progress on stderr: a bar on a terminal, one line per long run otherwise."""
    console = Console(stderr=True)
    if not console.is_terminal:

        def log_line(p: Any) -> None:
            typer.echo(f"[{p.elapsed_s:6.0f} s] {p.done}/{p.total} long runs stored; {p.last}", err=True)

        yield log_line
        return
    columns = (TextColumn("validate "), BarColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("starting Ray", total=None)

        def update(p: Any) -> None:
            bar.update(task, completed=p.done, total=p.total, description=f"{p.done}/{p.total}; {p.last}")

        yield update


def _print_validation(study: str, report: dict[str, Any]) -> None:
    console = _stdout()
    seeds = report["seeds"]
    fronts = report["fronts"]
    proxy_front, long_front = set(fronts.get("proxy", ())), set(fronts.get("long", ()))
    table = Table(
        title=f"Proxy fidelity of {study!r}: {len(report['rows'])} trials retrained at "
        f"{report['multiplier']:g}x the proxy's tokens, {seeds} seed{'s' if seeds > 1 else ''}"
    )
    for column in ("trial", "shape", "params", "FLOPs/token", "proxy loss", "long loss", "fronts"):
        table.add_column(column, justify="left" if column in ("shape", "fronts") else "right")
    for r in report["rows"]:
        marks = "/".join(m for m, s in (("proxy", proxy_front), ("long", long_front)) if r["number"] in s)
        table.add_row(
            str(r["number"]), escape(r["shape"]), _si(r["params_total"]), _si(r["flops"]),
            f"{r['proxy_loss']:.4f}", _fmt(r["long_loss"], ".4f"), marks,
        )  # fmt: skip
    console.print(table)
    ranks = Table(title="Ranking the long-run loss (seed mean)")
    for column in ("predictor", "Spearman", "Kendall", "iso-params pairs"):
        ranks.add_column(column, justify="left" if column == "predictor" else "right")
    names = {"proxy": "proxy loss", "params": "-params", "flops": "-FLOPs"}
    for key, label in names.items():
        c = report["correlations"][key]
        iso = report["iso_pairs"].get(key)
        ranks.add_row(
            label, _fmt(c["spearman"], ".3f"), _fmt(c["kendall"], ".3f"), f"{iso[0]}/{iso[1]}" if iso else "-"
        )
    console.print(ranks)
    floor = report["noise_floor"]
    console.print(
        "seed noise floor (pooled sd): " + (f"{floor:.4f}" if floor is not None else "- (one seed)")
    )
    if "shared" in fronts:
        console.print(
            f"fronts (loss vs FLOPs): proxy {len(proxy_front)}, long run {len(long_front)}, shared "
            f"{fronts['shared']}; long-run hypervolume: proxy front {fronts['proxy_long_hypervolume']:.4g}, "
            f"long-run front {fronts['long_long_hypervolume']:.4g} (reference "
            + ", ".join(f"{x:.4g}" for x in fronts["reference"])
            + ", log10 FLOPs)"
        )


def _long_cell(entry: tuple[float, float, int] | None) -> str:
    """`3.1234 (10x)` or `3.1234 (10x, 3 seeds)`: a trial's long-run loss where one exists."""
    if entry is None:
        return "-"
    multiplier, loss, seeds = entry
    return f"{loss:.4f} ({multiplier:g}x{f', {seeds} seeds' if seeds > 1 else ''})"


@app.command()
def studies(storage: StorageOpt = None, as_json: JsonFlag = False) -> None:
    """The studies in a trial database, with their trials by state."""
    from archsearch.storage import STATES, Storage

    with Storage.open(storage, create=False) as db:
        records = db.studies()
    if as_json:
        _print_json(
            [
                {
                    "name": s.name,
                    "objectives": list(s.objectives),
                    "created_at": s.created_at,
                    "trials": s.counts,
                }
                for s in records
            ]
        )
        return
    table = Table("study", "objectives", "created", *STATES)
    for s in records:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.created_at))
        table.add_row(s.name, ",".join(s.objectives), created, *(str(s.counts.get(k, 0)) for k in STATES))
    _stdout().print(table if records else "no studies")


# ------------------------------------------------------------------------------------------------
# Results: trial queries
# ------------------------------------------------------------------------------------------------
TABLE_ROWS = 100  # a terminal table of a 100,000-trial study is unreadable and slow to fetch and draw


@app.command()
def trials(
    study: Annotated[str, typer.Option(help="Study name (see `studies`).")],
    where: Annotated[
        str | None,
        typer.Option(help='Filter, e.g. "activation = swiglu and d_model >= 512 and status = complete".'),
    ] = None,
    sort: Annotated[
        str | None, typer.Option(help="Column to sort by, -column for descending (default: trial number).")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="At most N trials, after filtering and sorting.")] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="table, csv, json (records) or parquet (needs --output).")
    ] = "table",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write here, not stdout.")] = None,
    storage: StorageOpt = None,
) -> None:
    """A study's trials with their shape, costs, results, status and reason: filtered, sorted, exported.

    The filter language and the columns are in README.md ("archsearch trials") and
    `archsearch.storage.query`; user text is parsed, never evaluated.
    """
    from archsearch.fileio import write_atomic
    from archsearch.storage import Storage
    from archsearch.storage.query import FORMATS, QueryError, trials_frame

    if fmt != "table" and fmt not in FORMATS:
        raise QueryError(f"unknown format {fmt!r}; valid: table, {', '.join(FORMATS)}")
    if fmt == "table" and output is not None:
        raise QueryError("--output needs --format csv, json or parquet (the table is for the terminal)")
    if fmt != "table" and FORMATS[fmt].binary and output is None:
        raise QueryError(f"--format {fmt} is binary: give --output FILE")
    # A table without --limit fetches one row more than it shows, to know whether more match.
    fetch = TABLE_ROWS + 1 if fmt == "table" and limit is None else limit
    with Storage.open(storage, create=False) as db:
        frame = trials_frame(db, study, where=where, sort=sort, limit=fetch)
        long = db.long_run_losses(study) if fmt == "table" else {}
    if fmt == "table":
        more = limit is None and len(frame) > TABLE_ROWS
        _print_trials(frame.head(TABLE_ROWS) if more else frame, study, more=more, long=long)
        return
    data = FORMATS[fmt].encode(frame)
    if output is None:
        typer.echo(data.decode(), nl=False)
    else:
        try:
            write_atomic(output, data)
        except OSError as exc:
            raise ArchsearchError(f"cannot write {output}: {exc.strerror or exc}") from None
        typer.echo(f"wrote {len(frame):,} trials to {output}", err=True)


def _print_trials(
    frame: Any, study: str, more: bool, long: dict[int, tuple[float, float, int]] | None = None
) -> None:
    """A readable subset of the columns; csv, json and parquet carry all of them. With `long`
    (`Storage.long_run_losses`), a long-run loss column beside the proxy loss."""
    import pandas as pd

    def cell(value: Any, render: Callable[[Any], str] = str) -> str:
        return "-" if pd.isna(value) else escape(render(value))

    columns: list[tuple[str, str, Callable[[Any], str]]] = [
        ("trial", "number", str), ("status", "status", str), ("d_model", "d_model", str),
        ("layers", "n_layers", str), ("heads", "n_heads", str), ("kv", "n_kv_heads", str),
        ("head_dim", "head_dim", str), ("d_ff", "d_ff", str), ("activation", "activation", str),
        ("params", "params_total", _si), ("FLOPs/token", "flops_forward_per_token", _si),
        ("loss", "loss", lambda v: f"{v:.4f}"), ("step time", "step_time_s", lambda v: _si(v, "s")),
        ("reason", "reason", str),
    ]  # fmt: skip
    if frame.empty:
        _stdout().print(f"no trials of {escape(repr(study))} match")
        return
    table = Table(title=escape(f"{'first ' if more else ''}{len(frame):,} trials of {study!r}"))
    for header, _, _ in columns:
        table.add_column(header, justify="left" if header in ("status", "activation", "reason") else "right")
    if long:
        table.add_column("long loss", justify="right")
    for row in frame[[name for _, name, _ in columns]].itertuples(index=False):
        cells = [cell(v, render) for v, (_, _, render) in zip(row, columns, strict=True)]
        if long:
            cells.append(_long_cell(long.get(row[0])) if not pd.isna(row[0]) else "-")
        table.add_row(*cells)
    _stdout().print(table)
    if more:
        typer.echo("more trials match: use --limit N, --sort or --format csv", err=True)


# ------------------------------------------------------------------------------------------------
# Results: export for real trainers
# ------------------------------------------------------------------------------------------------
@app.command()
def export(
    study: Annotated[str, typer.Option(help="Study name (see `studies`).")],
    fmt: Annotated[str, typer.Option("--format", help="hf, litgpt, nanogpt or json.")],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Folder to create (absent or empty); all or nothing.")
    ],
    trial: Annotated[int | None, typer.Option(help="Export trial number N.")] = None,
    knee: Annotated[bool, typer.Option("--knee", help="Export the knee of the Pareto front.")] = False,
    best_under_flops: Annotated[
        str | None,
        typer.Option(help="Export the lowest-loss trial with forward FLOPs/token <= F (e.g. 1e9 or 2G)."),
    ] = None,
    front: Annotated[
        bool, typer.Option("--front", help="Export every front member to trial-N/ folders, plus index.json.")
    ] = False,
    storage: StorageOpt = None,
) -> None:
    """A trial's shape for a real trainer: Hugging Face config, litgpt YAML, nanoGPT GPTConfig or JSON.

    A shape the format cannot represent exactly is refused with the reason (exit 2, nothing
    written). With --front the representable members are written and the refusals listed in
    index.json and on stderr; exit 2 only when none is representable.
    """
    from archsearch.space.export import EXPORT_FORMATS, parse_flops, trial_provenance
    from archsearch.storage import Storage

    export_format = EXPORT_FORMATS[fmt]  # an unknown format fails before the database is opened
    selectors = (
        ("--trial N", trial is not None),
        ("--knee", knee),
        ("--best-under-flops F", best_under_flops is not None),
        ("--front", front),
    )
    chosen = [flag for flag, given in selectors if given]
    if len(chosen) != 1:
        raise ConfigError(
            "give exactly one of --trial N, --knee, --best-under-flops F, --front"
            + (f" (got {', '.join(chosen)})" if chosen else "")
        )
    flops_limit = parse_flops(best_under_flops) if best_under_flops is not None else None
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ConfigError(f"--output {output} exists and is not an empty folder")
    with Storage.open(storage, create=False) as db:
        record = db.require_study(study)
        knee_number = None
        if trial is not None:
            members = [_export_numbered(db.trials(study), study, trial)]
        elif flops_limit is not None:
            members = [_export_best_under(db.trials(study, status="complete"), study, flops_limit)]
        else:
            members, knee_number = _export_front(db.trials(study, status="complete"), record)
            if knee:
                members = [m for m in members if m.number == knee_number]
        devices = {d.get("fingerprint"): d for d in db.devices()}
    exports = []  # (trial record, folder, files or None, refusal or None)
    for member in members:
        cfg = member.config
        reason = export_format.refusal(cfg)
        if reason is not None and not front:
            raise ConfigError(f"trial {member.number} cannot be exported as {fmt}: {reason}")
        provenance = trial_provenance(record, member, devices.get(member["device_fingerprint"]))
        files = export_format.files(cfg, provenance) if reason is None else None
        exports.append((member, f"trial-{member.number}" if front else "", files, reason))
    if not any(files for _, _, files, _ in exports):
        refusals = "; ".join(f"trial {m.number}: {reason}" for m, _, _, reason in exports)
        raise ConfigError(f"no front member of {study!r} can be exported as {fmt}: {refusals}")
    tree: dict[str, bytes] = {}
    index = []
    for member, folder, files, reason in exports:
        notes = list(export_format.notes(member.config)) if files else []
        for name, data in (files or {}).items():
            tree[f"{folder}/{name}" if folder else name] = data
        index.append(
            {
                "number": member.number,
                "knee": member.number == knee_number,
                "loss": member["loss"],
                "flops_forward_per_token": member["flops_forward_per_token"],
                "params_total": member["params_total"],
                "step_time_s": member["step_time_s"],
                "format": fmt,
                "target": export_format.target(member.config) if files else None,
                "folder": folder if files else None,
                "refused": reason,
                "notes": notes,
            }
        )
        if reason is not None:
            typer.echo(f"refused: trial {member.number} cannot be exported as {fmt}: {reason}", err=True)
        for note in notes:
            typer.echo(f"note: trial {member.number}: {note}", err=True)
    if front:
        document = {
            "study": study,
            "format": fmt,
            "objectives": list(record.objectives),
            "knee": knee_number,
            "trials": index,
        }
        tree["index.json"] = (json.dumps(document, indent=2) + "\n").encode("utf-8")
    _export_write(output, tree)
    for entry in index:
        if entry["folder"] is not None:
            where = output / entry["folder"] if entry["folder"] else output
            typer.echo(f"{where}: trial {entry['number']} as {entry['target']}")


def _export_numbered(trials: list[Any], study: str, number: int) -> Any:
    found = [t for t in trials if t.number == number]
    if not found:
        numbers = sorted(t.number for t in trials if t.number is not None)
        span = f"trials {numbers[0]} to {numbers[-1]}" if numbers else "no trials"
        raise ConfigError(f"study {study!r} has no trial {number} ({span})")
    t = found[0]
    if t.status != "complete" or t.config is None:
        why = f" ({t.reason})" if t.reason else ""
        raise ConfigError(f"trial {number} of {study!r} is {t.status}{why}: only complete trials export")
    return t


def _export_best_under(complete: list[Any], study: str, limit: float) -> Any:
    """The lowest-loss complete trial within the FLOPs limit; ties go to the lower trial number."""
    costed = [t for t in complete if t["loss"] is not None and t["flops_forward_per_token"] is not None]
    within = [t for t in costed if t["flops_forward_per_token"] <= limit]
    if not within:
        cheapest = min((t["flops_forward_per_token"] for t in costed), default=None)
        hint = f"; the cheapest has {cheapest:.4g}" if cheapest is not None else ""
        raise ConfigError(f"no complete trial of {study!r} has forward FLOPs/token <= {limit:.4g}{hint}")
    return min(within, key=lambda t: (t["loss"], t.number))


def _export_front(complete: list[Any], record: Any) -> tuple[list[Any], int]:
    """The study's Pareto front over its own objectives, in front order (by loss), and its knee."""
    import numpy as np

    from archsearch.search.pareto import OBJECTIVE_COLUMNS, pareto_front

    unknown = [o for o in record.objectives if o not in OBJECTIVE_COLUMNS]
    if unknown or not record.objectives:
        raise ConfigError(f"study {record.name!r} has objectives {record.objectives!r}: no front to rank")
    columns = [OBJECTIVE_COLUMNS[o] for o in record.objectives]
    values = np.array(
        [[np.nan if t[c] is None else t[c] for c in columns] for t in complete], dtype=float
    ).reshape(len(complete), len(columns))
    result = pareto_front([t.number for t in complete], values, record.objectives)
    if result is None:
        objectives = ", ".join(record.objectives)
        raise ConfigError(f"no complete trial of {record.name!r} has every objective ({objectives})")
    by_number = {t.number: t for t in complete}
    return [by_number[n] for n in result.numbers], result.knee


def _export_write(output: Path, tree: dict[str, bytes]) -> None:
    """All of `tree` (relative path -> bytes) under `output`, or nothing: the files go into a hidden
    sibling folder, each with write_atomic, and the folder is renamed onto `output` at the end."""
    import os
    import shutil
    import tempfile

    from archsearch.fileio import write_atomic

    output = output.absolute()
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent))
    try:
        for name, data in tree.items():
            write_atomic(staging / name, data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's folder is private (0700); the export is not
        os.replace(staging, output)  # rename(2) onto an absent or empty folder
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise ConfigError(f"cannot write {output}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


class _TokensColumn(ProgressColumn):
    """`done/total tokens`, with `?` for a total not known yet: the bar starts before the first
    step reports one (rich's TextColumn would format None with `:,` and raise TypeError)."""

    def render(self, task: Task) -> Text:
        total = "?" if task.total is None else f"{int(task.total):,}"
        return Text(f"{int(task.completed):,}/{total} tokens")


@contextlib.contextmanager
def _progress_bar(label: str) -> Iterator[Callable[[int, int, float, float], None] | None]:
    """A rich progress bar on stderr when it is a terminal; yields its update callback or None.

    The ETA is rich's estimate from the recent rate of tokens; for a seconds budget the total is
    itself the trainer's estimate, so the ETA is approximate there.
    """
    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    columns = (
        TextColumn(f"{label} "), BarColumn(), _TokensColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"), TextColumn("{task.fields[rate]:,.0f} tok/s"),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
    )  # fmt: skip
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(label, total=None, loss=float("nan"), rate=0.0)

        def update(done: int, total: int, loss: float, rate: float) -> None:
            bar.update(task, completed=done, total=total, loss=loss, rate=rate)

        yield update


def main() -> None:
    """Console-script entry point."""
    app()
