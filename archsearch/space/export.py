"""Export a searched shape for real trainers: Hugging Face `transformers`, litgpt, nanoGPT or JSON.

An export describes the proxy model that was trained and measured (`evaluators/model.py`),
exactly: the same modules, widths, norms, biases, positions and fixed constants, so the target
builds a model with `param_counts(cfg).total` parameters computing the same function. A shape a
format cannot represent exactly is refused with the reason (the field and its value), never
written approximately. The one stated exception is nanoGPT's GELU (see `NanoGPTFormat.notes`).

Each format is an `ExportFormat` in the `EXPORT_FORMATS` registry:
- `refusal(cfg)`: why the shape cannot be represented exactly, or None.
- `files(cfg, provenance)`: relative file name -> contents, for a representable shape.
- `notes(cfg)`: approximations the export states (printed and written beside the files).

Pure: no torch, no I/O, no storage. `provenance` is a plain dict (a trial's comes from
`search.selection.trial_provenance`); `fileio.write_tree` writes the files, all or nothing. Its
command line, `archsearch export`, is `archsearch.cli.export`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from archsearch.errors import ArchsearchError
from archsearch.registry import Registry
from archsearch.space.config import ArchConfig
from archsearch.space.costs import flop_counts, param_counts
from archsearch.units import SI_SUFFIXES, si_suffixes, si_value

# The proxy's fixed choices. They live in evaluators/model.py, which imports torch; a test pins
# these copies to the originals.
ROPE_THETA = 10_000.0  # model.ROPE_THETA
NORM_EPS = 1e-5  # model.NORM_EPS, for LayerNorm and RMSNorm alike
INIT_STD = 0.02  # model.INIT_STD
GELU_APPROXIMATE = "tanh"  # model.POINTWISE["gelu"] is F.gelu(approximate="tanh")


class ExportRefused(ArchsearchError):
    """A shape that a format cannot represent exactly; the message gives the reason."""

    def __init__(self, format_name: str, reason: str) -> None:
        super().__init__(f"cannot be exported as {format_name}: {reason}")
        self.format_name = format_name
        self.reason = reason


# ------------------------------------------------------------------------------------------------
# Rules: one structural fact of a target model each
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """A fact a target model imposes on the shape.

    Attributes:
        field: the ArchConfig field the refusal names (with its value).
        holds: whether `cfg` satisfies it.
        why: what the target does instead, or a function of the config that says it with numbers.
    """

    field: str
    holds: Callable[[ArchConfig], bool]
    why: str | Callable[[ArchConfig], str]

    def check(self, cfg: ArchConfig) -> str | None:
        if self.holds(cfg):
            return None
        why = self.why if isinstance(self.why, str) else self.why(cfg)
        return f"{self.field}={getattr(cfg, self.field)!r} ({why})"


def first_refusal(cfg: ArchConfig, rules: tuple[Rule, ...]) -> str | None:
    """The first rule `cfg` breaks, as a message; None when it keeps them all."""
    for rule in rules:
        message = rule.check(cfg)
        if message is not None:
            return message
    return None


PRE_NORM = Rule(
    "norm_placement",
    lambda c: c.norm_placement == "pre",
    "pre-norm only: one norm before each sublayer and one before the head",
)
SERIAL = Rule("parallel_block", lambda c: not c.parallel_block, "serial blocks only")
RMSNORM = Rule("norm", lambda c: c.norm == "rmsnorm", "RMSNorm only")
LAYERNORM = Rule("norm", lambda c: c.norm == "layernorm", "LayerNorm only")
ROPE = Rule("pos_embedding", lambda c: c.pos_embedding == "rope", "rotary positions only")
LEARNED = Rule("pos_embedding", lambda c: c.pos_embedding == "learned", "a learned position table only")
GATED = Rule(
    "activation", lambda c: c.gated, "gated MLP only, down(act(gate x) * up x): swiglu, geglu or reglu"
)
PLAIN = Rule("activation", lambda c: not c.gated, "plain MLP only, down(act(up x)): gelu, relu or silu")
NO_QK_NORM = Rule("qk_norm", lambda c: not c.qk_norm, "no query/key norm")
BIASES = Rule("bias", lambda c: c.bias, "every linear and LayerNorm has a bias, always")
MHA = Rule(
    "n_kv_heads", lambda c: c.n_kv_heads == c.n_heads, "multi-head attention only: n_kv_heads = n_heads"
)
HEADS_SPAN_D_MODEL = Rule(
    "head_dim",
    lambda c: c.q_dim == c.d_model,
    lambda c: f"head width is d_model / n_heads, but n_heads * head_dim = {c.q_dim} != d_model = {c.d_model}",
)


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode("utf-8")


def _readme(title: str, lines: list[str], provenance: Mapping[str, Any]) -> bytes:
    """A short README: what the files are, what is fixed, where the shape comes from."""
    out = [f"# {title}", "", *lines, ""]
    prov = provenance_lines(provenance)
    if prov:
        out += ["## Provenance", "", *prov, ""]
    return "\n".join(out).encode("utf-8")


def provenance_lines(provenance: Mapping[str, Any]) -> list[str]:
    """`provenance` as Markdown list items, for README files (results after the rest)."""

    def text(value: Any) -> str:
        if isinstance(value, list | tuple):
            return ", ".join(map(str, value))
        return json.dumps(value, sort_keys=True) if isinstance(value, dict) else str(value)

    results = provenance.get("results") or {}
    items = [(k, v) for k, v in provenance.items() if k != "results"] + list(results.items())
    return [f"- {k}: {text(v)}" for k, v in items if v is not None]


class ExportFormat:
    """One export target. Subclasses set `name`, `description` and implement the three methods."""

    name: str
    description: str

    def refusal(self, cfg: ArchConfig) -> str | None:
        """Why `cfg` cannot be represented exactly (naming the field and value); None if it can."""
        raise NotImplementedError

    def notes(self, cfg: ArchConfig) -> tuple[str, ...]:
        """Approximations this export states; empty when it is exact in every respect."""
        return ()

    def target(self, cfg: ArchConfig) -> str:
        """What the files describe, in a few words (e.g. "llama (LlamaForCausalLM)")."""
        return self.name

    def files(self, cfg: ArchConfig, provenance: Mapping[str, Any]) -> dict[str, bytes]:
        """Relative file name -> contents.

        Raises:
            ExportRefused: `cfg` cannot be represented exactly.
        """
        raise NotImplementedError

    def _check(self, cfg: ArchConfig) -> None:
        reason = self.refusal(cfg)
        if reason is not None:
            raise ExportRefused(self.name, reason)


EXPORT_FORMATS: Registry[ExportFormat] = Registry("export format")


def export_files(format_name: str, cfg: ArchConfig, provenance: Mapping[str, Any]) -> dict[str, bytes]:
    """The files of `cfg` in format `format_name`.

    Raises:
        UnknownNameError: no such format.
        ExportRefused: the format cannot represent `cfg` exactly.
    """
    return EXPORT_FORMATS[format_name].files(cfg, provenance)


# ------------------------------------------------------------------------------------------------
# hf: a config.json for Hugging Face transformers
# ------------------------------------------------------------------------------------------------
# The proxy's pointwise functions by `ActivationSpec.base`, as transformers' ACT2FN names.
# "gelu_pytorch_tanh" is F.gelu(approximate="tanh"), the proxy's own op (GPT-2's "gelu_new" is
# the same function written out by hand).
HF_ACTIVATIONS = {"relu": "relu", "gelu": "gelu_pytorch_tanh", "silu": "silu"}


def _rope_parameters() -> dict[str, Any]:
    # transformers 5 reads `rope_parameters`; 4.x reads `rope_theta` (and keeps the other key as
    # an unused attribute). Both say the same thing, so the file loads either way.
    return {"rope_type": "default", "rope_theta": ROPE_THETA}


def _hf_common(cfg: ArchConfig) -> dict[str, Any]:
    return {
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": cfg.tie_embeddings,
        "initializer_range": INIT_STD,
        # The proxy's tokenizer is not part of the shape (256 is raw bytes): no special tokens.
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        "use_cache": True,
    }


def _rope_decoder(cfg: ArchConfig, architecture: str, model_type: str) -> dict[str, Any]:
    """The fields Llama and Qwen3 share: a pre-norm RMSNorm, gated-MLP, RoPE decoder."""
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": HF_ACTIVATIONS[cfg.activation_spec.base],
        "max_position_embeddings": cfg.seq_len,
        "rms_norm_eps": NORM_EPS,
        "rope_theta": ROPE_THETA,
        "rope_parameters": _rope_parameters(),
        "attention_dropout": 0.0,
        **_hf_common(cfg),
    }


def _llama(cfg: ArchConfig) -> dict[str, Any]:
    return {
        **_rope_decoder(cfg, "LlamaForCausalLM", "llama"),
        # The proxy's bias flag covers Q, K, V, O and all three MLP matrices, as these two do.
        "attention_bias": cfg.bias,
        "mlp_bias": cfg.bias,
        "pretraining_tp": 1,
    }


def _qwen3(cfg: ArchConfig) -> dict[str, Any]:
    return {
        **_rope_decoder(cfg, "Qwen3ForCausalLM", "qwen3"),
        "attention_bias": False,
        # Full causal attention in every layer, as the proxy.
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": cfg.n_layers,
        "layer_types": ["full_attention"] * cfg.n_layers,
    }


def _gpt2(cfg: ArchConfig) -> dict[str, Any]:
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_positions": cfg.seq_len,
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layers,
        "n_head": cfg.n_heads,
        "n_inner": cfg.d_ff,
        "activation_function": HF_ACTIVATIONS[cfg.activation_spec.base],
        "layer_norm_epsilon": NORM_EPS,
        # The proxy trains without dropout (GPT2Config defaults to 0.1 for each).
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": True,  # 1/sqrt(head_dim), as SDPA
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        **_hf_common(cfg),
    }


def _gpt_neox(cfg: ArchConfig) -> dict[str, Any]:
    return {
        "architectures": ["GPTNeoXForCausalLM"],
        "model_type": "gpt_neox",
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "hidden_act": HF_ACTIVATIONS[cfg.activation_spec.base],
        "max_position_embeddings": cfg.seq_len,
        "layer_norm_eps": NORM_EPS,
        # GPT-NeoX rotates a quarter of each head by default; the proxy rotates all of it.
        # transformers 4.x reads rotary_pct / rotary_emb_base, 5 reads rope_parameters.
        "rotary_pct": 1.0,
        "rotary_emb_base": int(ROPE_THETA),
        "rope_parameters": {**_rope_parameters(), "partial_rotary_factor": 1.0},
        # Serial: x + attn(ln1(x)), then + mlp(ln2(x)). NeoX's parallel form has two input norms,
        # the proxy's one, so parallel blocks are refused.
        "use_parallel_residual": False,
        "attention_bias": True,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        **_hf_common(cfg),
    }


@dataclass(frozen=True)
class HFModelType:
    """A stock transformers model type and the shapes it represents exactly."""

    architecture: str
    rules: tuple[Rule, ...]
    config: Callable[[ArchConfig], dict[str, Any]]


# Checked in this order; the rules of any two types exclude each other, so at most one fits.
HF_MODEL_TYPES: Registry[HFModelType] = Registry("transformers model type")
HF_MODEL_TYPES.register(
    "llama",
    HFModelType(
        "LlamaForCausalLM",
        (
            PRE_NORM, SERIAL, RMSNORM, ROPE, GATED,
            Rule("qk_norm", lambda c: not c.qk_norm, "no query/key norm; qwen3 has one"),
            # transformers 5's LlamaConfig validates this even with an explicit head_dim.
            Rule(
                "n_heads",
                lambda c: c.d_model % c.n_heads == 0,
                lambda c: f"transformers' LlamaConfig needs d_model = {c.d_model} divisible by n_heads",
            ),
        ),
        _llama,
    ),
)  # fmt: skip
HF_MODEL_TYPES.register(
    "qwen3",
    HFModelType(
        "Qwen3ForCausalLM",
        (
            PRE_NORM, SERIAL, RMSNORM, ROPE, GATED,
            Rule("qk_norm", lambda c: c.qk_norm, "always has a per-head RMSNorm on queries and keys"),
            Rule("bias", lambda c: not c.bias, "no MLP biases"),
        ),
        _qwen3,
    ),
)  # fmt: skip
HF_MODEL_TYPES.register(
    "gpt2",
    HFModelType(
        "GPT2LMHeadModel",
        (PRE_NORM, SERIAL, LAYERNORM, LEARNED, PLAIN, NO_QK_NORM, BIASES, MHA, HEADS_SPAN_D_MODEL),
        _gpt2,
    ),
)
HF_MODEL_TYPES.register(
    "gpt_neox",
    HFModelType(
        "GPTNeoXForCausalLM",
        (PRE_NORM, SERIAL, LAYERNORM, ROPE, PLAIN, NO_QK_NORM, BIASES, MHA, HEADS_SPAN_D_MODEL),
        _gpt_neox,
    ),
)


def hf_model_type(cfg: ArchConfig) -> str | None:
    """The transformers model type that represents `cfg` exactly, or None."""
    for name, model_type in HF_MODEL_TYPES.items():
        if first_refusal(cfg, model_type.rules) is None:
            return name
    return None


class HFFormat(ExportFormat):
    name = "hf"
    description = "config.json for Hugging Face transformers (AutoConfig / AutoModelForCausalLM)"

    def refusal(self, cfg: ArchConfig) -> str | None:
        if hf_model_type(cfg) is not None:
            return None
        # Each type's first broken rule; types that break the same rule share one clause.
        by_reason: dict[str, list[str]] = {}
        for name, model_type in HF_MODEL_TYPES.items():
            by_reason.setdefault(first_refusal(cfg, model_type.rules) or "", []).append(name)
        clauses = [f"{', '.join(names)}: {reason}" for reason, names in by_reason.items()]
        return "no stock transformers model type represents it exactly; " + "; ".join(clauses)

    def target(self, cfg: ArchConfig) -> str:
        name = hf_model_type(cfg)
        return f"{name} ({HF_MODEL_TYPES[name].architecture})" if name else self.name

    def files(self, cfg: ArchConfig, provenance: Mapping[str, Any]) -> dict[str, bytes]:
        self._check(cfg)
        name = hf_model_type(cfg)
        assert name is not None  # _check passed
        config = HF_MODEL_TYPES[name].config(cfg)
        what = (
            "the trial's design at the scaled size"
            if provenance.get("scaled")
            else "archsearch's proxy model"
        )
        readme = [
            f"`config.json` describes {what} as `{name}` "
            f"(`{HF_MODEL_TYPES[name].architecture}`), exactly: "
            f"{param_counts(cfg).total:,} parameters.",
            "",
            "```python",
            "from transformers import AutoConfig, AutoModelForCausalLM",
            "model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(FOLDER))",
            "```",
            "",
            f"Fixed by the proxy, not searched: RoPE theta {ROPE_THETA:g}, norm eps {NORM_EPS:g}, "
            "GELU in its tanh form, no dropout, no special token ids.",
            f"A config only: no weights, no tokenizer; vocab_size is {cfg.vocab_size}"
            + (" (256 = bytes, as the proxy's)." if cfg.vocab_size == 256 else "."),
        ]
        return {
            "config.json": _json_bytes(config),
            "README.md": _readme(f"{_title(provenance)}: Hugging Face config", readme, provenance),
        }


# ------------------------------------------------------------------------------------------------
# litgpt: a model_config.yaml of litgpt.Config fields
# ------------------------------------------------------------------------------------------------
# litgpt (litgpt/config.py, litgpt/model.py): Block is norm_1 -> attn -> post_attention_norm ->
# add, then norm_2 -> mlp -> post_mlp_norm -> add (or both branches from one shared norm when
# parallel), always ln_f before a separate lm_head; RoPE over rotary_percentage of each head in the
# rotate-half layout the proxy uses; LayerNorm is torch's (always with a bias), RMSNorm has no bias.
LITGPT_MLPS = {"gelu": "GptNeoxMLP", "swiglu": "LLaMAMLP", "geglu": "GemmaMLP"}
LITGPT_RULES = (
    Rule(
        "norm_placement",
        lambda c: c.norm_placement != "post",
        "litgpt has no norm after the residual add and always a final norm ln_f",
    ),
    Rule(
        "pos_embedding",
        lambda c: c.pos_embedding == "rope",
        "litgpt has rotary positions only; no position table, and rotary_percentage 0 is not a "
        "documented way to turn RoPE off",
    ),
    Rule(
        "tie_embeddings",
        lambda c: not c.tie_embeddings,
        "litgpt's lm_head is its own matrix; litgpt.Config has no weight tying",
    ),
    Rule(
        "activation",
        lambda c: c.activation in LITGPT_MLPS,
        "litgpt's MLPs are GptNeoxMLP (gelu), LLaMAMLP (swiglu) and GemmaMLP (geglu)",
    ),
    Rule(
        "bias",
        lambda c: c.bias or c.norm != "layernorm",
        "litgpt's LayerNorm always has a bias; bias=False with layernorm has none",
    ),
)
# litgpt picks classes by substrings of `name` ("Gemma" adds 1 to RMSNorm scales, "OLMo" drops
# LayerNorm's affine), so the name never carries a user's study name.
_LITGPT_SAFE_NAME = re.compile(r"archsearch(-trial-\d+)?")


def _yaml_scalar(value: Any) -> str:
    """A YAML 1.1 scalar that PyYAML's safe_load reads back as the same Python value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"no YAML form for {value!r} here")
        text = repr(value)
        # YAML 1.1 floats need a dot and a signed exponent: 1e-05 would read back as a string.
        mantissa, _, exponent = text.partition("e")
        if "." not in mantissa:
            mantissa += ".0"
        if exponent and exponent[0] not in "+-":
            exponent = "+" + exponent
        return f"{mantissa}e{exponent}" if exponent else mantissa
    if isinstance(value, str):
        return json.dumps(value)  # a double-quoted YAML scalar
    raise TypeError(f"no YAML scalar for {type(value).__name__}")


