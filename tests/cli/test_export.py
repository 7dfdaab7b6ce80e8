"""`archsearch export`: every selector, the --front index, refusals, and bad input that writes nothing.

The study is built through the Storage API (no Ray): complete trials of LLaMA-like, GPT-2-like and
post-norm shapes, one dominated, one failed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.cli.common import si
from archsearch.evaluators.hardware_serving import resolve_scenario, scenario_report
from archsearch.search.pareto import pareto_front
from archsearch.space import ArchConfig, flop_counts, param_counts
from archsearch.space.serve import ServeScenario, serve_costs
from archsearch.storage import Storage
from archsearch.trial import TrialOutcome

LLAMA = ArchConfig(
    vocab_size=256, seq_len=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64
)
GPT2 = ArchConfig(
    vocab_size=256, seq_len=32, d_model=48, n_layers=2, n_heads=4, n_kv_heads=4, head_dim=12, d_ff=192,
    activation="gelu", norm="layernorm", pos_embedding="learned", bias=True, tie_embeddings=True,
)  # fmt: skip
# number -> (shape, loss); None is the failed trial. FLOPs grow with the number (checked below).
TRIALS = {
    0: (LLAMA, 3.0),
    1: (GPT2, 2.6),
    2: (replace(LLAMA, d_model=64, n_layers=3, d_ff=128), 2.2),
    3: (replace(LLAMA, d_model=64, n_layers=4, d_ff=160), 2.4),  # dominated by trial 2
    4: None,
    5: (replace(LLAMA, d_model=96, n_layers=4, d_ff=256, norm_placement="post"), 1.9),  # hf: refused
}
DEVICE = {"fingerprint": "fp-cpu", "name": "test CPU", "type": "cpu"}
# Studies searched with a [serve] table: the scenario as the spec stores it, resolved (a GPU's
# memory is the limit when the table states none).
SERVED = {
    "served": resolve_scenario(
        ServeScenario(batch=4, prompt_len=1024, gen_len=256, device="h100-sxm", working_bytes=2 * 2**30)
    ),
    "served-local": ServeScenario(batch=2, prompt_len=256, gen_len=64, device="local"),
}
SPEC = dict(spec_fingerprint="f" * 64, spec_source="[model]\n", spec={"a": 1}, objectives=("loss", "flops"))


def _add_trials(db: Storage, study: str, trials: dict, spec: dict | None = None) -> None:
    db.create_study(study, **{**SPEC, "spec": spec or SPEC["spec"]})
    for number, entry in trials.items():
        slot = db.claim_trial(study, 100, lease_s=60)
        db.assign_trial(slot, number=number, optuna_trial_id=number, params={}, config=entry and entry[0])
        if entry is None:
            db.finish_trial(slot, TrialOutcome(status="failed", reason="out of memory"))
            continue
        train = {"val_loss": entry[1], "bits_per_byte": entry[1] / 0.69, "corpus_fingerprint": "corpus-abc"}
        db.finish_trial(slot, TrialOutcome(status="complete", train=train, device=DEVICE))


@pytest.fixture(scope="module")
def db_url(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("db") / "trials.db"
    url = f"sqlite:///{path}"
    with Storage.open(url) as db:
        _add_trials(db, "s", TRIALS)
        post = {n: (replace(LLAMA, norm_placement="post", d_model=32 * (n + 1)), 3.0 - n) for n in range(2)}
        _add_trials(db, "posts", post)
        for study, scenario in SERVED.items():  # stored as a search stores its [serve] table
            _add_trials(db, study, {0: TRIALS[2]}, spec={"space": {"serve": scenario.to_dict()}})
    return url


def _flops(number: int) -> float:
    return float(flop_counts(TRIALS[number][0]).forward)


def run(db_url: str, *args: str):
    return CliRunner().invoke(app, ["export", *args, "--storage", db_url])


def _one_error_line(result, message: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr


def test_the_fixture_study_has_growing_flops():
    complete = [n for n, e in TRIALS.items() if e]
    assert sorted(complete, key=_flops) == complete


# --- one trial ----------------------------------------------------------------------------------


def test_trial_as_hf_writes_a_llama_config_and_readme(db_url, tmp_path):
    out = tmp_path / "out"
    result = run(db_url, "--study", "s", "--trial", "2", "--format", "hf", "--output", str(out))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json"]
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["hidden_size"], config["num_hidden_layers"]) == ("llama", 64, 3)
    readme = (out / "README.md").read_text()
    assert "study s, trial 2" in readme and "corpus_fingerprint: corpus-abc" in readme
    assert result.stdout.strip() == f"{out}: trial 2 as llama (LlamaForCausalLM)"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging folder left behind


def test_trial_as_nanogpt_states_the_gelu_note(db_url, tmp_path):
    out = tmp_path / "nano"
    result = run(db_url, "--study", "s", "--trial", "1", "--format", "nanogpt", "--output", str(out))
    assert result.exit_code == 0, result.output
    assert json.loads((out / "gpt_config.json").read_text()) == {
        "block_size": 32,
        "vocab_size": 256,
        "n_layer": 2,
        "n_head": 4,
        "n_embd": 48,
        "dropout": 0.0,
        "bias": True,
    }
    assert "note: trial 1: nanoGPT's MLP uses nn.GELU() (exact erf)" in result.stderr


def test_trial_into_an_existing_empty_folder(db_url, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    result = run(db_url, "--study", "s", "--trial", "0", "--format", "litgpt", "--output", str(out))
    assert result.exit_code == 0, result.output
    assert (out / "model_config.yaml").read_text().count("n_embd: 32") == 1


def test_knee_as_json_carries_results_and_provenance(db_url, tmp_path):
    numbers = [n for n, e in TRIALS.items() if e]
    values = np.array([[TRIALS[n][1], _flops(n)] for n in numbers])
    knee = pareto_front(numbers, values, ("loss", "flops")).knee
    out = tmp_path / "knee"
    result = run(db_url, "--study", "s", "--knee", "--format", "json", "--output", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "archsearch.json").read_text())
    assert ArchConfig.from_dict(doc["config"]) == TRIALS[knee][0]
    assert doc["results"]["loss"] == TRIALS[knee][1]
    assert doc["results"]["flops_forward_per_token"] == _flops(knee)
    prov = doc["provenance"]
    assert (prov["study"], prov["trial"], prov["corpus_fingerprint"]) == ("s", knee, "corpus-abc")
    assert prov["device"] == DEVICE and prov["spec_fingerprint"] == "f" * 64 and prov["archsearch_version"]


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        pytest.param(lambda: f"{_flops(2):.17g}", 2, id="exactly-trial-2"),
        pytest.param(lambda: f"{_flops(3) * 1.01:.6g}", 2, id="under-trial-3"),
        pytest.param(lambda: f"{_flops(1) * 1.01:.6g}", 1, id="under-trial-1"),
        pytest.param(lambda: "1P", 5, id="si-suffix"),
    ],
)
def test_best_under_flops_is_the_lowest_loss_within_the_limit(db_url, tmp_path, limit, expected):
    out = tmp_path / "best"
    result = run(
        db_url, "--study", "s", "--best-under-flops", limit(), "--format", "json", "--output", str(out)
    )
    assert result.exit_code == 0, result.output
    assert json.loads((out / "archsearch.json").read_text())["provenance"]["trial"] == expected


# --- the front ----------------------------------------------------------------------------------


def test_front_writes_each_representable_member_and_an_index(db_url, tmp_path):
    out = tmp_path / "front"
    result = run(db_url, "--study", "s", "--front", "--format", "hf", "--output", str(out))
    assert result.exit_code == 0, result.output
    index = json.loads((out / "index.json").read_text())
    assert (index["study"], index["format"], index["objectives"]) == ("s", "hf", ["loss", "flops"])
    rows = {row["number"]: row for row in index["trials"]}
    assert [row["number"] for row in index["trials"]] == [5, 2, 1, 0]  # along the front, by loss
    assert [n for n, row in rows.items() if row["knee"]] == [index["knee"]]
    assert rows[5]["refused"].startswith("no stock transformers model type represents it exactly")
    assert "norm_placement='post'" in rows[5]["refused"] and rows[5]["folder"] is None
    assert (rows[2]["target"], rows[1]["target"]) == ("llama (LlamaForCausalLM)", "gpt2 (GPT2LMHeadModel)")
    assert rows[2]["loss"] == 2.2 and rows[2]["flops_forward_per_token"] == _flops(2)
    assert rows[2]["params_total"] > 0 and rows[2]["format"] == "hf"
    assert sorted(p.name for p in out.iterdir()) == ["index.json", "trial-0", "trial-1", "trial-2"]
    assert (out / "trial-1" / "config.json").is_file() and not (out / "trial-5").exists()
    assert "refused: trial 5 cannot be exported as hf: no stock transformers" in result.stderr
    assert len(result.stdout.strip().splitlines()) == 3


def test_front_with_no_representable_member_fails_and_writes_nothing(db_url, tmp_path):
    out = tmp_path / "none"
    result = run(db_url, "--study", "posts", "--front", "--format", "litgpt", "--output", str(out))
    _one_error_line(
        result, "no front member of 'posts' can be exported as litgpt: trial 1: norm_placement='post'"
    )
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_refused_trial_fails_with_the_reason_and_writes_nothing(db_url, tmp_path):
    out = tmp_path / "refused"
    result = run(db_url, "--study", "s", "--trial", "5", "--format", "hf", "--output", str(out))
    _one_error_line(result, "error: trial 5 cannot be exported as hf: no stock transformers model type")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_refused_knee_fails_too(db_url, tmp_path):
    out = tmp_path / "knee"
    result = run(db_url, "--study", "posts", "--knee", "--format", "nanogpt", "--output", str(out))
    _one_error_line(result, "cannot be exported as nanogpt: norm_placement='post'")
    assert not out.exists()


def test_a_refused_knee_points_to_exportable(db_url, tmp_path):
    result = run(db_url, "--study", "posts", "--knee", "--format", "hf", "--output", str(tmp_path / "k"))
    _one_error_line(result, "add --exportable to choose among the trials that export")


# --- --exportable: choose among the trials the format represents -------------------------------


def test_exportable_knee_is_the_knee_of_the_front_of_what_exports(db_url, tmp_path):
    exportable = [n for n, e in TRIALS.items() if e and e[0].norm_placement == "pre"]
    values = np.array([[TRIALS[n][1], _flops(n)] for n in exportable])
    expected = pareto_front(exportable, values, ("loss", "flops")).knee
    out = tmp_path / "knee"
    result = run(db_url, "--study", "s", "--knee", "--exportable", "--format", "hf", "--output", str(out))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().startswith(f"{out}: trial {expected} as ")
    config = json.loads((out / "config.json").read_text())
    layers = config.get("num_hidden_layers", config.get("n_layer"))  # llama or gpt2 names
    assert layers == TRIALS[expected][0].n_layers and "study s, trial" in (out / "README.md").read_text()


def test_exportable_front_leaves_out_what_the_format_refuses(db_url, tmp_path):
    out = tmp_path / "front"
    result = run(db_url, "--study", "s", "--front", "--exportable", "--format", "hf", "--output", str(out))
    assert result.exit_code == 0, result.output
    index = json.loads((out / "index.json").read_text())
    assert [row["number"] for row in index["trials"]] == [2, 1, 0]
    assert index["exportable_only"] is True and not any(row["refused"] for row in index["trials"])
    assert "refused" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--study", "posts", "--knee"], "no complete trial of 'posts' can be exported as hf"),
        (["--study", "s", "--trial", "2"], "--exportable chooses among trials; it does not apply to --trial"),
    ],
)
def test_exportable_errors(db_url, tmp_path, args, message):
    out = tmp_path / "out"
    _one_error_line(run(db_url, *args, "--exportable", "--format", "hf", "--output", str(out)), message)
    assert not out.exists()


# --- bad input: exit 2, one line, nothing written -------------------------------------------------

BAD = [
    pytest.param(["--study", "nope", "--trial", "0"], "unknown study 'nope' in", id="unknown-study"),
    pytest.param(
        ["--study", "s", "--trial", "42"], "study 's' has no trial 42 (trials 0 to 5)", id="unknown-trial"
    ),
    pytest.param(
        ["--study", "s", "--trial", "4"],
        "trial 4 of 's' is failed (out of memory): only complete trials export",
        id="failed-trial",
    ),
    pytest.param(
        ["--study", "s", "--trial", "0", "--format", "onnx"],
        "unknown export format 'onnx'; valid: hf, litgpt, nanogpt, json",
        id="unknown-format",
    ),
    pytest.param(["--study", "s"], "give exactly one of --trial N, --knee", id="no-selector"),
    pytest.param(["--study", "s", "--knee", "--front"], "(got --knee, --front)", id="two-selectors"),
    pytest.param(
        ["--study", "s", "--best-under-flops", "2X"], "FLOPs '2X' must be a positive", id="bad-flops"
    ),
    pytest.param(["--study", "s", "--best-under-flops", "-1e9"], "must be a positive", id="negative-flops"),
    pytest.param(
        ["--study", "s", "--best-under-flops", "10"],
        "no complete trial of 's' has forward FLOPs/token <= 10; the cheapest has",
        id="flops-too-low",
    ),
]


@pytest.mark.parametrize(("args", "message"), BAD)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(db_url, tmp_path, args, message):
    db_file = Path(db_url.removeprefix("sqlite:///"))
    before = hashlib.sha256(db_file.read_bytes()).hexdigest()
    out = tmp_path / "out"
    if "--format" not in args:
        args = [*args, "--format", "hf"]
    _one_error_line(run(db_url, *args, "--output", str(out)), message)
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert hashlib.sha256(db_file.read_bytes()).hexdigest() == before


def test_a_missing_database_is_not_created(tmp_path):
    missing = tmp_path / "missing.db"
    result = run(
        f"sqlite:///{missing}",
        "--study",
        "s",
        "--trial",
        "0",
        "--format",
        "hf",
        "--output",
        str(tmp_path / "o"),
    )
    _one_error_line(result, "no database at")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["non-empty-folder", "file"])
def test_an_occupied_output_is_refused_and_left_alone(db_url, tmp_path, kind):
    out = tmp_path / "taken"
    if kind == "file":
        out.write_text("keep me")
    else:
        out.mkdir()
        (out / "keep.txt").write_text("keep me")
    result = run(db_url, "--study", "s", "--trial", "0", "--format", "hf", "--output", str(out))
    _one_error_line(result, f"--output {out} exists and is not an empty folder")
    kept = out if kind == "file" else out / "keep.txt"
    assert kept.read_text() == "keep me" and sorted(p.name for p in tmp_path.rglob("*")) == sorted(
        ["taken"] + ([] if kind == "file" else ["keep.txt"])
    )


# --- --scale-to: the chosen trial's design at the size the user trains --------------------------


def test_scale_to_builds_in_transformers_with_the_printed_count(db_url, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    out = tmp_path / "scaled"
    result = run(
        db_url, "--study", "s", "--knee", "--exportable", "--scale-to", "1.3B", "--device", "h100-sxm",
        "--vocab", "50257", "--format", "hf", "--output", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"{out}: trial ") and " scaled to 1.3B as " in result.stdout
    printed = int(result.stdout.split("parameters: ")[1].split(" ")[0].replace(",", ""))
    assert (
        abs(printed / 1.3e9 - 1) <= 0.1
        and "MFU" in result.stdout
        and "modelled on NVIDIA H100" in result.stdout
    )
    assert "alignment: vocab_size 50257 -> 50304" in result.stdout
    config = transformers.AutoConfig.from_pretrained(out)
    assert config.vocab_size == 50304
    with torch.device("meta"):  # a 1.3B model's shapes without its memory or init time
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()) == printed
    readme = (out / "README.md").read_text()
    assert "scaled to 1,300,000,000 parameters for h100-sxm" in readme and "proxy_results" in readme


def test_scale_to_as_json_names_the_trial_target_and_device(db_url, tmp_path):
    out = tmp_path / "json"
    result = run(
        db_url, "--study", "s", "--trial", "2", "--scale-to", "350M", "--format", "json", "-o", str(out)
    )
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "archsearch.json").read_text())
    cfg = ArchConfig.from_dict(doc["config"])
    prov = doc["provenance"]
    assert (prov["study"], prov["trial"]) == ("s", 2)
    assert (prov["scaled"]["target_params"], prov["scaled"]["device"]) == (350_000_000, "h100-sxm")
    assert prov["proxy_results"]["loss"] == 2.2 and doc["results"]["params_total"] == param_counts(cfg).total
    assert (cfg.activation, cfg.n_heads // cfg.n_kv_heads, cfg.vocab_size, cfg.seq_len) == (
        "swiglu",
        2,
        256,
        2048,
    )
    assert "give your tokenizer's with --vocab" in result.stderr
    # The study was searched without a [serve] table and no serving flag is given: no serving lines.
    assert "serve" not in prov["scaled"] and "serving" not in result.stdout


def test_scale_to_prints_the_step_memory_and_notes_a_micro_batch_over_the_device(db_url, tmp_path):
    """`--batch 1e15` printed a step and an MFU for a micro-batch no GPU holds, no note."""
    fits = run(
        db_url,
        "--study",
        "s",
        "--trial",
        "2",
        "--scale-to",
        "350M",
        "--format",
        "json",
        "-o",
        str(tmp_path / "a"),
    )
    assert fits.exit_code == 0, fits.output
    assert "memory: activations " in fits.stdout and "; the device holds 80 GB" in fits.stdout
    assert "note: micro-batch" not in fits.stderr
    prov = json.loads((tmp_path / "a" / "archsearch.json").read_text())["provenance"]["scaled"]
    assert prov["activation_bytes"] > 0 and prov["optimizer_state_bytes"] == 16 * prov_params(tmp_path / "a")
    huge = run(
        db_url, "--study", "s", "--trial", "2", "--scale-to", "350M", "--batch", str(10**6),
        "--format", "json", "-o", str(tmp_path / "b"),
    )  # fmt: skip
    assert huge.exit_code == 0, huge.output
    note = next(line for line in huge.stderr.splitlines() if line.startswith("note: micro-batch"))
    assert "are over the device's 80 GB: give --batch " in note and note.endswith(
        ", or recompute activations"
    )


def prov_params(folder):
    return json.loads((folder / "archsearch.json").read_text())["results"]["params_total"]


SCALE_BAD = [
    pytest.param(
        ["--knee", "--scale-to", "1.3X"], "--scale-to '1.3X' must be a positive number", id="bad-target"
    ),
    pytest.param(["--knee", "--scale-to", "1B", "--device", "tpu"], "unknown accelerator 'tpu'", id="device"),
    pytest.param(["--front", "--scale-to", "1B"], "--scale-to scales one trial", id="front"),
    pytest.param(["--knee", "--scale-to", "1P"], "--scale-to 1P parameters is past 10T", id="past-10T"),
    pytest.param(["--knee", "--device", "h100-sxm"], "--device only go with --scale-to", id="no-scale-to"),
    pytest.param(["--knee", "--scale-to", "1k"], "has 1,000 parameters within 10%", id="too-small"),
    pytest.param(
        ["--knee", "--serve-batch", "2", "--memory", "1GB"],
        "--serve-batch, --memory only go with --scale-to",
        id="serve-without-scale-to",
    ),
    pytest.param(
        ["--knee", "--scale-to", "350M", "--weight-dtype", "fp64"],
        "--weight-dtype: weight_dtype 'fp64' is unknown; valid: fp32, bf16, fp16, fp8",
        id="serve-dtype",
    ),
    pytest.param(
        ["--knee", "--scale-to", "350M", "--serve-device", "tpu"],
        "--serve-device: unknown device 'tpu'; measured: local",
        id="serve-device",
    ),
    pytest.param(
        ["--knee", "--scale-to", "350M", "--memory", "lots"],
        "--memory 'lots' must be a number of bytes >= 0",
        id="serve-memory",
    ),
    pytest.param(
        ["--knee", "--scale-to", "350M", "--serve-batch", "0"],
        "Invalid value for '--serve-batch'",
        id="serve-batch",
    ),
]


@pytest.mark.parametrize(("args", "message"), SCALE_BAD)
def test_scale_to_errors_exit_2_with_one_line_and_write_nothing(db_url, tmp_path, args, message):
    out = tmp_path / "out"
    _one_error_line(
        run(db_url, "--study", "s", *args, "--exportable", "--format", "hf", "-o", str(out)), message
    )
    assert not out.exists() and list(tmp_path.iterdir()) == []


# --- --scale-to with a serving scenario: the scaled shape's serving figures -----------------------


def _scaled_serve(db_url: str, tmp_path, study: str, *flags: str):
    """Export `study`'s trial 0 scaled to 350M as JSON: (result, scaled config, the JSON document)."""
    out = tmp_path / "served"
    args = ("--study", study, "--trial", "0", "--scale-to", "350M", "--format", "json", "-o", str(out))
    result = run(db_url, *args, *flags)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "archsearch.json").read_text())
    return result, ArchConfig.from_dict(doc["config"]), doc


