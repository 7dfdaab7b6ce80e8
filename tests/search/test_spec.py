from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from archsearch.errors import ArchsearchError
from archsearch.search.promotion import PromoteSettings
from archsearch.search.spec import (
    PROFILE_DTYPES,
    SAMPLERS,
    SearchDefaults,
    SpecError,
    load_spec,
    parse_spec,
)
from archsearch.space.objectives import DEFAULT_OBJECTIVES, OBJECTIVES
from archsearch.space.search_space import Domain, SpaceError, sample_configs
from tests.specs import LOCAL_PROFILE, tiny_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

MODEL = """
[model]
vocab_size = 256
seq_len = 64
d_model = { min = 64, max = 192, step = 64 }
aspect_ratio = [32, 64]
"""
PROXY = """
[proxy]
tokens = 4096
"""


def spec_text(*extra: str, model: str = MODEL, proxy: str = PROXY) -> str:
    return model + proxy + "".join(extra)


def parse(*extra: str, **tables: str):
    return parse_spec(spec_text(*extra, **tables), "space.toml")


# --- the examples ---
def test_the_tiny_example_is_a_small_feasible_cpu_search():
    spec = load_spec(EXAMPLES / "tiny.toml")
    assert spec.name == "tiny" and spec.data is None and spec.proxy.device == "cpu"
    assert spec.objectives == ("loss", "flops") and spec.step_time_device is None
    promote = PromoteSettings(cap=2, max_contenders=4)  # resumed: the proxy's warm-up is in tokens
    assert spec.defaults == SearchDefaults(trials=12, seed=0, prune=True, rungs=(0.25, 0.5), promote=promote)
    assert spec.proxy.budget_free and spec.proxy.warmup_tokens == 12_000
    assert spec.profile.devices == ("h100-sxm",) and spec.profile.local
    assert spec.space.budget.params_max == 2_000_000 and isinstance(spec.space.budget.params_max, int)
    found = spec.space.check_feasible()
    assert found.exhaustive and found.feasible >= 100
    assert spec.source == (EXAMPLES / "tiny.toml").read_text()


def test_the_gpu_example_measures_step_time_locally():
    spec = load_spec(EXAMPLES / "gpu.toml")
    assert spec.objectives == ("loss", "flops", "step_time") and spec.step_time_device == "local"
    assert spec.space.multiple_of == 128 and spec.proxy.device == "cuda"
    assert spec.profile.devices == ("h100-sxm", "a100-80gb") and spec.profile_batch == spec.proxy.batch_size
    assert spec.space.check_feasible().feasible > 1000
    # Promoted afresh: kept states for 200 GPU trials would take up to a terabyte.
    assert not spec.proxy.budget_free and spec.defaults.promote == PromoteSettings(cap=4, max_contenders=8)


# --- knob forms ---
def test_every_knob_form_becomes_a_fixed_value_or_a_domain():
    model = (
        MODEL.replace("aspect_ratio = [32, 64]", "aspect_ratio = { min = 32, max = 32 }")
        + """
d_ff_ratio = { min = 2, max = 6.5, step = 0.5 }
head_dim = { min = 16, max = 64, log = true }
activation = ["gelu", "swiglu"]
norm = ["rmsnorm"]
attention_layout = "mqa"
qk_norm = [true, false]
"""
    )
    space = parse(model=model).space
    domains = {d.name: d for d in space.domains}
    assert list(domains) == ["d_model", "d_ff_ratio", "head_dim", "activation", "qk_norm"]  # KNOBS order
    assert domains["d_model"] == Domain("d_model", "int", low=64, high=192, step=64)
    assert domains["d_ff_ratio"] == Domain("d_ff_ratio", "float", low=2.0, high=6.5, step=0.5)
    assert domains["head_dim"] == Domain("head_dim", "int", low=16, high=64, log=True)
    assert domains["activation"].choices == ("gelu", "swiglu")
    assert domains["qk_norm"].choices == (True, False)
    # A single choice and an empty range fix the knob: Optuna never sees it.
    fixed = dict(space.fixed)
    assert (fixed["norm"], fixed["aspect_ratio"], fixed["attention_layout"]) == ("rmsnorm", 32, "mqa")