def litgpt_config(cfg: ArchConfig, trial: int | None = None) -> dict[str, Any]:
    """The litgpt.Config fields of `cfg` (documented names; see litgpt/config.py).

    Raises:
        ExportRefused: litgpt cannot represent `cfg` exactly.
    """
    reason = first_refusal(cfg, LITGPT_RULES)
    if reason is not None:
        raise ExportRefused("litgpt", reason)
    placement = cfg.placement
    fields: dict[str, Any] = {
        "name": "archsearch" if trial is None else f"archsearch-trial-{int(trial)}",
        "block_size": cfg.seq_len,
        "vocab_size": cfg.vocab_size,
        # Given explicitly, so litgpt does not round the vocabulary up to padding_multiple.
        "padded_vocab_size": cfg.vocab_size,
        "n_layer": cfg.n_layers,
        "n_embd": cfg.d_model,
        "n_head": cfg.n_heads,
        "head_size": cfg.head_dim,
        "n_query_groups": cfg.n_kv_heads,
        "rotary_percentage": 1.0,
        "rope_base": int(ROPE_THETA),
        "rope_condense_ratio": 1,
        # A parallel block's branches share one input norm (GPT-J / PaLM), as in the proxy.
        "parallel_residual": cfg.parallel_block,
        "shared_attention_norm": cfg.parallel_block,
        "norm_class_name": "RMSNorm" if cfg.norm == "rmsnorm" else "LayerNorm",
        "norm_eps": NORM_EPS,
        "post_attention_norm": placement.after,  # sandwich: a norm on each sublayer's output
        "post_mlp_norm": placement.after,
        "norm_qk": cfg.qk_norm,
        "bias": cfg.bias,  # every linear but the head; `attn_bias` (default off) is left out, as
        "lm_head_bias": False,  # older litgpt versions reject fields they do not know
        "mlp_class_name": LITGPT_MLPS[cfg.activation],
        "intermediate_size": cfg.d_ff,
        "scale_embeddings": False,
    }
    if cfg.qk_norm:
        fields["norm_qk_type"] = "default"  # per head, before RoPE; "olmo2" norms the whole width
    if cfg.activation_spec.base == "gelu":
        fields["gelu_approximate"] = GELU_APPROXIMATE
    assert _LITGPT_SAFE_NAME.fullmatch(fields["name"])
    return fields


