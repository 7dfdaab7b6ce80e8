"""`ArchConfig`: one validated, frozen, serialisable transformer shape.

The config is the currency of archsearch: the space samples it, the evaluators build and time it,
storage keeps it and export writes it for trainers. Its JSON form (`to_dict`) is a public contract:
the keys are exactly the dataclass fields, unknown keys are rejected and round trips are exact.

The variants (activations, norms, norm placements, position embeddings) are small registries of
plain specs, so the cost model and the PyTorch proxy read the same facts without importing torch
here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from archsearch.errors import ConfigError, quoted
from archsearch.fileio import parse_json, read_text, write_atomic
from archsearch.registry import Registry
from archsearch.units import short_number

# Largest size a field may take: integers up to 2**53 are exact as float64, which the cost model
# and JSON readers use; a larger one (d_model = 10**400) overflowed the float conversion.
MAX_SIZE = 2**53


@dataclass(frozen=True)
class ActivationSpec:
    """An MLP non-linearity.

    Attributes:
        base: the pointwise function applied: "relu", "gelu" or "silu".
        gated: GLU family, `W_down(act(W_gate x) * (W_up x))`: three MLP matrices instead of two.
        hard_gated: ReLU-like, a unit is exactly zero for negative input, so the binomial
            feature-retention argument applies (docs/explanations/shape-costs.md).
    """

    base: str
    gated: bool
    hard_gated: bool


ACTIVATIONS: Registry[ActivationSpec] = Registry("activation")
ACTIVATIONS.register("relu", ActivationSpec("relu", gated=False, hard_gated=True))
ACTIVATIONS.register("gelu", ActivationSpec("gelu", gated=False, hard_gated=False))
ACTIVATIONS.register("silu", ActivationSpec("silu", gated=False, hard_gated=False))
ACTIVATIONS.register("reglu", ActivationSpec("relu", gated=True, hard_gated=True))
ACTIVATIONS.register("geglu", ActivationSpec("gelu", gated=True, hard_gated=False))
ACTIVATIONS.register("swiglu", ActivationSpec("silu", gated=True, hard_gated=False))


@dataclass(frozen=True)
class NormSpec:
    """A normalisation layer kind.

    Attributes:
        has_bias: the norm has a learned shift (LayerNorm's beta), present when the config has
            biases. RMSNorm only scales.
    """

    has_bias: bool


NORMS: Registry[NormSpec] = Registry("norm")
NORMS.register("layernorm", NormSpec(has_bias=True))
NORMS.register("rmsnorm", NormSpec(has_bias=False))


@dataclass(frozen=True)
class NormPlacement:
    """Where the norms of a block sit, relative to each sublayer (attention, MLP).

    Attributes:
        before: norm the sublayer's input (pre-norm, GPT-2 and LLaMA).
        after: norm the sublayer's output before the residual add (sandwich / peri-norm).
        residual: norm the residual stream after the add (post-norm, the original transformer).
        final: a norm before the LM head. Post-norm has none: the last block already ends in one.
    """

    before: bool
    after: bool
    residual: bool
    final: bool

    def norms_per_layer(self, parallel_block: bool) -> int:
        """Number of d_model-wide norms one block holds.

        A parallel block shares its input norm and its post-add norm between the two branches,
        but each branch keeps its own output norm.
        """
        if parallel_block:
            return int(self.before) + 2 * int(self.after) + int(self.residual)
        return 2 * (int(self.before) + int(self.after) + int(self.residual))


NORM_PLACEMENTS: Registry[NormPlacement] = Registry("norm placement")
NORM_PLACEMENTS.register("pre", NormPlacement(before=True, after=False, residual=False, final=True))
NORM_PLACEMENTS.register("post", NormPlacement(before=False, after=False, residual=True, final=False))
NORM_PLACEMENTS.register("sandwich", NormPlacement(before=True, after=True, residual=False, final=True))


@dataclass(frozen=True)
class PositionSpec:
    """How token positions reach the model.

    Attributes:
        learned_table: a trained (seq_len, d_model) table added to the token embeddings (GPT-2).
        rotary: RoPE rotates query and key pairs, so head_dim must be even (LLaMA).
    """

    learned_table: bool
    rotary: bool


POSITIONS: Registry[PositionSpec] = Registry("position embedding")
POSITIONS.register("rope", PositionSpec(learned_table=False, rotary=True))
POSITIONS.register("learned", PositionSpec(learned_table=True, rotary=False))
# Causal attention alone can infer position (Haviv et al. 2022, "NoPos").
POSITIONS.register("none", PositionSpec(learned_table=False, rotary=False))


@dataclass(frozen=True)
class ArchConfig:
    """A decoder-only transformer LM shape. Validated on construction; never mutated.

    Use `dataclasses.replace(cfg, ...)` (re-validated) for a changed copy and `from_dict` to read
    the JSON form, which may leave out `head_dim` and `n_kv_heads` to derive them.

    Raises:
        ConfigError: a field has the wrong type or breaks a rule; the message names both.
    """

    # --- data ---
    vocab_size: int  # token ids the embedding covers; 256 for byte-level text
    seq_len: int  # context trained at: sets attention cost and the learned position table
    # --- shape ---
    d_model: int  # residual stream width
    n_layers: int  # blocks; the aspect ratio is d_model / n_layers
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads: n_heads is MHA, 1 is MQA, a divisor in between is GQA
    head_dim: int  # per-head width; n_heads * head_dim need not equal d_model (Gemma-7B)
    d_ff: int  # MLP hidden width, per matrix for gated MLPs
    # --- variants ---
    activation: str = "swiglu"  # today's default MLP (LLaMA, Mistral); see ACTIVATIONS
    norm: str = "rmsnorm"  # cheaper than LayerNorm, same quality at scale (Zhang & Sennrich 2019)
    norm_placement: str = "pre"  # stabler than post-norm, tolerates larger learning rates
    pos_embedding: str = "rope"  # no parameters, extrapolates better than a learned table
    parallel_block: bool = False  # attention and MLP read one normed input (GPT-J, PaLM)
    bias: bool = False  # biases in linears and LayerNorm; modern LMs drop them
    tie_embeddings: bool = False  # LM head shares the token embedding matrix (GPT-2)
    qk_norm: bool = False  # norm queries and keys per head before the dot product

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type == "int":
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ConfigError(f"{field.name} must be an integer, got {value!r}")
                if value <= 0:
                    raise ConfigError(f"{field.name} must be positive, got {short_number(value)}")
                check_size(field.name, value)
            elif field.type == "bool":
                if not isinstance(value, bool):
                    raise ConfigError(f"{field.name} must be true or false, got {value!r}")
            elif not isinstance(value, str):
                raise ConfigError(f"{field.name} must be a string, got {value!r}")
        for name, registry in _CHOICES.items():
            if getattr(self, name) not in registry:
                valid = ", ".join(registry.names())
                raise ConfigError(f"{name} {getattr(self, name)!r} is unknown; valid: {valid}")
        if self.n_kv_heads > self.n_heads or self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads} "
                "(MHA: equal, GQA: a divisor, MQA: 1)"
            )
        if POSITIONS[self.pos_embedding].rotary and self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim} must be even for rope positions")

    # --- derived values ---
    @property
    def activation_spec(self) -> ActivationSpec:
        return ACTIVATIONS[self.activation]

    @property
    def gated(self) -> bool:
        """Whether the MLP has a gate matrix (GLU family)."""
        return ACTIVATIONS[self.activation].gated

    @property
    def placement(self) -> NormPlacement:
        return NORM_PLACEMENTS[self.norm_placement]

    @property
    def q_dim(self) -> int:
        """Width of all query heads together, `n_heads * head_dim`."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of all key (or value) heads together, `n_kv_heads * head_dim`."""
        return self.n_kv_heads * self.head_dim

    @property
    def kv_groups(self) -> int:
        """Query heads sharing one key/value head."""
        return self.n_heads // self.n_kv_heads

    @property
    def attention_layout(self) -> str:
        """ "mha", "gqa" or "mqa"; a single head counts as MHA."""
        if self.n_kv_heads == self.n_heads:
            return "mha"
        return "mqa" if self.n_kv_heads == 1 else "gqa"

    @property
    def aspect_ratio(self) -> float:
        """`d_model / n_layers`: published LMs mostly sit between 100 and 200."""
        return self.d_model / self.n_layers

    @property
    def d_ff_ratio(self) -> float:
        """`d_ff / d_model`: 4 for plain MLPs, about 8/3 for gated ones."""
        return self.d_ff / self.d_model

    def describe(self) -> str:
        """A one-line summary of the shape, for tables, logs and plot labels."""
        parts = [
            f"d_model {self.d_model}",
            f"{self.n_layers} layers (aspect {self.aspect_ratio:.4g})",
            f"{self.n_heads}x{self.head_dim} heads, {self.n_kv_heads} kv ({self.attention_layout})",
            f"d_ff {self.d_ff} ({self.d_ff_ratio:.3g}x {self.activation})",
            f"{self.norm_placement} {self.norm}",
            f"{self.pos_embedding} positions",
        ]
        flags = [
            name for name in ("parallel_block", "bias", "tie_embeddings", "qk_norm") if getattr(self, name)
        ]
        return ", ".join(parts + flags)

    # --- JSON form ---
    def to_dict(self) -> dict[str, Any]:
        """The public JSON form: every field, nothing else."""
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ArchConfig:
        """Build from the JSON form.

        `head_dim` may be left out when `n_heads` divides `d_model` (it is then
        `d_model // n_heads`), and `n_kv_heads` when the model is MHA. Variant fields take the
        dataclass defaults.

        Raises:
            ConfigError: not a mapping, unknown or missing keys, or an invalid shape.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"an ArchConfig must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - _FIELD_NAMES)
        if unknown:
            raise ConfigError(
                f"unknown ArchConfig key(s): {', '.join(unknown)}; valid: {', '.join(_FIELD_NAMES_ORDERED)}"
            )
        values = dict(data)
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        missing = [n for n in required if n not in _DERIVABLE and values.get(n) is None]
        if missing:
            raise ConfigError(f"missing ArchConfig key(s): {', '.join(missing)}")
        if "n_kv_heads" not in values:
            values["n_kv_heads"] = values["n_heads"]
        if "head_dim" not in values:
            values["head_dim"] = _derived_head_dim(values["d_model"], values["n_heads"])
        return cls(**values)

    @classmethod
    def from_json(cls, text: str, source: str = "config") -> ArchConfig:
        """Parse JSON text; `source` names it in errors (a file path, say)."""
        data = _parse_json(text, source)
        try:
            return cls.from_dict(data)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None


_CHOICES: dict[str, Registry[Any]] = {
    "activation": ACTIVATIONS,
    "norm": NORMS,
    "norm_placement": NORM_PLACEMENTS,
    "pos_embedding": POSITIONS,
}
_FIELD_NAMES_ORDERED = tuple(f.name for f in dataclasses.fields(ArchConfig))
_FIELD_NAMES = frozenset(_FIELD_NAMES_ORDERED)
_DERIVABLE = frozenset({"n_kv_heads", "head_dim"})  # the JSON form may leave these out


def _derived_head_dim(d_model: Any, n_heads: Any) -> Any:
    """`d_model // n_heads` for the JSON form's omitted head_dim: only derived when not given, as
    some models' heads are wider than the residual stream allows (Gemma-7B: 16 x 256 on 3072)."""
    ints = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (d_model, n_heads))
    if not ints:
        # Validation checks d_model and n_heads before head_dim, so it reports the real problem.
        return d_model
    if d_model % n_heads:
        raise ConfigError(
            f"head_dim is omitted and n_heads={n_heads} does not divide d_model={d_model}; "
            "give head_dim explicitly"
        )
    return d_model // n_heads


