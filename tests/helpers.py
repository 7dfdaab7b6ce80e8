"""Helpers the test modules share, so that no test module imports another's private names: the one
error line a refused command ends in, space files written for a test, a disk filled up, and an
exported config loaded in transformers with the proxy's weights, the storage-failure tests'
instant trials, their resume and their one-line message, and promotions stored without training."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from tests.specs import tiny_toml

if TYPE_CHECKING:
    from archsearch.space.config import ArchConfig

ROOT = Path(__file__).resolve().parents[1]
PROXY = "tokens = 2048\nbatch_size = 4\nevals = 4\neval_batches = 1\ndevice = 'cpu'"


def one_line(result, code: int | tuple[int, ...], *fragments: str, progress: bool = False) -> str:
    """The one error line (the only line on stderr; with `progress`, after the search's progress
    lines), checked for the exit code and `fragments`."""
    codes = code if isinstance(code, tuple) else (code,)
    assert result.exit_code in codes, result.output
    lines = result.stderr.strip().splitlines()
    if progress:
        assert all(line.startswith("[") for line in lines[:-1]), result.stderr
        lines = lines[-1:]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def space_file(tmp_path: Path, **tables: str) -> Path:
    """`tmp_path / "space.toml"` holding `tiny_toml(**tables)`."""
    path = tmp_path / "space.toml"
    path.write_text(tiny_toml(**tables))
    return path


def example_space(tmp_path: Path) -> Path:
    """`tmp_path / "s.toml"`: a copy of examples/tiny-hf.toml."""
    space = tmp_path / "s.toml"
    space.write_text((ROOT / "examples" / "tiny-hf.toml").read_text())
    return space


def fill_disk(folder: Path) -> None:
    """Write to `folder` until its file system is full."""
    with open(folder / "filler", "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError as exc:
            assert exc.errno == 28, exc  # ENOSPC


def load_hf(transformers, cfg: ArchConfig, tmp_path: Path):
    """A transformers model (random weights) from the files `export --format hf` writes for `cfg`."""
    from archsearch.space.export import config_provenance, export_files

    for name, data in export_files("hf", cfg, config_provenance(cfg)).items():
        (tmp_path / name).write_bytes(data)
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    return transformers.AutoModelForCausalLM.from_config(config)


def proxy_weights_as_hf(proxy, cfg: ArchConfig, model_type: str, head_key: str) -> dict:
    """The proxy's state dict under the transformers model type's names and layouts."""
    import torch

    sd = proxy.state_dict()
    out = {}
    linear_names = ("weight", "bias") if cfg.bias else ("weight",)
    for i in range(cfg.n_layers):
        p = f"blocks.{i}."
        qkv = {n: sd[p + f"attn.qkv.{n}"].split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim]) for n in linear_names}
        gate_up = {n: sd[p + f"mlp.up.{n}"].chunk(2) for n in linear_names} if cfg.gated else {}
        norm_names = ("weight", "bias") if cfg.bias and cfg.norm == "layernorm" else ("weight",)
        if model_type in ("llama", "qwen3"):
            h = f"model.layers.{i}."
            for n in linear_names:
                out[h + f"self_attn.q_proj.{n}"], out[h + f"self_attn.k_proj.{n}"] = qkv[n][0], qkv[n][1]
                out[h + f"self_attn.v_proj.{n}"] = qkv[n][2]
                out[h + f"self_attn.o_proj.{n}"] = sd[p + f"attn.out.{n}"]
                out[h + f"mlp.gate_proj.{n}"], out[h + f"mlp.up_proj.{n}"] = gate_up[n]
                out[h + f"mlp.down_proj.{n}"] = sd[p + f"mlp.down.{n}"]
            if cfg.qk_norm:
                out[h + "self_attn.q_norm.weight"] = sd[p + "attn.q_norm.weight"]
                out[h + "self_attn.k_norm.weight"] = sd[p + "attn.k_norm.weight"]
            out[h + "input_layernorm.weight"] = sd[p + "norm_in.0.weight"]
            out[h + "post_attention_layernorm.weight"] = sd[p + "norm_in.1.weight"]
        elif model_type == "gpt2":  # Conv1D: weights stored (in, out)
            h = f"transformer.h.{i}."
            out[h + "attn.c_attn.weight"] = sd[p + "attn.qkv.weight"].T
            out[h + "attn.c_attn.bias"] = sd[p + "attn.qkv.bias"]
            for ours, theirs in (
                ("attn.out", "attn.c_proj"),
                ("mlp.up", "mlp.c_fc"),
                ("mlp.down", "mlp.c_proj"),
            ):
                out[h + f"{theirs}.weight"] = sd[p + f"{ours}.weight"].T
                out[h + f"{theirs}.bias"] = sd[p + f"{ours}.bias"]
            for j, ln in enumerate(("ln_1", "ln_2")):
                for n in norm_names:
                    out[h + f"{ln}.{n}"] = sd[p + f"norm_in.{j}.{n}"]
        elif model_type == "gpt_neox":  # fused QKV interleaved by head: [q_h, k_h, v_h] per head
            h = f"gpt_neox.layers.{i}."
            for n in linear_names:
                rest = qkv[n][0].shape[1:]
                per_head = [t.reshape(cfg.n_heads, cfg.head_dim, *rest) for t in qkv[n]]
                out[h + f"attention.query_key_value.{n}"] = torch.stack(per_head, dim=1).reshape(-1, *rest)
                out[h + f"attention.dense.{n}"] = sd[p + f"attn.out.{n}"]
                out[h + f"mlp.dense_h_to_4h.{n}"] = sd[p + f"mlp.up.{n}"]
                out[h + f"mlp.dense_4h_to_h.{n}"] = sd[p + f"mlp.down.{n}"]
            for j, ln in enumerate(("input_layernorm", "post_attention_layernorm")):
                for n in norm_names:
                    out[h + f"{ln}.{n}"] = sd[p + f"norm_in.{j}.{n}"]
    final_norm = {
        "llama": "model.norm", "qwen3": "model.norm", "gpt2": "transformer.ln_f",
        "gpt_neox": "gpt_neox.final_layer_norm",
    }[model_type]  # fmt: skip
    for n in ("weight", "bias") if cfg.bias and cfg.norm == "layernorm" else ("weight",):
        out[f"{final_norm}.{n}"] = sd[f"norm_final.{n}"]
    embed = {
        "llama": "model.embed_tokens", "qwen3": "model.embed_tokens", "gpt2": "transformer.wte",
        "gpt_neox": "gpt_neox.embed_in",
    }[model_type]  # fmt: skip
    out[f"{embed}.weight"] = sd["tok_emb.weight"]
    if model_type == "gpt2":
        out["transformer.wpe.weight"] = sd["pos_emb.weight"]
    out[head_key] = sd["head.weight"]
    return out


# --- the storage-failure tests' searches -------------------------------------------------------------
N = 3  # trials of each storage-failure search


def instant(request, known=None, board=None):
    """A trial outcome at once, its loss a function of the shape: a search with no training."""
    from archsearch.trial import TrialOutcome

    loss = 2.0 + request.config.d_model / 1000 + request.config.n_layers / 100
    return TrialOutcome(status="complete", train={"val_loss": loss, "tokens": 64, "val_curve": [[64, loss]]})


def settled(url: str, complete: int) -> None:
    """Exactly `complete` complete trials of study "s", nothing running in either table, an intact file."""
    import optuna
    from sqlalchemy import text

    from archsearch.storage import Storage

    with Storage.open(url, create=False) as db:
        counts = db.counts("s")
        if db.is_sqlite:
            with db._engine.connect() as conn:
                assert conn.execute(text("PRAGMA integrity_check")).scalar() == "ok"
    assert counts.get("complete") == complete and set(counts) <= {"complete", "interrupted", "duplicate"}, (
        counts
    )
    states = {t.state.name for t in optuna.load_study(study_name="s", storage=url).trials}
    assert "RUNNING" not in states, states


def resume_search(url: str, lease_s: float = 120.0) -> None:
    """`search --resume` of study "s" (the tiny spec, `instant` trials) to `N`, then `settled`."""
    from archsearch.search.driver import SearchOptions, run_search
    from archsearch.storage import Storage
    from tests.specs import tiny_spec

    with Storage.open(url) as db:
        run_search(
            tiny_spec(),
            db,
            SearchOptions(study="s", trials=N, resume=True, lease_s=lease_s),
            evaluate_fn=instant,
        )
    settled(url, N)


def failure_message(url: str, doing: str, cause: str) -> str:
    """The pattern of the one line a search ends in when its database fails while `doing`."""
    from sqlalchemy.engine import make_url

    shown = re.escape(make_url(url).render_as_string(hide_password=True))
    return rf"^the database {shown} failed while {doing}: {cause}; the search stopped"


def store_promotions(db, study: str, budget: int, losses: dict[int, float]) -> None:
    """Complete promotions of `study`'s trials (number -> loss at `budget` tokens), stored as
    `promote_run` stores them (the loss objective is the loss: these studies' rule is plain), with
    a two-point curve: no training, no Ray."""
    records = {r.number: r for r in db.trials_by_number(study, list(losses))}
    for number, loss in losses.items():
        trial_id = records[number].id
        assert db.claim_promotion(study, trial_id, budget, lease_s=60) is None
        row = db.promotion_id(trial_id, budget)
        curve = [(budget // 2, loss + 0.1), (budget, loss)]
        db.finish_promotion(row, status="complete", val_loss=loss, objective=loss, val_curve=curve)


def table_without(table, column: str, *key: str):
    """`table` as an older schema version made it: without `column`, unique on `key` (and, here,
    with no foreign keys: the table lives in a metadata of its own), for the migration tests."""
    from sqlalchemy import Column, MetaData, Table, UniqueConstraint

    columns = [
        Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
        for c in table.columns
        if c.name != column
    ]
    return Table(table.name, MetaData(), *columns, UniqueConstraint(*key))