class LitGPTFormat(ExportFormat):
    name = "litgpt"
    description = "model_config.yaml of litgpt.Config fields (Config.from_file)"

    def refusal(self, cfg: ArchConfig) -> str | None:
        return first_refusal(cfg, LITGPT_RULES)

    def target(self, cfg: ArchConfig) -> str:
        return f"litgpt ({LITGPT_MLPS.get(cfg.activation, '?')})"

    def files(self, cfg: ArchConfig, provenance: Mapping[str, Any]) -> dict[str, bytes]:
        self._check(cfg)
        fields = litgpt_config(cfg, provenance.get("trial"))
        fixed = ["rope_base", "norm_eps"] + (["gelu_approximate"] if "gelu_approximate" in fields else [])
        header = [
            f"# archsearch export: {_title(provenance)}; {param_counts(cfg).total:,} parameters.",
            f"# Fixed by the archsearch proxy, not searched: {', '.join(fixed)}.",
        ]
        body = [f"{key}: {_yaml_scalar(value)}" for key, value in fields.items()]
        readme = [
            "`model_config.yaml` holds litgpt.Config fields describing archsearch's proxy model "
            f"exactly: {param_counts(cfg).total:,} parameters.",
            "",
            "```python",
            "from litgpt import GPT, Config",
            'model = GPT(Config.from_file("model_config.yaml"))',
            "```",
            "",
            f"Fixed by the proxy, not searched: RoPE base {ROPE_THETA:g}, norm eps {NORM_EPS:g}, "
            "GELU in its tanh form, no dropout.",
        ]
        return {
            "model_config.yaml": ("\n".join(header + body) + "\n").encode("utf-8"),
            "README.md": _readme(f"{_title(provenance)}: litgpt config", readme, provenance),
        }