@pytest.mark.parametrize("example", ["tiny.toml", "tiny-hf.toml"])
def test_sampling_a_parsed_space_uses_the_knob_names_as_optuna_parameters(example):
    # Both examples propose only shapes to train (at least 95% of proposals): each knob among
    # the values still feasible, under its name or, narrowed, its name and those values.
    spec = load_spec(EXAMPLES / example)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(30):
        trial = study.ask()
        cfg = spec.space.sample(trial)  # never Rejected
        assert [n.partition("|")[0] for n in trial.params] == [d.name for d in spec.space.domains]
        assert cfg.d_model == trial.params["d_model"] and spec.space.config_from_params(trial.params) == cfg
        study.tell(trial, state=optuna.trial.TrialState.FAIL)


def test_defaults_fill_every_optional_table():
    spec = parse()
    assert spec.objectives == DEFAULT_OBJECTIVES and spec.defaults == SearchDefaults()
    assert spec.profile.local and spec.profile.devices == () and spec.profile_batch == 16
    assert spec.space.multiple_of == 64 and spec.space.gated_parity and spec.data is None


def test_budget_numbers_written_as_floats_are_counts():
    spec = parse("[budget]\nparams = { min = 1e5, max = 4e6 }\nflops_per_token = { max = 20_000_000 }\n")
    budget = spec.space.budget
    assert (budget.params_min, budget.params_max, budget.flops_max) == (100_000, 4_000_000, 2e7)
    assert isinstance(budget.params_max, int) and isinstance(budget.flops_max, float)


def test_an_unmeetable_budget_parses_and_fails_at_the_feasibility_check():
    spec = parse("[budget]\nparams = { max = 1000 }\n")
    with pytest.raises(SpaceError, match="no config in the space meets the budget of params <= 1k"):
        spec.space.check_feasible()


def test_data_is_resolved_against_the_spec_folder(tmp_path):
    (tmp_path / "corpus.txt").write_text("hello world\n" * 100)
    (tmp_path / "space.toml").write_text(spec_text(proxy=PROXY + 'data = "corpus.txt"\n'))
    assert load_spec(tmp_path / "space.toml").data == str((tmp_path / "corpus.txt").resolve())
    with pytest.raises(SpecError, match=r"^space.toml: \[proxy\].data: not found: .*missing.txt$"):
        parse_spec(spec_text(proxy=PROXY + 'data = "missing.txt"\n'), "space.toml", base_dir=tmp_path)


# --- fingerprints ---
def test_the_fingerprint_ignores_comments_and_trial_counts_but_not_settings():
    base = parse("[search]\ntrials = 10\n")
    assert parse("# a comment\n[search]\ntrials = 500\n").fingerprint == base.fingerprint
    assert parse_spec(spec_text("[search]\ntrials = 10\n"), "other.toml").fingerprint == base.fingerprint
    assert parse(proxy="[proxy]\ntokens = 8192\n").fingerprint != base.fingerprint
    assert parse("[search]\nseed = 1\n").fingerprint != base.fingerprint
    assert parse(proxy="[proxy]\ntokens = 4096\nlr = 1\n").fingerprint == parse(
        proxy="[proxy]\ntokens = 4096\nlr = 1.0\n"
    ).fingerprint  # fmt: skip
    assert len(base.fingerprint) == 64


def test_threads_are_read_but_left_out_of_the_fingerprint():
    base = parse()
    one = parse(proxy=PROXY + "threads = 1\n")
    assert (base.proxy.threads, one.proxy.threads) == (None, 1)
    assert one.to_dict()["proxy"]["threads"] == 1  # stored with the study: validate reuses it
    # How fast a CPU trial runs, not what it computes: a study resumes with another count.
    assert one.fingerprint == parse(proxy=PROXY + "threads = 4\n").fingerprint == base.fingerprint


def test_a_size_beta_makes_the_loss_objective_size_adjusted_and_enters_the_fingerprint():
    plain = tiny_spec(profile=LOCAL_PROFILE)
    credited = tiny_spec(profile=LOCAL_PROFILE, objectives="size_beta = 0.15")
    assert plain.size_beta is None and credited.size_beta == 0.15
    assert credited.to_dict()["size_beta"] == 0.15 and credited.objectives == plain.objectives
    assert credited.fingerprint != plain.fingerprint  # another objective: a new study, not a resume
    # A file without it keeps the fingerprint it had before the setting existed (pinned from then).
    assert plain.fingerprint == "773dd93112e444d9b9054b9a1f9f532dc451c513af38bd4b7fc72ae3abe071d4"


