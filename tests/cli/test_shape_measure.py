from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.space import ArchConfig, load_config, param_counts, preset
from tests.helpers import one_line
from tests.storage.test_query import fill_study
from tests.terminal import under_a_terminal

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def test_cost_json_has_the_contract_keys():
    result = run("cost", "--preset", "gpt2-small", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["params_total"] == 124_439_808
    assert report["params_non_embedding"] == 85_056_000
    assert report["flops_forward_per_token"] == 284_812_800
    assert report["flops_forward_per_token_causal"] == 265_956_864
    assert report["flops_train_per_token"] == 3 * 284_812_800
    assert report["kv_cache_bytes_per_token"] == 2 * 12 * 768 * 2
    assert report["relu_feature_loss_log10"] is None
    assert ArchConfig.from_dict(report["config"]) == preset("gpt2-small")


def test_cost_of_a_file_prints_a_table(tmp_path):
    path = tmp_path / "cfg.json"
    assert run("config", "new", "--d-model", "256", "--aspect-ratio", "64", "--activation", "relu",
               "-o", str(path)).exit_code == 0  # fmt: skip
    result = run("cost", str(path))
    assert result.exit_code == 0, result.output
    total = param_counts(load_config(path)).total
    assert f"{total:,}" in result.stdout
    assert "relu feature loss" in result.stdout


@pytest.mark.parametrize(("aspect", "layers", "noted"), [(1000, 1, True), (64, 2, False), (50, 3, False)])
def test_an_aspect_ratio_the_depth_cannot_keep_is_noted(aspect, layers, noted):
    """`config new --d-model 128 --aspect-ratio 1000` built 1 layer (aspect 128) silently."""
    result = run("config", "new", "--d-model", "128", "--aspect-ratio", str(aspect), "--head-dim", "32")
    assert result.exit_code == 0, result.output
    assert ArchConfig.from_json(result.stdout).n_layers == layers
    note = "note: --aspect-ratio 1000 at d_model 128 is 0.128 layers: built with 1 (aspect 128)\n"
    assert result.stderr == (note if noted else "")


def test_presets_lists_every_preset_with_counts():
    result = run("presets", "--json")
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["llama3-8b"]["params_total"] == rows["llama3-8b"]["published_params"] == 8_030_261_248
    table = run("presets").stdout
    assert "mistral-7b" in table and "7,241,732,096" in table


def test_width_reports_gated_size_and_risk():
    result = json.loads(run("width", "4096", "--json").stdout)
    assert result["gated_d_ff"] == 11008
    by_ratio = {row["ratio"]: row for row in result["relu_feature_loss"]}
    assert 0.49 < by_ratio[2]["risk"] < 0.5
    assert by_ratio[8]["risk"] == 0.0 and by_ratio[8]["log10_risk"] < -4000


def test_config_new_from_preset_overrides_fields():
    result = run("config", "new", "--from-preset", "llama2-7b", "--n-layers", "8", "--n-kv-heads", "8")
    cfg = ArchConfig.from_json(result.stdout)
    assert (cfg.n_layers, cfg.n_kv_heads, cfg.d_ff) == (8, 8, 11008)


def test_config_check(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(preset("byte-1m").to_json())
    result = run("config", "check", str(path))
    assert result.exit_code == 0
    assert result.stdout.startswith("ok: d_model 128, 4 layers")


@pytest.mark.parametrize(
    ("args", "files", "message"),
    [
        (["cost", "missing.json"], {}, "error: config file not found: missing.json"),
        (["cost", "bad.json"], {"bad.json": "{not json"}, "error: bad.json: invalid JSON at line 1 column 2"),
        (["cost", "cfg.json"], {"cfg.json": '{"d_model": 64}'}, "error: cfg.json: missing ArchConfig key(s)"),
        (
            ["cost", "cfg.json"],
            {"cfg.json": json.dumps(preset("byte-1m").to_dict() | {"n_kv_heads": 3})},
            "error: cfg.json: n_kv_heads=3 must divide n_heads=4",
        ),
        (["cost", "--preset", "gpt5"], {}, "error: unknown preset 'gpt5'; valid: gpt2-small"),
        (["cost"], {}, "error: give a CONFIG file, --preset NAME or --study S --trial N (exactly one)"),
        (["cost", "--preset", "gpt2-small", "--dtype", "int4"], {}, "error: unknown dtype 'int4'"),
        (["config", "new", "--d-model", "100", "--n-layers", "2"], {}, "error: head_dim=64 must divide"),
        (
            ["config", "new", "--from-preset", "gpt2-small", "--aspect-ratio", "8"],
            {},
            "error: --aspect-ratio cannot be combined",
        ),
        (["config", "check", "missing.json"], {}, "error: config file not found"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, args, files, message):
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    result = run(*args)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(message)
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_console_script_end_to_end(tmp_path):
    exe = [sys.executable, "-m", "archsearch", "cost", "--preset", "llama2-7b", "--json"]
    done = subprocess.run(exe, capture_output=True, text=True, check=True, cwd=tmp_path)
    assert json.loads(done.stdout)["params_total"] == 6_738_415_616
    bad = subprocess.run([*exe[:3], "cost", "nope.json"], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr == "error: config file not found: nope.json\n"


TINY_TRAIN = ["--tokens", "4096", "--batch-size", "4", "--precision", "fp32"]


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(
        ArchConfig(
            vocab_size=256, seq_len=32, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64
        ).to_json()
    )
    return path


def test_train_json_has_the_contract_keys(tiny_config):
    result = run("train", str(tiny_config), *TINY_TRAIN, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    for key in ("val_loss", "bits_per_byte", "tokens_per_second", "achieved_flops_per_second", "mfu"):
        assert report[key] > 0, key
    assert (report["status"], report["reason"], report["precision"]) == ("complete", None, "fp32")
    assert report["tokens"] == 4096
    assert report["val_loss"] < 5.545  # below ln(256), the loss of a uniform byte model


def test_train_table_and_failure_exit_code(tiny_config):
    result = run("train", str(tiny_config), *TINY_TRAIN)
    assert result.exit_code == 0 and "val loss (nats/token)" in result.stdout
    failed = run("train", str(tiny_config), *TINY_TRAIN, "--lr", "1e30")
    assert failed.exit_code == 1
    assert "failed (non-finite loss: training loss is" in failed.stdout or (
        "failed (non-finite loss: validation loss is" in failed.stdout
    )


def test_train_shows_progress_with_an_eta_on_a_terminal(tiny_config):
    # stderr a terminal used to crash before the first step: `{task.total:,}` with total None.
    import re

    args = ["train", str(tiny_config), *TINY_TRAIN, "--json"]
    code, stdout, shown = under_a_terminal(args, tiny_config.parent)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)  # the bar's colours and cursor moves
    assert code == 0, text[-2000:]
    assert json.loads(stdout)["status"] == "complete"
    assert "Traceback" not in text, text[-2000:]
    assert re.search(r"training .*[1-9][\d,]*/4,096 tokens loss \d.* ETA", text), text[-2000:]


def test_train_json_records_the_settings_that_made_the_result(tiny_config):
    args = ("--seed", "3", "--lr", "2e-3", "--base-width", "64", "--schedule", "wsd", "--device", "cpu")
    result = run("train", str(tiny_config), *TINY_TRAIN, *args, "--json")
    assert result.exit_code == 0, result.output
    settings = json.loads(result.stdout)["settings"]
    asked = {
        "seed": 3, "lr": 2e-3, "base_width": 64, "schedule": "wsd", "device": "cpu", "precision": "fp32",
        "batch_size": 4, "tokens": 4096, "flops": None, "seconds": None, "compile": False,
    }  # fmt: skip
    assert {k: settings[k] for k in asked} == asked
    assert {"warmup", "min_lr", "weight_decay", "evals"} <= set(settings)  # the defaults too


def test_train_refuses_an_endless_budget(tiny_config):
    result = run("train", str(tiny_config), "--seconds", "inf")
    assert result.exit_code == 2, result.output
    assert result.stderr == "error: seconds must be a finite number, got inf\n"


def test_profile_measured_json(tiny_config):
    result = run(
        "profile", str(tiny_config), "--batch", "2", "--min-run-time", "0.01", "--dtype", "fp32", "--json"
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["modelled"] is False
    assert report["step_time_s"] > 0
    assert report["tokens_per_second"] == pytest.approx(64 / report["step_time_s"])
    names = {k["name"] for k in report["kernels"]}
    assert {"qkv.fwd", "mlp_down.wgrad", "lm_head.dgrad", "sdpa.fwd", "sdpa.bwd"} <= names
    for row in report["kernels"]:
        assert {"name", "m", "n", "k", "count", "dtype", "time_s", "tflops"} <= set(row)


def test_profile_adds_the_residual_line_up_to_the_measured_step(tiny_config):
    args = ("profile", str(tiny_config), "--batch", "2", "--min-run-time", "0.005", "--steps", "3")
    report = json.loads(run(*args, "--json").stdout)
    assert report["measured_steps"] == 3 and report["step_time_s"] == report["measured_step_s"] > 0
    parts = report["kernel_time_s"] + report["memory_time_s"] + report["residual_s"]
    assert parts == pytest.approx(report["step_time_s"], rel=1e-12)
    table = run(*args).stdout
    assert "measured training step, median of 3" in table
    assert re.search(r"residual +-?[\d.]+[mu]?s +-?[\d.]+%  \(launches, framework overhead", table), table
    kernels_only = json.loads(run(*args[:-2], "--steps", "0", "--json").stdout)
    assert kernels_only["residual_s"] is None and kernels_only["step_time_s"] == kernels_only["kernel_sum_s"]


def test_profile_caches_kernel_times_in_the_trial_database(tiny_config, tmp_path):
    from archsearch.storage import Storage

    url = f"sqlite:///{tmp_path / 'k.db'}"
    args = (
        "profile",
        str(tiny_config),
        "--batch",
        "2",
        "--min-run-time",
        "0.01",
        "--dtype",
        "fp32",
        "--json",
    )
    first = json.loads(run(*args, "--storage", url).stdout)
    with Storage.open(url, create=False) as db:
        stored = db.measurements()
    distinct = len({(k["kind"], k["m"], k["n"], k["k"]) for k in first["kernels"]})
    assert len(stored) == distinct + 2  # + the bandwidth copy and the fp32 matmul peak behind MFU
    second = json.loads(run(*args, "--storage", url).stdout)
    with Storage.open(url, create=False) as db:
        assert db.measurements() == stored  # every kernel came from the table: nothing re-timed
    assert [k["time_s"] for k in second["kernels"]] == [k["time_s"] for k in first["kernels"]]
    both = run(*args, "--storage", url, "--cache", str(tmp_path / "c.json"))
    assert both.exit_code == 2 and "not both" in both.stderr


def test_a_measurement_cache_nested_too_deeply_is_one_error_line(tmp_path):
    cache = tmp_path / "cache.json"
    cache.write_text("[" * 100_000)  # json's decoder raised RecursionError
    result = run("profile", "--preset", "byte-1m", "--cache", str(cache))
    assert result.exit_code == 2, result.output
    assert (
        result.stderr
        == f"error: measurement cache {cache}: invalid JSON: nested too deeply to be a cache; delete it to "
        "start afresh\n"
    )


def test_profile_modelled_gpu_and_table():
    result = run("profile", "--preset", "llama3-8b", "--device", "h100-sxm", "--batch", "1", "--json")
    report = json.loads(result.stdout)
    assert report["modelled"] is True and report["device"]["name"] == "NVIDIA H100 SXM5 80GB"
    assert report["tokens_per_second"] == pytest.approx(8192 / report["step_time_s"])
    table = run("profile", "--preset", "llama3-8b", "--device", "h100-sxm").stdout
    assert "modelled on NVIDIA H100 SXM5 80GB" in table and "mlp_up.fwd" in table


def test_align_flags_a_misaligned_d_ff(tmp_path):
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(preset("llama2-7b").to_dict() | {"d_ff": 11000}))
    report = json.loads(run("align", str(path), "--device", "a100-80gb", "--batch", "1", "--json").stdout)
    d_ff = next(d for d in report["dimensions"] if d["name"] == "d_ff")
    assert d_ff["value"] == 11000 and not d_ff["well_aligned"]
    assert 11008 in [o["value"] for o in d_ff["options"] if o["gemm_gain_pct"] >= 1]


def test_devices_lists_the_catalogue():
    rows = {row["key"]: row for row in json.loads(run("devices", "--json").stdout)}
    assert {"a100-80gb", "h100-sxm", "h200", "l4", "rtx4090"} <= set(rows)
    assert rows["h100-sxm"]["units"] == 132


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "--preset", "byte-1m"], "error: give exactly one budget: tokens, flops or seconds"),
        (
            ["train", "--preset", "byte-1m", "--tokens", "10", "--data", "nope.txt"],
            "error: data path not found",
        ),
        (["train", "--preset", "byte-1m", "--tokens", "10", "--schedule", "step"], "error: schedule 'step'"),
        (["train", "--preset", "byte-1m", "--seconds", "nan"], "error: seconds must be a finite number"),
        (["train", "--preset", "byte-1m", "--flops", "inf"], "error: flops must be a finite number, got inf"),
        (["train", "--preset", "byte-1m", "--tokens", "10", "--lr", "-1"], "error: lr must be positive"),
        (
            ["train", "--preset", "byte-1m", "--tokens", "10", "--device", "tpu"],
            "error: device 'tpu' is unknown; valid: cpu, cuda, cuda:N, auto",
        ),
        (
            ["profile", "--preset", "byte-1m", "--device", "tpu-v9"],
            "error: unknown device 'tpu-v9'; measured: cpu, cuda, cuda:N; modelled: a100-80gb, h100-sxm",
        ),
        (["profile", "--preset", "byte-1m", "--dtype", "int4"], "error: dtype 'int4' cannot be profiled"),
        (["align", "--preset", "byte-1m", "--device", "b200"], "error: unknown accelerator 'b200'"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_evaluator_input_is_one_line_and_exit_2(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(message)
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("command", [["cost"], ["config", "check"]], ids=["cost", "config-check"])
@pytest.mark.parametrize("field", ["d_model", "vocab_size", "n_layers"])
def test_a_huge_size_is_one_error_line_not_an_overflow(tmp_path, command, field):
    data = json.loads(preset("byte-1m").to_json())
    data[field] = 10**400  # JSON reads it exactly; the float cost model used to overflow
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(data))
    result = run(*command, str(path))
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: {path}: {field} must be at most 2**53, got a 401-digit number\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["search", "--space", "x.toml", "--workers", "0"], "error: Invalid value for '--workers'"),
        (["search", "--space", "x.toml", "--retries", "-1"], "error: Invalid value for '--retries'"),
        (["search", "--space", "x.toml", "--seed", "abc"], "error: Invalid value for '--seed'"),
        (["search", "--space", "x.toml", "--bogus"], "error: No such option: --bogus"),
        (["trials", "--study", "s", "--limit", "abc"], "error: Invalid value for '--limit'"),
        (["nope"], "error: No such command 'nope'"),
        (["--bogus", "cost"], "error: No such option: --bogus"),
        (["config", "check"], "error: Missing argument"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_usage_errors_are_one_line_not_a_usage_box(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr
    assert list(tmp_path.iterdir()) == []


# --- a trial's shape: an exported archsearch.json, or --study S --trial N ---------------------------
@pytest.fixture(scope="module")
def trial_db(tmp_path_factory):
    """A SQLite trial database with study "s" (tests.storage.test_query.TRIALS) and its URL."""
    from archsearch.storage import Storage

    path = tmp_path_factory.mktemp("trials") / "trials.db"
    with Storage.open(f"sqlite:///{path}") as storage:
        fill_study(storage)
    return f"sqlite:///{path}"


def test_an_exported_trial_file_is_a_config_for_cost_config_check_and_train(trial_db, tmp_path):
    from tests.storage.test_query import TRIALS

    out = tmp_path / "t0"
    exported = run(
        "export", "--study", "s", "--trial", "0", "--format", "json", "-o", str(out), "--storage", trial_db
    )
    assert exported.exit_code == 0, exported.output
    path = str(out / "archsearch.json")
    cfg = TRIALS[0][0]
    report = run("cost", path, "--json")
    assert report.exit_code == 0, report.output
    assert json.loads(report.stdout)["config"] == cfg.to_dict()
    check = run("config", "check", path)
    assert (
        check.exit_code == 0 and check.stdout == f"ok: {cfg.describe()}; {param_counts(cfg).total:,} params\n"
    )
    trained = run("train", path, *TINY_TRAIN, "--json")
    assert trained.exit_code == 0, trained.output
    assert json.loads(trained.stdout)["config"] == cfg.to_dict()


def test_cost_and_train_take_the_shape_of_a_complete_trial(trial_db):
    from tests.storage.test_query import TRIALS

    cfg = TRIALS[2][0]
    report = run("cost", "--study", "s", "--trial", "2", "--storage", trial_db, "--json")
    assert report.exit_code == 0, report.output
    assert json.loads(report.stdout)["config"] == cfg.to_dict()
    trained = run("train", "--study", "s", "--trial", "0", "--storage", trial_db, *TINY_TRAIN, "--json")
    assert trained.exit_code == 0, trained.output
    assert json.loads(trained.stdout)["config"] == TRIALS[0][0].to_dict()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--study", "s", "--trial", "3"],
         "trial 3 of 's' is pruned (dominated at rung 0.25): only complete trials give their shape"),
        (["--study", "s", "--trial", "99"], "study 's' has no trial 99 (trials 0 to 6)"),
        (["--study", "s", "--trial", str(10**30)], f"study 's' has no trial {10**30} (trials 0 to 6)"),
        (["--study", "nope", "--trial", "0"], "unknown study 'nope'"),
        (["--study", "s"], "--study S and --trial N go together"),
        (["--trial", "0"], "--study S and --trial N go together"),
        (["--preset", "byte-1m", "--study", "s", "--trial", "0"],
         "give a CONFIG file, --preset NAME or --study S --trial N (exactly one)"),
        (["--preset", "byte-1m"], "--storage is where --study S --trial N is read from: give those too"),
    ],
    ids=["pruned", "missing-trial", "huge-trial", "unknown-study", "study-alone", "trial-alone",
         "two-sources", "storage-alone"],
)  # fmt: skip
@pytest.mark.parametrize("command", ["cost", "train"])
def test_a_bad_trial_reference_is_one_error_line(trial_db, command, args, message):
    extra = ["--tokens", "64"] if command == "train" else []
    result = run(command, *args, "--storage", trial_db, *extra)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {message}") and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"config": {"d_model": 64}}', "{path} (its 'config'): missing ArchConfig key(s)"),
        ('{"config": [], "results": {}}', "{path} (its 'config'): an ArchConfig must be a JSON object"),
        ('{"config": {}, "study": "s"}', "{path}: unknown key(s) beside 'config': 'study'; an export"),
        ('{"architectures": ["LlamaForCausalLM"]}', "{path}: unknown ArchConfig key(s): architectures"),
        ("[" * 100_000, "{path}: invalid JSON: nested too deeply to be a config"),
        ('{"d_model": ' + "[" * 100_000, "{path}: invalid JSON: nested too deeply to be a config"),
    ],
    ids=["export-with-a-bad-config", "export-config-not-an-object", "export-extra-key", "hf-config",
         "deep-array", "deep-value"],
)  # fmt: skip
@pytest.mark.parametrize("command", [["cost"], ["config", "check"]], ids=["cost", "config-check"])
def test_a_file_that_is_neither_config_nor_export_is_one_error_line(tmp_path, command, text, message):
    path = tmp_path / "x.json"
    path.write_text(text)
    result = run(*command, str(path))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: " + message.format(path=path)), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize(("threads", "code"), [("1", 0), ("0", 2)])