# ------------------------------------------------------------------------------------------------
# nanogpt: GPTConfig fields
# ------------------------------------------------------------------------------------------------
# nanoGPT (karpathy/nanoGPT model.py): wte + wpe, blocks of x + attn(ln_1 x), x + mlp(ln_2 x) with
# c_attn (3 n_embd), c_proj, c_fc (4 n_embd), nn.GELU(), c_proj; ln_f; lm_head tied to wte.
# `bias` switches every Linear's and LayerNorm's bias together, as the proxy's does.
NANOGPT_FIELDS = ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "dropout", "bias")
NANOGPT_RULES = (
    PRE_NORM,
    SERIAL,
    Rule("norm", lambda c: c.norm == "layernorm", "nanoGPT's norms are LayerNorm"),
    Rule("pos_embedding", lambda c: c.pos_embedding == "learned", "nanoGPT has a learned table wpe"),
    Rule("activation", lambda c: c.activation == "gelu", "nanoGPT's MLP is c_fc, GELU, c_proj"),
    Rule(
        "d_ff",
        lambda c: c.d_ff == 4 * c.d_model,
        lambda c: f"nanoGPT's MLP is 4 * n_embd = {4 * c.d_model} wide",
    ),
    Rule("tie_embeddings", lambda c: c.tie_embeddings, "nanoGPT ties lm_head to wte"),
    NO_QK_NORM,
    MHA,
    HEADS_SPAN_D_MODEL,
)