def test_extrapolate_enters_the_loss_rule_and_the_fingerprint_only_when_given():
    plain = tiny_spec(profile=LOCAL_PROFILE)
    carried = tiny_spec(objectives="size_beta = 0.15\nextrapolate = 2")
    assert plain.extrapolate == 0.0 and plain.loss_rule.plain
    assert carried.extrapolate == 2.0 and isinstance(carried.extrapolate, float)  # 2 and 2.0: one study
    assert (carried.loss_rule.size_beta, carried.loss_rule.extrapolate) == (0.15, 2.0)
    assert carried.to_dict()["extrapolate"] == 2.0
    assert carried.fingerprint != tiny_spec(objectives="size_beta = 0.15").fingerprint  # a new study
    assert carried.fingerprint == tiny_spec(objectives="size_beta = 0.15\nextrapolate = 2.0").fingerprint
    # Left out, or 0 (the same objective): the fingerprint it had before the key existed.
    assert plain.fingerprint == tiny_spec(profile=LOCAL_PROFILE, objectives="extrapolate = 0.0").fingerprint
    assert plain.fingerprint == "773dd93112e444d9b9054b9a1f9f532dc451c513af38bd4b7fc72ae3abe071d4"


@pytest.mark.parametrize(
    ("name", "fingerprint"),
    [
        ("tiny", "3512045234f73d90f5992118de7d1c1b2615efa6a657038d6075898fb7fae66a"),
        ("gpu", "af7518ec86dec1f4582b8e6991ae2cda60997678e65553497ac1e321dd47f141"),
    ],
)
def test_the_examples_keep_their_fingerprints(name, fingerprint):
    """Pinned: a new settings field that enters the fingerprint orphans every existing study of
    the file (`search --resume` refuses it). Decide such a change, do not let it happen. Last
    decided: `[proxy] warmup_tokens` in tiny.toml (the 5% warm-up fixed in tokens, so promotion resumes
    a contender's final state; the first pass's rate ramps by tokens, not by the fraction done,
    so a study of the old file trained a little differently; `[search] promote` leaves the
    fingerprint as it is; gpu.toml promotes afresh, its trials' kept states would fill a disk).
    Before: `[objectives] extrapolate = 2.0` in both (another loss objective, chosen on the
    development calibration sets). Before that:
    tiny.toml's `[proxy] precision = "fp32"` ("auto" trained in bf16 on CPUs with native bf16,
    so the same file ranked shapes differently by host), and `[objectives].size_beta`."""
    assert load_spec(EXAMPLES / f"{name}.toml").fingerprint == fingerprint


# --- errors ---
def case(name: str, text: str, match: str):
    return pytest.param(text, match, id=name)