def test_train_takes_a_thread_count(tiny_config, threads, code):
    result = run("train", str(tiny_config), *TINY_TRAIN, "--device", "cpu", "--threads", threads, "--json")
    assert result.exit_code == code, result.output
    if code == 0:
        assert json.loads(result.stdout)["threads"] == 1
    else:
        assert result.stderr == "error: threads must be a positive integer (or unset: chosen), got 0\n"


def test_a_profile_timing_budget_past_a_minute_per_kernel_is_refused():
    """`profile --min-run-time 1e308` was accepted and timed its first kernel without end."""
    result = CliRunner().invoke(
        app, ["profile", "--preset", "byte-1m", "--device", "cpu", "--steps", "0", "--min-run-time", "1e308"]
    )
    assert one_line(result, 2).startswith(
        "error: min_run_time must be a positive number of seconds, at most 60 per kernel, got 1e+308"
    )


@pytest.mark.parametrize("command", [["align"], ["profile", "--device", "h100-sxm"]])
def test_a_modelled_batch_past_2_31_sequences_is_refused(command):
    """`align --batch 1e20` modelled a step of 360 peta-seconds."""
    result = CliRunner().invoke(app, [*command, "--preset", "byte-1m", "--batch", str(10**20)])
    assert (
        one_line(result, 2)
        == "error: batch must be a positive integer up to 2**31 - 1, got a 21-digit number"
    )