def nanogpt_config(cfg: ArchConfig) -> dict[str, Any]:
    """nanoGPT's GPTConfig fields for `cfg`, exactly `NANOGPT_FIELDS`.

    Raises:
        ExportRefused: nanoGPT cannot represent `cfg`.
    """
    reason = first_refusal(cfg, NANOGPT_RULES)
    if reason is not None:
        raise ExportRefused("nanogpt", reason)
    return {
        "block_size": cfg.seq_len,
        "vocab_size": cfg.vocab_size,  # not padded to 50304: the count stays exact
        "n_layer": cfg.n_layers,
        "n_head": cfg.n_heads,
        "n_embd": cfg.d_model,
        "dropout": 0.0,  # the proxy trains without dropout
        "bias": cfg.bias,
    }


class NanoGPTFormat(ExportFormat):
    name = "nanogpt"
    description = "gpt_config.json of nanoGPT's GPTConfig fields (GPTConfig(**json.load(f)))"

    def refusal(self, cfg: ArchConfig) -> str | None:
        return first_refusal(cfg, NANOGPT_RULES)

    def notes(self, cfg: ArchConfig) -> tuple[str, ...]:
        if self.refusal(cfg) is not None:
            return ()
        # GPTConfig has no activation field and nanoGPT's GELU is exact, so this one difference
        # cannot be written down in the config: it is stated instead.
        return (
            "nanoGPT's MLP uses nn.GELU() (exact erf); the proxy trained with the tanh form "
            "(they differ by at most 5e-4); shape and parameter count are exact",
        )

    def target(self, cfg: ArchConfig) -> str:
        return "nanoGPT GPTConfig"

    def files(self, cfg: ArchConfig, provenance: Mapping[str, Any]) -> dict[str, bytes]:
        self._check(cfg)
        readme = [
            "`gpt_config.json` holds nanoGPT's GPTConfig fields for archsearch's proxy model: "
            f"{param_counts(cfg).total:,} parameters (tied lm_head counted once).",
            "",
            "```python",
            "import json",
            "from model import GPT, GPTConfig",
            'model = GPT(GPTConfig(**json.load(open("gpt_config.json"))))',
            "```",
            "",
            *(f"Note: {note}." for note in self.notes(cfg)),
        ]
        return {
            "gpt_config.json": _json_bytes(nanogpt_config(cfg)),
            "README.md": _readme(f"{_title(provenance)}: nanoGPT config", readme, provenance),
        }