STEP_TIME = "[objectives]\nminimize = ['loss', 'step_time']\n"
BAD = [
    case("unknown-table", spec_text("[tuning]\nx = 1\n"), r"unknown table \[tuning\]; valid: model, rules"),
    case("top-level-key", "trials = 3\n" + spec_text(), r"unknown table \[trials\]"),
    case("unknown-key", spec_text("[search]\nsampeler = 'tpe'\n"),
         r"\[search\].sampeler: unknown key; valid: sampler"),
    case("unknown-knob", spec_text(model=MODEL + "n_layers = 4\n"),
         r"\[model\].n_layers: unknown knob \(n_layers derives from aspect_ratio\)"),
    case("wrong-type", spec_text("[search]\ntrials = '20'\n"),
         r"\[search\].trials: expected an integer, got '20'"),
    case("wrong-knob-type", spec_text(model=MODEL + "head_dim = 'big'\n"),
         r"\[model\].head_dim: expected an integer, got 'big'"),
    case("min-above-max", spec_text(model=MODEL.replace("min = 64, max = 192", "min = 256, max = 192")),
         r"\[model\].d_model: min 256 is above max 192"),
    case("range-key", spec_text(model=MODEL + "d_ff_ratio = { min = 2, max = 4, by = 1 }\n"),
         r"\[model\].d_ff_ratio.by: unknown key; valid: min, max, step, log"),
    case("range-needs-max", spec_text(model=MODEL + "d_ff_ratio = { min = 2 }\n"),
         r"\[model\].d_ff_ratio: a range needs min and max"),
    case("bad-activation", spec_text(model=MODEL + "activation = ['gelu', 'swish']\n"),
         r"\[model\].activation: unknown activation 'swish'; valid: relu, gelu"),
    case("d_model-alignment", spec_text(model=MODEL.replace("step = 64", "step = 32")),
         r"\[model\].d_model: 96 is not a multiple of multiple_of=64"),
    case("d_model-alignment-rule", spec_text("[rules]\nmultiple_of = 128\n"),
         r"\[model\].d_model: 64 is not a multiple of multiple_of=128"),
    case("unknown-export-format", spec_text("[rules]\nexport = ['hf', 'onnx']\n"),
         r"\[rules\].export: unknown format 'onnx'; valid: hf, litgpt, nanogpt, json"),
    case("export-not-a-list", spec_text("[rules]\nexport = 'hf'\n"), r"\[rules\].export: expected a list"),
    case("missing-required", spec_text(model=MODEL.replace("seq_len = 64\n", "")),
         r"\[model\].seq_len: required"),
    case("proxy-without-budget", spec_text(proxy="[proxy]\nbatch_size = 8\n"),
         r"\[proxy\]: give exactly one budget: tokens, flops or seconds"),
    case("bad-train-setting", spec_text(proxy=PROXY + "schedule = 'linear'\n"),
         r"\[proxy\]: schedule 'linear' is unknown; valid: cosine, wsd, constant"),
    case("proxy-seq-len", spec_text(proxy=PROXY + "seq_len = 32\n"), r"\[proxy\].seq_len: unknown key"),
    case("threads-zero", spec_text(proxy=PROXY + "threads = 0\n"),
         r"\[proxy\]: threads must be a positive integer \(or unset: chosen\), got 0$"),
    case("threads-negative", spec_text(proxy=PROXY + "threads = -1\n"),
         r"\[proxy\]: threads must be a positive integer .*, got -1$"),
    case("threads-fraction", spec_text(proxy=PROXY + "threads = 1.5\n"),
         r"\[proxy\].threads: expected an integer, got 1.5$"),
    case("threads-string", spec_text(proxy=PROXY + "threads = 'auto'\n"),
         r"\[proxy\].threads: expected an integer, got 'auto'$"),
    case("threads-bool", spec_text(proxy=PROXY + "threads = true\n"),
         r"\[proxy\].threads: expected an integer, got True$"),
    case("bad-objective", spec_text("[objectives]\nminimize = ['loss', 'latency']\n"),
         r"\[objectives\].minimize: unknown objective 'latency'; objectives 'loss,latency' must be loss "
         r"then one or two of flops, step_time"),
    case("no-loss", spec_text("[objectives]\nminimize = ['flops']\n"),
         r"\[objectives\].minimize: objectives 'flops' must be loss then one or two of flops, step_time"),
    case("step-time-no-device", spec_text(STEP_TIME),
         r"\[objectives\].step_time_device: step_time needs a device"),
    case("negative-size-beta", spec_text("[objectives]\nsize_beta = -0.1\n"),
         r"\[objectives\].size_beta: must be a finite number >= 0, got -0.1"),
    case("size-beta-not-a-number", spec_text("[objectives]\nsize_beta = 'big'\n"),
         r"\[objectives\].size_beta: expected a number, got 'big'"),
    case("negative-extrapolate", spec_text("[objectives]\nextrapolate = -2.0\n"),
         r"\[objectives\].extrapolate: must be a finite number >= 0, got -2.0$"),
    case("infinite-extrapolate", spec_text("[objectives]\nextrapolate = inf\n"),
         r"\[objectives\].extrapolate: must be a finite number >= 0, got inf$"),
    case("nan-extrapolate", spec_text("[objectives]\nextrapolate = nan\n"),
         r"\[objectives\].extrapolate: must be a finite number >= 0, got nan$"),
    case("extrapolate-not-a-number", spec_text("[objectives]\nextrapolate = 'two'\n"),
         r"\[objectives\].extrapolate: expected a number, got 'two'$"),
    case("extrapolate-bool", spec_text("[objectives]\nextrapolate = true\n"),
         r"\[objectives\].extrapolate: expected a number, got True$"),
    case("step-time-unprofiled", spec_text(STEP_TIME + "step_time_device = 'h200'\n"),
         r"\[objectives\].step_time_device: 'h200' is not profiled; valid: local$"),
    case("step-time-local-off",
         spec_text("[profile]\nlocal = false\n", STEP_TIME + "step_time_device = 'local'\n"),
         r"\[objectives\].step_time_device: 'local' needs \[profile\].local = true"),
    case("device-without-step-time", spec_text("[objectives]\nstep_time_device = 'local'\n"),
         r"\[objectives\].step_time_device: given but step_time is not an objective"),
    case("unknown-accelerator", spec_text("[profile]\ndevices = ['h100', 'tpu']\n"),
         r"\[profile\].devices: unknown accelerator 'h100'; valid: a100-80gb, h100-sxm"),
    case("profile-dtype", spec_text("[profile]\ndtype = 'fp8'\n"),
         r"\[profile\].dtype: cannot profile 'fp8'"),
    case("bad-sampler", spec_text("[search]\nsampler = 'cmaes'\n"),
         r"\[search\].sampler: unknown sampler 'cmaes'"),
    case("rungs-order", spec_text("[search]\nrungs = [0.5, 0.25]\n"),
         r"\[search\].rungs: must be increasing fractions"),
    case("rung-not-an-eval", spec_text("[search]\nrungs = [0.3]\n"),
         r"\[search\].rungs: 0.3 is not an evaluation point .* \(\[proxy\].evals = 4 evaluates at 0.25"),
    case("byte-corpus-vocab", spec_text(model=MODEL.replace("vocab_size = 256", "vocab_size = 32000")),
         r"\[model\].vocab_size: the bundled corpus is bytes: must be 256, got 32000"),
    case("table-not-table", "model = 3\n", r"\[model\] must be a table, got 3"),
    case("toml-syntax", spec_text("[search]\ntrials = = 3\n"), r"invalid TOML: .*\(at line 11, column 10\)"),
    # tomllib recurses per level: these raised RecursionError
    case("deep-array", "[model]\nd_model = " + "[" * 100_000, r"invalid TOML: nested too deeply"),
    case("deep-inline-table", "[model]\nd_model = " + "{a = " * 100_000, r"invalid TOML: nested too deeply"),
]  # fmt: skip