def _assert_figures(result, cfg: ArchConfig, doc: dict, scenario: ServeScenario) -> None:
    """The JSON and the text carry exactly the serving functions' figures for the scaled shape."""
    costs, report = serve_costs(cfg, scenario), scenario_report(cfg, scenario)
    serve = doc["provenance"]["scaled"]["serve"]
    assert serve["scenario"] == scenario.to_dict() and serve["context"] == scenario.context
    expected = {
        "kv_bytes_per_token": costs.kv_bytes_per_token,
        "kv_bytes": costs.kv_bytes,
        "kv_bytes_per_sequence": costs.kv_bytes_per_token * scenario.context,
        "weight_bytes": costs.weight_bytes,
        "memory_limit": costs.memory_limit,
        "max_batch": costs.max_batch,
        "prefill_time_s": report.prefill.time_s,
        "decode_time_s": report.decode.time_s,
        "decode_tokens_per_s": report.decode.tokens_per_second,
        "generation_time_s": report.generation_time_s,
    }
    assert {key: serve[key] for key in expected} == expected
    assert serve["decode"] == report.decode.to_dict() and serve["prefill"] == report.prefill.to_dict()
    assert (doc["results"]["prefill_time_s"], doc["results"]["decode_time_s"]) == (
        report.prefill.time_s,
        report.decode.time_s,
    )
    assert doc["results"]["kv_cache_bytes_per_token"] == costs.kv_bytes_per_token
    text = result.stdout
    for shown in (
        f"KV cache {si(costs.kv_bytes_per_token, 'B')}/token, {si(expected['kv_bytes_per_sequence'], 'B')} "
        f"per sequence at {scenario.context:,} tokens, {si(costs.kv_bytes, 'B')} for the batch; "
        f"weights {si(costs.weight_bytes, 'B')}",
        f"prefill {si(report.prefill.time_s, 's')} ({report.prefill.tokens_per_second:,.0f} tokens/s)",
        f"decode {si(report.decode.time_s, 's')}/token mid-generation "
        f"({report.decode.tokens_per_second:,.0f} tokens/s for the batch",
    ):
        assert shown in text, text
    if costs.max_batch:
        at_max = report.decode_at_max_batch
        assert serve["max_batch_tokens_per_s"] == at_max.tokens_per_second
        assert f"largest batch in {si(costs.memory_limit, 'B')}: {costs.max_batch}" in text
        assert f"at the largest batch, {costs.max_batch}: decode {si(at_max.time_s, 's')}/step" in text


