from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings

from archsearch.errors import ConfigError
from archsearch.space import ArchConfig, load_config, preset, save_config
from tests.strategies import arch_configs

BASE = dict(
    vocab_size=256, seq_len=64, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=384
)


def make(**changes) -> ArchConfig:
    return ArchConfig(**{**BASE, **changes})


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"d_model": 0}, r"d_model must be positive, got 0"),
        ({"n_layers": -3}, r"n_layers must be positive"),
        ({"d_ff": 3.0}, r"d_ff must be an integer, got 3.0"),
        ({"n_heads": True}, r"n_heads must be an integer, got True"),
        ({"vocab_size": "256"}, r"vocab_size must be an integer"),
        ({"n_kv_heads": 3}, r"n_kv_heads=3 must divide n_heads=4"),
        ({"n_kv_heads": 8}, r"n_kv_heads=8 must divide n_heads=4"),
        (
            {"activation": "swish"},
            r"activation 'swish' is unknown; valid: relu, gelu, silu, reglu, geglu, swiglu",
        ),
        ({"norm": "batchnorm"}, r"norm 'batchnorm' is unknown; valid: layernorm, rmsnorm"),
        ({"norm_placement": "peri"}, r"norm_placement 'peri' is unknown; valid: pre, post, sandwich"),
        ({"pos_embedding": "alibi"}, r"pos_embedding 'alibi' is unknown; valid: rope, learned, none"),
        ({"head_dim": 33}, r"head_dim=33 must be even for rope positions"),
        ({"bias": 1}, r"bias must be true or false, got 1"),
        ({"activation": None}, r"activation must be a string"),
    ],
    ids=lambda v: v if isinstance(v, str) else ",".join(f"{k}={v[k]!r}" for k in v),
)
def test_invalid_shapes_name_the_field_and_rule(changes, match):
    with pytest.raises(ConfigError, match=match):
        make(**changes)


def test_odd_head_dim_is_fine_without_rope():
    assert make(head_dim=33, pos_embedding="learned").head_dim == 33


def test_derived_values_are_properties():
    cfg = make()
    assert (cfg.q_dim, cfg.kv_dim, cfg.kv_groups) == (128, 64, 2)
    assert cfg.attention_layout == "gqa"
    assert make(n_kv_heads=4).attention_layout == "mha"
    assert make(n_kv_heads=1).attention_layout == "mqa"
    assert cfg.aspect_ratio == 64.0
    assert cfg.d_ff_ratio == 3.0
    assert cfg.gated and not make(activation="gelu").gated
    field_names = {f.name for f in dataclasses.fields(cfg)}
    assert field_names.isdisjoint({"q_dim", "kv_dim", "kv_groups", "aspect_ratio", "d_ff_ratio", "gated"})


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        make().d_model = 64  # type: ignore[misc]


def test_replace_revalidates():
    with pytest.raises(ConfigError, match="n_kv_heads=2 must divide n_heads=3"):
        dataclasses.replace(make(), n_heads=3)


def test_json_keys_are_the_public_contract():
    assert list(make().to_dict()) == [
        "vocab_size", "seq_len", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff",
        "activation", "norm", "norm_placement", "pos_embedding", "parallel_block", "bias",
        "tie_embeddings", "qk_norm",
    ]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(arch_configs())
def test_json_round_trips_exactly(cfg):
    text = cfg.to_json()
    again = ArchConfig.from_json(text)
    assert again == cfg
    assert again.to_json() == text


def test_unknown_json_key_is_an_error():
    with pytest.raises(
        ConfigError, match=r"unknown ArchConfig key\(s\): dmodel, rope_theta; valid: vocab_size"
    ):
        ArchConfig.from_dict({**BASE, "dmodel": 1, "rope_theta": 1e4})


def test_missing_json_key_is_an_error():
    data = {k: v for k, v in BASE.items() if k not in ("d_ff", "seq_len")}
    with pytest.raises(ConfigError, match=r"missing ArchConfig key\(s\): seq_len, d_ff"):
        ArchConfig.from_dict(data)


def test_json_may_omit_head_dim_and_kv_heads():
    data = {k: v for k, v in BASE.items() if k not in ("head_dim", "n_kv_heads")}
    cfg = ArchConfig.from_dict(data)
    assert (cfg.head_dim, cfg.n_kv_heads) == (32, 4)


def test_omitted_head_dim_needs_divisibility():
    data = {k: v for k, v in BASE.items() if k != "head_dim"} | {"n_heads": 3, "n_kv_heads": 1}
    with pytest.raises(ConfigError, match=r"head_dim is omitted and n_heads=3 does not divide d_model=128"):
        ArchConfig.from_dict(data)


def test_omitted_head_dim_with_bad_width_reports_the_width():
    data = {k: v for k, v in BASE.items() if k != "head_dim"} | {"d_model": "128"}
    with pytest.raises(ConfigError, match=r"d_model must be an integer, got '128'"):
        ArchConfig.from_dict(data)


def test_explicit_head_dim_is_kept_even_when_it_does_not_multiply_to_d_model():
    gemma = preset("gemma-7b")
    assert gemma.n_heads * gemma.head_dim == 4096 != gemma.d_model
    assert ArchConfig.from_dict(gemma.to_dict()) == gemma


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[1, 2]", r"cfg.json: an ArchConfig must be a JSON object, got list"),
        ('{"d_model": 1', r"cfg.json: invalid JSON at line 1 column 14"),
        ("", r"cfg.json: invalid JSON at line 1 column 1"),
    ],
)
def test_bad_json_text(text, match):
    with pytest.raises(ConfigError, match=match):
        ArchConfig.from_json(text, source="cfg.json")


def test_load_and_save(tmp_path):
    path = tmp_path / "cfg.json"
    save_config(make(), path)
    assert load_config(path) == make()
    assert json.loads(path.read_text()) == make().to_dict()
    assert [p.name for p in tmp_path.iterdir()] == ["cfg.json"]


def test_load_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"config file not found: .*nope.json"):
        load_config(tmp_path / "nope.json")


def test_load_binary_file(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match=r"cannot read config file"):
        load_config(path)


def test_load_reads_the_config_of_an_export_document(tmp_path):
    # `archsearch export --format json` wraps the config with the trial's results and provenance.
    from archsearch.space.export import EXPORT_FORMATS

    files = EXPORT_FORMATS["json"].files(make(), {"study": "s", "trial": 3, "results": {"loss": 2.5}})
    path = tmp_path / "archsearch.json"
    path.write_bytes(files["archsearch.json"])
    assert load_config(path) == make()


@pytest.mark.parametrize(
    ("document", "match"),
    [
        ({"config": None}, r"x.json \(its 'config'\): an ArchConfig must be a JSON object, got NoneType"),
        ({"config": {}, "results": {}, "trial": 3}, r"x.json: unknown key\(s\) beside 'config': 'trial'"),
        ({"results": {}, "provenance": {}}, r"x.json: unknown ArchConfig key\(s\): provenance, results"),
    ],
    ids=["config-not-an-object", "a-key-beside-config", "no-config"],
)
def test_load_refuses_a_document_that_is_not_an_export(tmp_path, document, match):
    path = tmp_path / "x.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=match):
        load_config(path)


def test_load_refuses_json_nested_too_deeply_for_the_parser(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("[" * 100_000)  # json's decoder recursed until RecursionError
    with pytest.raises(ConfigError, match=r"x.json: invalid JSON: nested too deeply to be a config"):
        load_config(path)