def test_the_export_rule_samples_only_shapes_the_format_represents():
    from archsearch.space.export import EXPORT_FORMATS

    text = (EXAMPLES / "tiny.toml").read_text()
    free = parse_spec(text, "tiny.toml")
    ruled = parse_spec(text.replace("[rules]\n", "[rules]\nexport = ['hf']\n"), "tiny.toml")
    assert ruled.fingerprint != free.fingerprint  # a different space is a different study
    found = ruled.space.feasibility()
    assert 0 < found.feasible < free.space.feasibility().feasible
    assert dict(found.reasons)["not exportable as hf"] > 0
    configs = sample_configs(ruled.space, 20, seed=1)
    assert configs and all(EXPORT_FORMATS["hf"].refusal(c) is None for c in configs)
    assert {c.norm_placement for c in configs} == {"pre"} and {c.activation for c in configs} == {"swiglu"}


@pytest.mark.parametrize(("text", "match"), BAD)
def test_malformed_specs_fail_with_one_line_naming_the_file_and_key(text, match):
    with pytest.raises(SpecError, match=f"^space.toml: {match}") as info:
        parse_spec(text, "space.toml")
    assert "\n" not in str(info.value)


def test_a_missing_or_unreadable_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match=r"search spec not found: .*nope.toml"):
        load_spec(tmp_path / "nope.toml")
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe[model]")
    with pytest.raises(SpecError, match=r"cannot read search spec .*bin.toml"):
        load_spec(tmp_path / "bin.toml")
    (tmp_path / "bad.toml").write_text("[model]\nvocab_size = \n")
    with pytest.raises(SpecError, match=r"^.*bad.toml: invalid TOML: .*line 2"):
        load_spec(tmp_path / "bad.toml")


def test_objectives_and_profile_dtypes_match_what_the_evaluators_provide():
    assert OBJECTIVES.names() == ("loss", "flops", "step_time", "kv_bytes", "prefill_time", "decode_time")
    profiler = pytest.importorskip("archsearch.evaluators.profiler")
    assert profiler.TORCH_DTYPES.names() == PROFILE_DTYPES


@pytest.mark.parametrize("name", SAMPLERS.names())
def test_every_sampler_builds_a_seeded_multi_objective_sampler(name):
    try:
        sampler = SAMPLERS[name](0, 2)
    except ArchsearchError as exc:  # gp without scipy: a clear error, not a crash
        assert "pip install scipy" in str(exc)
        return
    study = optuna.create_study(directions=["minimize"] * 2, sampler=sampler)
    trial = study.ask()
    trial.suggest_int("d_model", 64, 256, step=64)
    study.tell(trial, [1.0, 2.0])


def test_the_spec_module_imports_without_torch_optuna_or_ray():
    code = (
        "import sys, archsearch.search.spec; "
        "print(','.join(sorted({'torch', 'ray', 'optuna'} & set(sys.modules))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


def test_every_shape_of_the_hf_example_exports_to_hf():
    from archsearch.space.export import EXPORT_FORMATS

    spec = load_spec(EXAMPLES / "tiny-hf.toml")
    configs = sample_configs(spec.space, 1000)  # the space has 270 feasible points: all of them
    assert len(configs) == spec.space.feasibility().feasible == 270
    assert all(EXPORT_FORMATS["hf"].refusal(c) is None for c in configs)