def test_scale_to_prints_the_studys_serving_figures_at_the_target_size(db_url, tmp_path):
    result, cfg, doc = _scaled_serve(db_url, tmp_path, "served")
    scenario = SERVED["served"]
    _assert_figures(result, cfg, doc, scenario)
    assert doc["provenance"]["scaled"]["serve"]["device"] == {
        "key": "h100-sxm",
        "name": "NVIDIA H100 SXM5 80GB",
    }
    assert (
        "serving modelled on NVIDIA H100 SXM5 80GB: batch 4, prompt 1,024 + 256 generated, bf16 weights, "
        "bf16 cache, 2.147GB working memory" in result.stdout
    )
    assert (
        doc["provenance"]["scaled"]["serve"]["memory_limit"] == 80 * 10**9
        and doc["provenance"]["scaled"]["serve"]["max_batch"] > 4
    )


def test_serving_flags_change_the_studys_scenario_field_by_field(db_url, tmp_path):
    flags = ("--serve-batch", "8", "--prompt-len", "2048", "--cache-dtype", "fp8", "--serve-device", "l4")
    result, cfg, doc = _scaled_serve(db_url, tmp_path, "served", *flags)
    # The stored limit was the H100's memory, not the table's: on the L4 the L4's memory is the limit.
    scenario = SERVED["served"].replace(batch=8, prompt_len=2048, cache_dtype="fp8", device="l4")
    scenario = resolve_scenario(scenario.replace(memory_bytes=None))
    assert scenario.memory_bytes == 24 * 10**9 and scenario.working_bytes == 2 * 2**30
    _assert_figures(result, cfg, doc, scenario)
    assert "serving modelled on NVIDIA L4 24GB: batch 8, prompt 2,048 + 256 generated" in result.stdout


