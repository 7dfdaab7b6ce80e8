"""Shape commands: a shape's exact costs, the presets, MLP width analysis, config files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from archsearch.cli.common import (
    ConfigArg,
    FromStudyOpt,
    FromTrialOpt,
    JsonFlag,
    PresetOpt,
    StorageOpt,
    app,
    config_app,
    path_value,
    print_json,
    resolve_shape,
    si,
    stdout,
)
from archsearch.errors import ConfigError
from archsearch.fileio import check_writable
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
from archsearch.space.config import check_size
from archsearch.space.knobs import DEFAULT_MULTIPLE_OF, config_from_knobs
from archsearch.space.width import gated_d_ff


@app.command()
def cost(
    config: ConfigArg = None,
    preset_name: PresetOpt = None,
    study: FromStudyOpt = None,
    trial: FromTrialOpt = None,
    storage: StorageOpt = None,
    dtype: Annotated[str, typer.Option(help="Dtype for weight and KV-cache bytes.")] = "bf16",
    as_json: JsonFlag = False,
) -> None:
    """Exact parameters, FLOPs per token and memory of one shape."""
    cfg = resolve_shape(config, preset_name, study, trial, storage)
    report = cost_report(cfg, dtype)
    if as_json:
        print_json({"config": cfg.to_dict(), **report})
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
        table.add_row(label, si(report[key], unit), f"{report[key]:,}")
    risk = report["relu_feature_loss_log10"]
    if risk is not None:
        table.add_row("relu feature loss log10 P(K<n)", f"{risk:.4g}", "")
    console = stdout()
    console.print(cfg.describe())
    console.print(table)
    console.print(f"conventions: {report['conventions']}")


@app.command()
def presets(as_json: JsonFlag = False) -> None:
    """List the built-in shapes with their exact and published parameter counts."""
    if as_json:
        print_json(
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
    stdout().print(table)


@app.command()
def width(
    d_model: Annotated[int, typer.Argument(help="Residual width n.", min=1)],
    multiple_of: Annotated[int, typer.Option(help="Round gated widths up to this.", min=1)] = 256,
    as_json: JsonFlag = False,
) -> None:
    """MLP width analysis: gated parity size and the ReLU feature-loss risk by expansion ratio."""
    check_size("d_model", d_model)  # 400 digits overflowed the risk's float arithmetic
    check_size("--multiple-of", multiple_of)
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
        print_json(result)
        return
    typer.echo(f"gated parity d_ff (8/3 rule, multiple of {multiple_of}): {result['gated_d_ff']}")
    table = Table("d_ff / d_model", "d_ff", "P(K < n)", "log10 P(K < n)")
    for row in rows:
        table.add_row(str(row["ratio"]), str(row["d_ff"]), f"{row['risk']:.4g}", f"{row['log10_risk']:.6g}")
    stdout().print(table)


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
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here, else stdout.", parser=path_value)
    ] = None,
) -> None:
    """Write an ArchConfig JSON from flags, deriving n_layers, heads and d_ff from ratios."""
    if output is not None:
        check_writable(output)  # a folder, a path below a file: one line, exit 2
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
        # Whole layers can miss the asked aspect ratio by far: say so, rather than build silently.
        if aspect_ratio is not None and abs(cfg.aspect_ratio / aspect_ratio - 1) > 0.25:
            typer.echo(
                f"note: --aspect-ratio {aspect_ratio:g} at d_model {d_model} is {d_model / aspect_ratio:.3g} "
                f"layers: built with {cfg.n_layers} (aspect {cfg.aspect_ratio:g})",
                err=True,
            )
    if output is None:
        typer.echo(cfg.to_json())
    else:
        save_config(cfg, output)
        typer.echo(f"wrote {output}: {cfg.describe()}", err=True)


@config_app.command("check")
def config_check(
    config: Annotated[
        Path,
        typer.Argument(help="ArchConfig JSON file (or an `export --format json` file).", parser=path_value),
    ],
) -> None:
    """Validate a config file and summarise it."""
    cfg = load_config(config)
    typer.echo(f"ok: {cfg.describe()}; {param_counts(cfg).total:,} params")