def check_size(name: str, value: int | None) -> None:
    """A size (an `ArchConfig` integer, or a knob that derives one) is at most `MAX_SIZE`; a
    huge one is named by its number of digits, not echoed (400 digits would flood the line)."""
    if value is not None and value > MAX_SIZE:
        raise ConfigError(f"{name} must be at most 2**53, got {short_number(value)}")


def _parse_json(text: str, source: str) -> Any:
    """JSON text as Python data, or a one-line `ConfigError` naming `source`."""
    return parse_json(text, source, ConfigError, "a config")


# The document `archsearch export --format json` writes (`space.export.JsonFormat`): the config
# under "config", beside the trial's results and provenance.
EXPORT_KEYS = ("config", "results", "provenance")


def load_config(path: str | Path) -> ArchConfig:
    """Read an ArchConfig JSON file, or the `archsearch.json` that `export --format json` writes
    (its `config` object is the shape; results and provenance are not read).

    Raises:
        ConfigError: the file is missing or unreadable, not JSON, or neither a valid config nor
            an export document holding one.
    """
    path = Path(path)
    source = str(path)
    data = _parse_json(read_text(path, "config file", ConfigError), source)
    if isinstance(data, Mapping) and "config" in data:  # "config" is no ArchConfig field
        unknown = sorted(set(data) - set(EXPORT_KEYS))
        if unknown:
            raise ConfigError(
                f"{source}: unknown key(s) beside 'config': {', '.join(map(quoted, unknown))}; an export "
                f"document (`archsearch export --format json`) has only {', '.join(EXPORT_KEYS)}"
            )
        data, source = data["config"], f"{source} (its 'config')"
    try:
        return ArchConfig.from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def save_config(cfg: ArchConfig, path: str | Path) -> None:
    """Write `cfg` as JSON, replacing the file whole (never half-written)."""
    write_atomic(path, (cfg.to_json() + "\n").encode("utf-8"))