# ------------------------------------------------------------------------------------------------
# json: archsearch's own form, with results and provenance
# ------------------------------------------------------------------------------------------------
class JsonFormat(ExportFormat):
    name = "json"
    description = "archsearch.json: the ArchConfig JSON form, the trial's results and provenance"

    def refusal(self, cfg: ArchConfig) -> str | None:
        return None  # archsearch's own form holds every shape

    def target(self, cfg: ArchConfig) -> str:
        return "archsearch ArchConfig"

    def files(self, cfg: ArchConfig, provenance: Mapping[str, Any]) -> dict[str, bytes]:
        rest = {k: v for k, v in provenance.items() if k != "results"}
        document = {
            "config": cfg.to_dict(),
            "results": dict(provenance.get("results") or {}),
            "provenance": rest,
        }
        return {"archsearch.json": _json_bytes(document)}


for _format in (HFFormat(), LitGPTFormat(), NanoGPTFormat(), JsonFormat()):
    EXPORT_FORMATS.register(_format.name, _format)


# ------------------------------------------------------------------------------------------------
# Provenance of a shape without a trial (a trial's is `search.selection.trial_provenance`)
# ------------------------------------------------------------------------------------------------
def config_provenance(cfg: ArchConfig) -> dict[str, Any]:
    """Provenance of a shape with no trial behind it: its exact costs only."""
    from archsearch.version import __version__

    return {
        "archsearch_version": __version__,
        "results": {
            "params_total": param_counts(cfg).total,
            "flops_forward_per_token": flop_counts(cfg).forward,
        },
    }