def test_serving_flags_price_a_study_without_a_serve_table(db_url, tmp_path):
    result, cfg, doc = _scaled_serve(db_url, tmp_path, "s", "--serve-device", "a100-80gb", "--memory", "40GB")
    scenario = ServeScenario(device="a100-80gb", memory_bytes=40 * 10**9)
    _assert_figures(result, cfg, doc, scenario)


def test_a_limit_the_weights_fill_says_no_sequence_fits(db_url, tmp_path):
    result, cfg, doc = _scaled_serve(db_url, tmp_path, "s", "--memory", "100MB")
    scenario = ServeScenario(device="h100-sxm", memory_bytes=100 * 10**6)
    _assert_figures(result, cfg, doc, scenario)
    assert (
        doc["provenance"]["scaled"]["serve"]["max_batch"] == 0
        and doc["provenance"]["scaled"]["serve"]["fits"] is False
    )
    assert "not one sequence of 640 tokens fits 100MB beside the weights" in result.stdout


def test_a_local_scenario_is_modelled_on_the_scale_device_and_says_so(db_url, tmp_path):
    result, cfg, doc = _scaled_serve(db_url, tmp_path, "served-local", "--device", "a100-80gb")
    scenario = resolve_scenario(SERVED["served-local"].replace(device="a100-80gb"))
    _assert_figures(result, cfg, doc, scenario)
    assert doc["provenance"]["scaled"]["serve"]["modelled_instead_of"] == "local"
    assert "note: serving on 'local' is measured, and the 350M shape is not built here: modelled on " in (
        result.stderr
    )
    assert "a100-80gb (--device) instead" in result.stderr
