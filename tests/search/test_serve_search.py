"""Serving in the search: the [serve] table, its memory limit as feasibility, the serving
objectives told to Optuna and stored with each trial."""

from __future__ import annotations

import sys

import optuna
import pytest
from ray import cloudpickle

from archsearch.evaluators.hardware_serving import scenario_report
from archsearch.search.driver import SearchOptions, objective_values, run_search, with_serve_times
from archsearch.search.spec import SpecError, load_spec
from archsearch.space.costs import serve_memory_bytes
from archsearch.space.search_space import Rejected
from archsearch.storage import Storage
from archsearch.trial import TrialOutcome
from tests.specs import tiny_spec

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers need not import tests/

SERVE = 'batch = 8\nprompt_len = 2048\ngen_len = 64\ndevice = "h100-sxm"\nmemory = "1GB"'
DECODE = 'minimize = ["loss", "flops", "decode_time"]'


def test_the_serve_table_is_a_scenario():
    spec = tiny_spec(serve=SERVE + '\nworking_memory = "16MiB"\ncache_dtype = "fp8"', objectives=DECODE)
    s = spec.serve
    assert (s.batch, s.prompt_len, s.gen_len, s.device, s.cache_dtype) == (8, 2048, 64, "h100-sxm", "fp8")
    assert s.memory_bytes == 10**9 and s.working_bytes == 16 * 2**20 and s.context == 2112
    assert spec.objectives == ("loss", "flops", "decode_time")
    assert tiny_spec().serve is None
    # The scenario changes what a study scores: it is in the fingerprint; without one it is not.
    assert spec.fingerprint != tiny_spec(serve=SERVE.replace("8", "4", 1), objectives=DECODE).fingerprint
    assert "serve" not in tiny_spec().to_dict()["space"]


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        (
            {"serve": "batch = 0"},
            r"tiny.toml: \[serve\]: batch must be a positive integer up to 2\*\*31 - 1, got 0",
        ),
        ({"serve": "beams = 4"}, r"tiny.toml: \[serve\].beams: unknown key; valid: batch, prompt_len"),
        ({"serve": 'memory = "lots"'}, r"\[serve\].memory: memory 'lots' must be a number of bytes >= 0"),
        ({"serve": "memory = true"}, r"\[serve\].memory: expected bytes, e.g. 80GB, got True"),
        ({"serve": 'device = "tpu"'}, r"\[serve\]: unknown device 'tpu'; measured: local"),
        (
            {"objectives": DECODE},
            r"\[objectives\].minimize: decode_time needs a \[serve\] table whose device",
        ),
        (
            {"objectives": 'minimize = ["loss", "prefill_time"]', "serve": 'device = "local"'},
            r"\[objectives\].minimize: prefill_time needs a \[serve\] table whose device is a catalogued GPU",
        ),
    ],
)
def test_a_bad_serve_table_is_one_line(tables, message):
    with pytest.raises(SpecError, match=message) as info:
        tiny_spec(**tables)
    assert "\n" not in str(info.value)


def test_kv_bytes_needs_no_scenario():
    spec = tiny_spec(objectives='minimize = ["loss", "kv_bytes"]')
    assert spec.objectives == ("loss", "kv_bytes")


def test_shapes_over_the_memory_limit_are_infeasible_before_any_compute():
    spec = load_spec("examples/tiny-serve.toml")
    space, s = spec.space, spec.serve
    found = space.feasibility()
    assert dict(found.reasons)["serving memory above limit"] == 18
    names = [d.name for d in space.domains]
    configs = [space.config_from_params(dict(zip(names, p, strict=True))) for p in space.feasible_points]
    assert len(configs) == found.feasible
    need = [serve_memory_bytes(c, s.batch, s.context, s.weight_dtype, s.cache_dtype) for c in configs]
    assert max(need) <= s.memory_limit
    assert {c.attention_layout for c in configs} == {"mha", "gqa", "mqa"}
    # A 16-layer MHA shape within the parameter budget needs 1.14 GB: rejected with the reason.
    deep = {"d_model": 128, "aspect_ratio": 16, "d_ff_ratio": 2.0, "head_dim": 32, "attention_layout": "mha"}
    with pytest.raises(
        Rejected, match=r"serving 64 x 4352 tokens needs 1.14GB, above the memory limit 1GB"
    ) as info:
        space.config_from_params({**deep, "activation": "swiglu"})
    assert info.value.kind == "serving memory above limit" and "largest batch that fits: 55" in str(
        info.value
    )
    assert space.config_from_params({**deep, "attention_layout": "mqa", "activation": "swiglu"})


def test_the_serving_objectives_are_the_scenarios_modelled_times():
    spec = tiny_spec(serve=SERVE, objectives=DECODE)
    cfg = spec.space.config_from_params({"d_model": 64, "aspect_ratio": 32, "activation": "gelu"})
    outcome = with_serve_times(spec, cfg, TrialOutcome(status="complete", train={"val_loss": 2.5}))
    report = scenario_report(cfg, spec.serve)
    assert outcome.decode_time_s == report.decode.time_s and outcome.prefill_time_s == report.prefill.time_s
    assert objective_values(spec, outcome, cfg)[2] == report.decode.time_s
    failed = TrialOutcome(status="failed", reason="nan")
    assert with_serve_times(spec, cfg, failed) is failed


def instant(request, known=None, board=None):
    cfg = request.config
    loss = 1.0 + 1 / cfg.d_model + cfg.n_layers / 100
    return TrialOutcome(status="complete", train={"val_loss": loss, "tokens": 1, "val_curve": [[1, loss]]})


@pytest.mark.usefixtures("ray_session")
def test_a_search_stores_and_tells_optuna_the_decode_time(tmp_path):
    spec = tiny_spec(serve=SERVE, objectives=DECODE, profile="local = false")
    with Storage.open(f"sqlite:///{tmp_path / 'trials.db'}") as db:
        run_search(spec, db, SearchOptions(study="s", trials=4), evaluate_fn=instant)
        records = [r for r in db.trials("s") if r.status == "complete"]
        assert len(records) == 4
        for r in records:
            report = scenario_report(r.config, spec.serve)
            assert r["decode_time_s"] == report.decode.time_s and r["prefill_time_s"] == report.prefill.time_s
        study = optuna.load_study(study_name="s", storage=db.url)
        told = {t.number: t.values[2] for t in study.trials if t.values}
        assert sorted(told.values()) == sorted(r["decode_time_s"] for r in records)