def _title(provenance: Mapping[str, Any]) -> str:
    study, trial = provenance.get("study"), provenance.get("trial")
    scaled = provenance.get("scaled")
    if study is not None and trial is not None and scaled:
        target = scaled["target_params"]
        return f"study {study}, trial {trial} scaled to {target:,} parameters for {scaled['device']}"
    if study is not None and trial is not None:
        return f"study {study}, trial {trial}"
    return "archsearch shape"


# ------------------------------------------------------------------------------------------------
# FLOPs on the command line
# ------------------------------------------------------------------------------------------------
_FLOPS = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]?)\s*(?:FLOPs?)?\s*")


def parse_flops(text: str) -> float:
    """ "2e9", "2G", "1.5 GFLOPs", "350M" -> FLOPs as a float.

    Raises:
        ArchsearchError: not a positive number with an optional k/M/G/T/P suffix.
    """
    match = _FLOPS.fullmatch(text)
    known = match is not None and (not match.group(2) or match.group(2) in SI_SUFFIXES)
    value = float(si_value(match.group(1), match.group(2))) if known else math.nan  # type: ignore[union-attr]
    if not math.isfinite(value) or value <= 0:
        raise ArchsearchError(
            f"FLOPs {text!r} must be a positive number, optionally with {si_suffixes()} (e.g. 1e9 or 2G)"
        )
    return value
