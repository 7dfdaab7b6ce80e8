"""Export formats: every format on every preset (shrunk) and on random shapes.

Exactness is checked against the targets themselves where they are installed: a Hugging Face
config loads in transformers, has `param_counts(cfg).total` parameters and, with the proxy's
weights copied in, computes the proxy's logits. litgpt is not installed here, so its YAML is read
back by litgpt's documented field names and counted with litgpt's module layout
(litgpt/model.py); nanoGPT's GPTConfig fields are counted with nanoGPT's layout (model.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest
import yaml  # PyYAML: a dependency of ray and optuna, and what litgpt's Config.from_file uses
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archsearch.errors import ArchsearchError, UnknownNameError
from archsearch.space import PRESETS, ArchConfig, param_counts, preset
from archsearch.space.export import (
    EXPORT_FORMATS,
    HF_MODEL_TYPES,
    NANOGPT_FIELDS,
    ExportFormat,
    ExportRefused,
    config_provenance,
    export_files,
    hf_model_type,
    litgpt_config,
    nanogpt_config,
    parse_flops,
)
from tests.helpers import load_hf, proxy_weights_as_hf
from tests.strategies import arch_configs

# --- shapes -----------------------------------------------------------------------------------


def shrink(cfg: ArchConfig) -> ArchConfig:
    """The same variants and head layout (MHA/GQA, q_dim vs d_model, d_ff ratio) at toy size."""
    groups = cfg.n_heads // cfg.n_kv_heads
    n_heads = 8 if groups > 1 else 4
    head_dim = 16
    d_model = round(n_heads * head_dim * cfg.d_model / cfg.q_dim)
    return dataclasses.replace(
        cfg,
        vocab_size=97,
        seq_len=16,
        d_model=d_model,
        n_layers=2,
        n_heads=n_heads,
        n_kv_heads=n_heads // min(groups, n_heads),
        head_dim=head_dim,
        d_ff=round(d_model * cfg.d_ff / cfg.d_model),
    )


TINY = dict(vocab_size=97, seq_len=16, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=96)
GPT2 = dict(
    TINY, n_kv_heads=4, d_ff=256, activation="gelu", norm="layernorm", pos_embedding="learned",
    bias=True, tie_embeddings=True,
)  # fmt: skip


def tiny(**changes) -> ArchConfig:
    return ArchConfig(**{**TINY, **changes})


def gpt2_like(**changes) -> ArchConfig:
    return ArchConfig(**{**GPT2, **changes})


PRESET_SHAPES = {name: shrink(p.config) for name, p in PRESETS.items()}
# Beyond the presets: one shape per HF model type and variant the presets do not reach.
EXTRA_SHAPES = {
    "llama-bias-mqa": tiny(bias=True, n_kv_heads=1),
    "llama-reglu-tied": tiny(activation="reglu", tie_embeddings=True),
    "llama-head-dim-not-d-model-over-heads": tiny(head_dim=24),
    "qwen3-qk-norm": tiny(qk_norm=True),
    "qwen3-odd-width": tiny(qk_norm=True, d_model=50, activation="geglu", tie_embeddings=True),
    "gpt2-relu-untied": gpt2_like(activation="relu", d_ff=100, tie_embeddings=False),
    "gpt2-silu": gpt2_like(activation="silu"),
    "gpt-neox-rope": gpt2_like(pos_embedding="rope", tie_embeddings=False),
    "gpt-neox-rope-tied": gpt2_like(pos_embedding="rope", activation="relu"),
}
SHAPES = {**PRESET_SHAPES, **EXTRA_SHAPES}

# What each preset's shape is in each format: a target, or the field the refusal names.
EXPECTED_PRESETS = {
    "gpt2": {"hf": "gpt2", "litgpt": "pos_embedding='learned'", "nanogpt": "ok", "json": "ok"},
    "llama": {"hf": "llama", "litgpt": "ok", "nanogpt": "norm='rmsnorm'", "json": "ok"},
    "mistral": {"hf": "llama", "litgpt": "ok", "nanogpt": "norm='rmsnorm'", "json": "ok"},
    "gemma": {"hf": "llama", "litgpt": "tie_embeddings=True", "nanogpt": "norm='rmsnorm'", "json": "ok"},
    "byte": {"hf": "llama", "litgpt": "ok", "nanogpt": "norm='rmsnorm'", "json": "ok"},
}


def _family(preset_name: str) -> str:
    return next(f for f in EXPECTED_PRESETS if preset_name.startswith(f))


# --- the registry -----------------------------------------------------------------------------


def test_the_registry_holds_the_four_formats_and_rejects_duplicates():
    assert EXPORT_FORMATS.names() == ("hf", "litgpt", "nanogpt", "json")
    with pytest.raises(ValueError, match="duplicate export format 'hf'"):
        EXPORT_FORMATS.register("hf", EXPORT_FORMATS["hf"])
    with pytest.raises(
        UnknownNameError, match="unknown export format 'onnx'; valid: hf, litgpt, nanogpt, json"
    ):
        export_files("onnx", preset("byte-1m"), {})


def test_the_fixed_constants_are_the_proxys():
    torch = pytest.importorskip("torch")
    from archsearch.evaluators import model
    from archsearch.space import export

    assert (export.ROPE_THETA, export.NORM_EPS, export.INIT_STD) == (
        model.ROPE_THETA,
        model.NORM_EPS,
        model.INIT_STD,
    )
    x = torch.linspace(-6, 6, 101)
    tanh_gelu = torch.nn.functional.gelu(x, approximate=export.GELU_APPROXIMATE)
    assert torch.equal(model.POINTWISE["gelu"](x), tanh_gelu)


@pytest.mark.parametrize("fmt", EXPORT_FORMATS.names())
@pytest.mark.parametrize("name", PRESET_SHAPES)
def test_each_preset_is_exported_or_refused_as_expected(name, fmt):
    cfg = PRESET_SHAPES[name]
    expected = EXPECTED_PRESETS[_family(name)][fmt]
    reason = EXPORT_FORMATS[fmt].refusal(cfg)
    if fmt == "hf":
        assert hf_model_type(cfg) == expected
    if fmt == "hf" or expected == "ok":
        assert reason is None
        files = export_files(fmt, cfg, config_provenance(cfg))
        assert files and all(isinstance(v, bytes) and v for v in files.values())
    else:
        assert reason is not None
        with pytest.raises(ExportRefused, match=expected):
            export_files(fmt, cfg, {})


# --- hf: loads in transformers with the exact count and the proxy's function ---------------------


@pytest.fixture(scope="module")
def transformers():
    os.environ["HF_HUB_OFFLINE"] = "1"  # from_pretrained on a local folder; never the network
    module = pytest.importorskip(
        "transformers", reason="transformers is not installed (the test extra has it)"
    )
    module.logging.set_verbosity_error()
    return module


def _unique_parameters(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


@pytest.mark.parametrize("name", [n for n, c in SHAPES.items() if hf_model_type(c) is not None])
def test_hf_config_loads_with_the_exact_count_and_computes_the_proxys_logits(name, transformers, tmp_path):
    torch = pytest.importorskip("torch")
    from archsearch.evaluators.model import ProxyLM

    cfg = SHAPES[name]
    model = load_hf(transformers, cfg, tmp_path)
    assert model.config.model_type == hf_model_type(cfg)
    assert _unique_parameters(model) == param_counts(cfg).total

    torch.manual_seed(0)
    proxy = ProxyLM(cfg).eval()
    with torch.no_grad():  # non-trivial norm scales and biases, so a swapped pair would show
        for p in proxy.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    # GPT-NeoX's head is "embed_out" in transformers 4.x, "lm_head" in 5.
    head_key = next(k for k in ("lm_head.weight", "embed_out.weight") if k in model.state_dict())
    weights = proxy_weights_as_hf(proxy, cfg, hf_model_type(cfg), head_key)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and not missing
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    with torch.no_grad():
        theirs = model.eval()(input_ids=idx).logits
        ours = proxy(idx)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=arch_configs(max_width=48, max_layers=2))
def test_random_shapes_are_refused_with_a_named_field_or_load_exactly(cfg, transformers, tmp_path_factory):
    for fmt in EXPORT_FORMATS.names():
        reason = EXPORT_FORMATS[fmt].refusal(cfg)
        if reason is not None:
            assert any(f"{f.name}=" in reason for f in dataclasses.fields(ArchConfig)), reason
            with pytest.raises(ExportRefused):
                export_files(fmt, cfg, {})
            continue
        files = export_files(fmt, cfg, config_provenance(cfg))
        if fmt == "hf":
            model = load_hf(transformers, cfg, tmp_path_factory.mktemp("hf"))
            assert _unique_parameters(model) == param_counts(cfg).total
        elif fmt == "litgpt":
            assert litgpt_param_count(yaml.safe_load(files["model_config.yaml"])) == param_counts(cfg).total
        elif fmt == "nanogpt":
            assert nanogpt_param_count(json.loads(files["gpt_config.json"])) == param_counts(cfg).total


@st.composite
def llama_or_gpt_like(draw: st.DrawFn) -> ArchConfig:
    """Random sizes on the variant sets the HF model types accept, so most draws are exported."""
    n_kv = draw(st.integers(1, 4))
    n_heads = n_kv * draw(st.integers(1, 3))
    head_dim = 2 * draw(st.integers(1, 8))
    if draw(st.booleans()):  # LLaMA / Qwen3
        qk_norm = draw(st.booleans())
        fixed = dict(
            norm="rmsnorm",
            pos_embedding="rope",
            activation=draw(st.sampled_from(["swiglu", "geglu", "reglu"])),
            qk_norm=qk_norm,
            bias=not qk_norm and draw(st.booleans()),
            d_model=n_heads * draw(st.integers(1, 12)),
        )
    else:  # GPT-2 / GPT-NeoX
        fixed = dict(
            norm="layernorm",
            pos_embedding=draw(st.sampled_from(["learned", "rope"])),
            activation=draw(st.sampled_from(["gelu", "relu", "silu"])),
            bias=True,
            d_model=n_heads * head_dim,
        )
        n_kv = n_heads
    return ArchConfig(
        vocab_size=draw(st.integers(2, 64)),
        seq_len=draw(st.integers(1, 16)),
        n_layers=draw(st.integers(1, 2)),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        d_ff=draw(st.integers(1, 64)),
        tie_embeddings=draw(st.booleans()),
        **fixed,
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=llama_or_gpt_like())
def test_random_llama_and_gpt_shapes_load_in_transformers_exactly(cfg, transformers, tmp_path_factory):
    assert EXPORT_FORMATS["hf"].refusal(cfg) is None
    model = load_hf(transformers, cfg, tmp_path_factory.mktemp("hf"))
    assert model.config.model_type == hf_model_type(cfg)
    assert _unique_parameters(model) == param_counts(cfg).total


def test_hf_config_says_what_the_proxy_fixed():
    cfg = PRESET_SHAPES["llama3-8b"]
    files = export_files("hf", cfg, config_provenance(cfg))
    config = json.loads(files["config.json"])
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]) == (
        128,
        8,
        2,
    )
    assert (config["head_dim"], config["intermediate_size"], config["max_position_embeddings"]) == (
        16,
        448,
        16,
    )
    assert (config["rope_theta"], config["rms_norm_eps"], config["hidden_act"]) == (10000.0, 1e-5, "silu")
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}
    assert not config["attention_bias"] and not config["mlp_bias"] and not config["tie_word_embeddings"]
    readme = files["README.md"].decode()
    assert (
        "RoPE theta 10000, norm eps 1e-05" in readme and f"{param_counts(cfg).total:,} parameters" in readme
    )


# --- refusals ---------------------------------------------------------------------------------

REFUSALS = [
    pytest.param(
        "hf",
        tiny(norm_placement="post"),
        r"llama, qwen3, gpt2, gpt_neox: norm_placement='post'",
        id="hf-post-norm",
    ),
    pytest.param(
        "hf",
        gpt2_like(norm_placement="sandwich"),
        r"norm_placement='sandwich' \(pre-norm only",
        id="hf-sandwich",
    ),
    pytest.param(
        "hf", tiny(parallel_block=True), r"parallel_block=True \(serial blocks only\)", id="hf-parallel"
    ),
    pytest.param(
        "hf",
        tiny(pos_embedding="learned"),
        r"llama, qwen3: pos_embedding='learned'",
        id="hf-learned-positions-with-llama",
    ),
    pytest.param("hf", tiny(pos_embedding="none"), r"pos_embedding='none'", id="hf-no-positions"),
    pytest.param(
        "hf",
        tiny(activation="silu"),
        r"llama, qwen3: activation='silu' \(gated MLP only",
        id="hf-plain-silu-in-llama",
    ),
    pytest.param(
        "hf",
        gpt2_like(activation="swiglu"),
        r"gpt2: activation='swiglu' \(plain MLP only",
        id="hf-swiglu-with-layernorm",
    ),
    pytest.param(
        "hf",
        tiny(qk_norm=True, bias=True),
        r"qwen3: bias=True \(no MLP biases\)",
        id="hf-qk-norm-with-biases",
    ),
    pytest.param(
        "hf",
        gpt2_like(bias=False),
        r"gpt2: bias=False \(every linear and LayerNorm has a bias",
        id="hf-layernorm-without-biases",
    ),
    pytest.param(
        "hf", gpt2_like(n_kv_heads=2), r"n_kv_heads=2 \(multi-head attention only", id="hf-gqa-gpt2"
    ),
    pytest.param(
        "hf", gpt2_like(head_dim=32), r"n_heads \* head_dim = 128 != d_model = 64", id="hf-wide-heads-gpt2"
    ),
    pytest.param(
        "hf", tiny(d_model=50), r"llama: n_heads=4 \(.*d_model = 50 divisible", id="hf-llama-indivisible"
    ),
    pytest.param(
        "litgpt",
        tiny(tie_embeddings=True),
        r"tie_embeddings=True \(litgpt's lm_head is its own",
        id="litgpt-tied",
    ),
    pytest.param("litgpt", tiny(pos_embedding="learned"), r"pos_embedding='learned'", id="litgpt-learned"),
    pytest.param("litgpt", tiny(norm_placement="post"), r"norm_placement='post'", id="litgpt-post-norm"),
    pytest.param(
        "litgpt", tiny(activation="reglu"), r"activation='reglu' \(litgpt's MLPs are", id="litgpt-reglu"
    ),
    pytest.param("litgpt", tiny(activation="relu"), r"activation='relu'", id="litgpt-relu"),
    pytest.param(
        "litgpt",
        tiny(norm="layernorm"),
        r"bias=False \(litgpt's LayerNorm always",
        id="litgpt-biasless-layernorm",
    ),
    pytest.param("nanogpt", tiny(), r"norm='rmsnorm'", id="nanogpt-rmsnorm"),
    pytest.param("nanogpt", gpt2_like(pos_embedding="rope"), r"pos_embedding='rope'", id="nanogpt-rope"),
    pytest.param(
        "nanogpt",
        gpt2_like(d_ff=192),
        r"d_ff=192 \(nanoGPT's MLP is 4 \* n_embd = 256 wide\)",
        id="nanogpt-3x-mlp",
    ),
    pytest.param("nanogpt", gpt2_like(tie_embeddings=False), r"tie_embeddings=False", id="nanogpt-untied"),
    pytest.param("nanogpt", gpt2_like(activation="relu"), r"activation='relu'", id="nanogpt-relu"),
    pytest.param("nanogpt", gpt2_like(qk_norm=True), r"qk_norm=True", id="nanogpt-qk-norm"),
    pytest.param("nanogpt", gpt2_like(n_kv_heads=1), r"n_kv_heads=1", id="nanogpt-mqa"),
    pytest.param("nanogpt", gpt2_like(parallel_block=True), r"parallel_block=True", id="nanogpt-parallel"),
]


@pytest.mark.parametrize(("fmt", "cfg", "match"), REFUSALS)
def test_a_shape_the_format_cannot_represent_is_refused_with_the_reason(fmt, cfg, match):
    assert EXPORT_FORMATS[fmt].refusal(cfg) is not None
    with pytest.raises(ExportRefused, match=f"cannot be exported as {fmt}: .*{match}"):
        export_files(fmt, cfg, config_provenance(cfg))


def test_json_is_never_refused_and_round_trips_the_config():
    cfg = tiny(norm_placement="post", parallel_block=True, pos_embedding="none", activation="reglu")
    provenance = {"study": "s", "trial": 3, "results": {"loss": 1.25, "params_total": 7}, "device": None}
    [(name, data)] = export_files("json", cfg, provenance).items()
    doc = json.loads(data)
    assert name == "archsearch.json" and set(doc) == {"config", "results", "provenance"}
    assert ArchConfig.from_dict(doc["config"]) == cfg
    assert doc["results"] == {"loss": 1.25, "params_total": 7}
    assert doc["provenance"] == {"study": "s", "trial": 3, "device": None}


# --- litgpt: fields by litgpt's names, counted with litgpt's layout ----------------------------


def litgpt_param_count(f: dict) -> int:
    """Parameters of litgpt.GPT(Config(**f)), following litgpt/model.py module by module."""
    C, V, L = f["n_embd"], f["padded_vocab_size"], f["n_layer"]
    hs, nh, ng, inter = f["head_size"], f["n_head"], f["n_query_groups"], f["intermediate_size"]
    bias = f["bias"]

    def norm(width: int) -> int:  # torch.nn.LayerNorm always has a bias; litgpt's RMSNorm has none
        return width * (2 if f["norm_class_name"] == "LayerNorm" else 1)

    def linear(n_in: int, n_out: int, has_bias: bool) -> int:
        return n_in * n_out + (n_out if has_bias else 0)

    qkv = linear(C, (nh + 2 * ng) * hs, bias or f.get("attn_bias", False))
    proj = linear(nh * hs, C, bias)
    fc = {"GptNeoxMLP": 1, "LLaMAMLP": 2, "GemmaMLP": 2}[f["mlp_class_name"]]  # fc, or fc_1 and fc_2
    mlp = fc * linear(C, inter, bias) + linear(inter, C, bias)
    norms = norm(C) * (
        1  # norm_1
        + (0 if f.get("shared_attention_norm") else 1)  # norm_2
        + int(f.get("post_attention_norm", False))
        + int(f.get("post_mlp_norm", False))
    )
    qk = 2 * norm(hs) if f.get("norm_qk") else 0
    block = qkv + proj + mlp + norms + qk
    return V * C + L * block + norm(C) + linear(C, V, f.get("lm_head_bias", False))


LITGPT_SHAPES = {n: c for n, c in SHAPES.items() if EXPORT_FORMATS["litgpt"].refusal(c) is None} | {
    "parallel-shared-norm": tiny(parallel_block=True),
    "sandwich-layernorm-bias": tiny(norm_placement="sandwich", norm="layernorm", bias=True),
    "parallel-sandwich-geglu": tiny(parallel_block=True, norm_placement="sandwich", activation="geglu"),
    "gelu-qk-norm": tiny(activation="gelu", qk_norm=True, d_ff=256),
}


@pytest.mark.parametrize("name", LITGPT_SHAPES)
def test_litgpt_yaml_reads_back_field_by_field(name):
    cfg = LITGPT_SHAPES[name]
    files = export_files("litgpt", cfg, {"study": "Gemma-OLMo study", "trial": 12})
    assert set(files) == {"model_config.yaml", "README.md"}
    fields = yaml.safe_load(files["model_config.yaml"])
    assert fields == litgpt_config(cfg, 12)
    assert fields["name"] == "archsearch-trial-12"  # litgpt sniffs "Gemma" / "OLMo" in names
    expected = {
        "block_size": cfg.seq_len,
        "vocab_size": cfg.vocab_size,
        "padded_vocab_size": cfg.vocab_size,
        "n_layer": cfg.n_layers,
        "n_embd": cfg.d_model,
        "n_head": cfg.n_heads,
        "head_size": cfg.head_dim,
        "n_query_groups": cfg.n_kv_heads,
        "rotary_percentage": 1.0,
        "rope_base": 10000,
        "parallel_residual": cfg.parallel_block,
        "shared_attention_norm": cfg.parallel_block,
        "norm_class_name": {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[cfg.norm],
        "norm_eps": 1e-5,
        "post_attention_norm": cfg.norm_placement == "sandwich",
        "post_mlp_norm": cfg.norm_placement == "sandwich",
        "norm_qk": cfg.qk_norm,
        "bias": cfg.bias,
        "lm_head_bias": False,
        "intermediate_size": cfg.d_ff,
        "mlp_class_name": {"gelu": "GptNeoxMLP", "swiglu": "LLaMAMLP", "geglu": "GemmaMLP"}[cfg.activation],
    }
    for key, value in expected.items():
        assert fields[key] == value and type(fields[key]) is type(value), key
    assert fields.get("gelu_approximate") == ("tanh" if cfg.activation_spec.base == "gelu" else None)
    assert fields.get("norm_qk_type") == ("default" if cfg.qk_norm else None)
    assert litgpt_param_count(fields) == param_counts(cfg).total


@pytest.mark.parametrize(
    "value", [1e-5, 1.0, 10000.0, 2.5e20, 0.1, -3.0, 7, 0, True, False, None, "tanh", 'a "quoted": name']
)
def test_yaml_scalars_read_back_as_the_same_value_and_type(value):
    from archsearch.space.export import _yaml_scalar

    back = yaml.safe_load(f"key: {_yaml_scalar(value)}")["key"]
    assert back == value and type(back) is type(value)


# --- nanoGPT: exactly GPTConfig's fields, counted with nanoGPT's layout --------------------------


def nanogpt_param_count(g: dict) -> int:
    """Parameters of nanoGPT's GPT(GPTConfig(**g)): wte, wpe, per block ln_1, c_attn, c_proj,
    ln_2, c_fc, c_proj; ln_f; lm_head tied to wte (counted once, as `model.parameters()` does)."""
    C, b = g["n_embd"], g["bias"]
    ln = C * (2 if b else 1)

    def linear(n_in: int, n_out: int) -> int:
        return n_in * n_out + (n_out if b else 0)

    block = ln + linear(C, 3 * C) + linear(C, C) + ln + linear(C, 4 * C) + linear(4 * C, C)
    return g["vocab_size"] * C + g["block_size"] * C + g["n_layer"] * block + ln


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("name", [n for n in PRESET_SHAPES if n.startswith("gpt2")] + ["gpt2-full-size"])
def test_nanogpt_config_holds_gptconfigs_fields_and_counts_the_same(name, bias):
    cfg = preset("gpt2-small") if name == "gpt2-full-size" else PRESET_SHAPES[name]
    cfg = dataclasses.replace(cfg, bias=bias)
    files = export_files("nanogpt", cfg, {"study": "s", "trial": 1})
    fields = json.loads(files["gpt_config.json"])
    assert tuple(fields) == NANOGPT_FIELDS == ("block_size", "vocab_size", "n_layer", "n_head", "n_embd",
                                                "dropout", "bias")  # fmt: skip
    assert fields == nanogpt_config(cfg)
    assert fields == {
        "block_size": cfg.seq_len, "vocab_size": cfg.vocab_size, "n_layer": cfg.n_layers,
        "n_head": cfg.n_heads, "n_embd": cfg.d_model, "dropout": 0.0, "bias": bias,
    }  # fmt: skip
    assert nanogpt_param_count(fields) == param_counts(cfg).total
    if name == "gpt2-full-size" and bias:
        assert nanogpt_param_count(fields) == 124_439_808  # nanoGPT's GPT-2 124M, as published
    [note] = EXPORT_FORMATS["nanogpt"].notes(cfg)
    assert "nn.GELU() (exact erf)" in note and note in files["README.md"].decode()


def test_only_nanogpt_states_an_approximation():
    for name, fmt in EXPORT_FORMATS.items():
        for cfg in SHAPES.values():
            if name != "nanogpt" or fmt.refusal(cfg) is not None:
                assert fmt.notes(cfg) == ()


# --- the rest ---------------------------------------------------------------------------------


def test_hf_model_types_exclude_each_other():
    for cfg in SHAPES.values():
        fits = [n for n, t in HF_MODEL_TYPES.items() if all(r.holds(cfg) for r in t.rules)]
        assert len(fits) <= 1, fits


def test_every_format_is_an_export_format_with_a_description():
    for name, fmt in EXPORT_FORMATS.items():
        assert isinstance(fmt, ExportFormat) and fmt.name == name and fmt.description


@pytest.mark.parametrize(
    ("text", "flops"),
    [("1e9", 1e9), ("2G", 2e9), ("350M", 3.5e8), ("1.5 GFLOPs", 1.5e9), ("12k", 12e3), ("4e12", 4e12),
     (" 3T ", 3e12), ("7", 7.0), ("1P", 1e15)],
)  # fmt: skip
def test_parse_flops_reads_plain_and_si_numbers(text, flops):
    assert math.isclose(parse_flops(text), flops)


@pytest.mark.parametrize("text", ["", "G", "-1G", "0", "2X", "1e999", "nan", "inf", "2 G G", "1,5G"])
def test_parse_flops_rejects_what_is_not_a_positive_amount(text):
    with pytest.raises(ArchsearchError, match="must be a positive number"):
        parse_flops(text)
