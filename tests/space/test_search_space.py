from __future__ import annotations

import json

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archsearch.space.costs import param_counts
from archsearch.space.search_space import (
    KNOBS,
    Budget,
    Domain,
    Rejected,
    SearchSpace,
    SpaceError,
    layout_knob,
    sample_configs,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

BASE = {"vocab_size": 256, "seq_len": 64}


def space(budget: Budget | None = None, **knobs) -> SearchSpace:
    """A small space: BASE plus `knobs`, values as given (a Domain samples, anything else is fixed)."""
    merged = {"d_model": 128, "aspect_ratio": 64, **BASE, **knobs}
    return SearchSpace.from_knobs(merged, budget=budget or Budget())


def cat(name: str, *choices) -> Domain:
    return Domain(name, "categorical", choices)


WIDE = dict(
    d_model=Domain("d_model", "int", low=64, high=256, step=64),
    aspect_ratio=cat("aspect_ratio", 16, 32, 64),
    d_ff_ratio=Domain("d_ff_ratio", "float", low=2.0, high=6.0, step=0.5),
    head_dim=cat("head_dim", 32, 64),
    attention_layout=cat("attention_layout", "mha", "gqa:2", "mqa"),
    activation=cat("activation", "gelu", "swiglu", "relu"),
    norm_placement=cat("norm_placement", "pre", "post"),
    tie_embeddings=cat("tie_embeddings", False, True),
)


# --- domains ---
@pytest.mark.parametrize(
    ("domain", "values", "text"),
    [
        (cat("head_dim", 32, 64), (32, 64), "[32, 64]"),
        (Domain("d_model", "int", low=64, high=256, step=64), (64, 128, 192, 256), "64..256 step 64"),
        (Domain("head_dim", "int", low=30, high=33), (30, 31, 32, 33), "30..33"),
        (
            Domain("d_ff_ratio", "float", low=2.0, high=2.3, step=0.1),
            (2.0, 2.1, 2.2, 2.3),
            "2.0..2.3 step 0.1",
        ),
        (Domain("d_ff_ratio", "float", low=1.5, high=6.0, log=True), None, "1.5..6.0 (log)"),
    ],
    ids=["categorical", "int-step", "int", "float-step", "float-log"],
)
def test_domain_forms_list_their_values_and_describe_themselves(domain, values, text):
    assert domain.values() == values
    assert domain.describe() == text
    assert domain.count() == (None if values is None else len(values))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "categorical"}, "at least one choice"),
        ({"kind": "categorical", "choices": (1, 1)}, "choices repeat"),
        ({"kind": "categorical", "choices": ([1], 2)}, "strings, numbers or booleans"),
        ({"kind": "grid", "choices": (1,)}, "kind 'grid' is unknown"),
        ({"kind": "int", "low": 1}, "needs min and max"),
        ({"kind": "int", "low": 8, "high": 4}, "min 8 is above max 4"),
        ({"kind": "int", "low": 1, "high": 2.5}, "integer min, max and step"),
        ({"kind": "int", "low": 1, "high": 9, "step": 0}, "step must be positive"),
        ({"kind": "int", "low": 64, "high": 200, "step": 64}, "multiple of step"),
        ({"kind": "float", "low": 1.0, "high": 4.0, "step": 0.5, "log": True}, "log range needs .* no step"),
        ({"kind": "float", "low": 0.0, "high": 4.0, "log": True}, "log range"),
    ],
    ids=[
        "no-choices", "repeated-choice", "list-choice", "unknown-kind", "no-max", "min-above-max",
        "int-range-of-floats", "zero-step", "step-does-not-fit", "log-with-step", "log-from-zero",
    ],
)  # fmt: skip
def test_bad_domains_are_rejected_naming_the_knob(kwargs, match):
    with pytest.raises(SpaceError, match=f"^d_ff_ratio: .*{match}"):
        Domain("d_ff_ratio", **kwargs)


def test_proposals_are_feasible_by_construction_with_every_knob_suggested_on_every_trial():
    # 64-256 wide with heads of 32 or 64: 1 to 8 heads, so gqa:2 fits only even head counts and
    # mqa needs two heads or more; the 1M budget leaves wide shapes few depths.
    s = space(budget=Budget(params_max=1_000_000), **WIDE)
    assert 0 < len(s.feasible_points) < s.size()  # a third of the grid is infeasible
    for sampler in (optuna.samplers.RandomSampler(seed=0), optuna.samplers.TPESampler(seed=0)):
        study = optuna.create_study(sampler=sampler)
        narrowed = set()
        for _ in range(60):
            trial = study.ask()
            cfg = s.sample(trial)  # never Rejected: only feasible values are offered
            p = trial.params
            assert [name.partition("|")[0] for name in p] == [d.name for d in s.domains] == list(WIDE)
            narrowed |= {name for name in p if "|" in name}
            assert s.config_from_params(p) == cfg
            assert cfg.d_model % cfg.head_dim == 0 and cfg.n_heads % cfg.n_kv_heads == 0
            study.tell(trial, cfg.d_model / 1000 + 1 / cfg.n_layers)
        # Knobs narrowed by what came before: a name per set of values left, so Optuna keeps
        # one set of choices per name (an int range narrowed to a run stays a range).
        assert any(n.startswith("attention_layout|") for n in narrowed)
        assert any(n.startswith("aspect_ratio|") for n in narrowed)


def test_the_feasibility_check_enumerates_the_points_sampling_uses_in_the_same_pass():
    checked, fresh = (space(budget=Budget(params_max=1_000_000), **WIDE) for _ in range(2))
    found = checked.check_feasible()
    assert "feasible_points" in checked.__dict__  # set by the check: sampling enumerates nothing more
    assert checked.feasible_points == fresh.feasible_points and len(checked.feasible_points) == found.feasible


def test_a_space_too_large_to_enumerate_is_suggested_as_is_and_may_reject():
    s = space(**{**WIDE, "d_ff_ratio": Domain("d_ff_ratio", "float", low=2.0, high=6.0)})  # continuous
    assert s.feasible_points is None
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    outcomes = []
    for _ in range(40):
        trial = study.ask()
        try:
            cfg = s.sample(trial)
        except Rejected as exc:
            outcomes.append(exc.kind)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        assert list(trial.params) == list(WIDE)  # every knob under its own name
        assert s.config_from_params(trial.params) == cfg
        outcomes.append("ok")
        study.tell(trial, 1.0)
    assert "ok" in outcomes and len(set(outcomes)) > 1


def test_gated_parity_takes_two_thirds_of_the_ratio_rounded_up_to_the_multiple():
    knobs = dict(d_model=256, d_ff_ratio=4, activation="swiglu")
    assert space(**knobs).config_from_params({}).d_ff == 704  # 2/3 * 4 * 256 = 682.7 -> 704
    plain = SearchSpace.from_knobs({**BASE, **knobs, "aspect_ratio": 64}, gated_parity=False)
    assert plain.config_from_params({}).d_ff == 1024
    assert space(**{**knobs, "activation": "gelu"}).config_from_params({}).d_ff == 1024


def test_a_float_ratio_off_by_binary_error_does_not_round_up_a_whole_multiple():
    s = space(
        d_model=640, activation="gelu", d_ff_ratio=Domain("d_ff_ratio", "float", low=2.0, high=2.5, step=0.1)
    )
    # 2.3 * 640 = 1472 = 23 * 64 exactly; the float 2.0 + 3 * 0.1 is a hair above 2.3.
    assert s.config_from_params({"d_ff_ratio": 2.0 + 3 * 0.1}).d_ff == 1472


@pytest.mark.parametrize(
    ("knobs", "kind", "reason"),
    [
        ({"d_model": 192, "head_dim": 128}, "head_dim does not divide d_model",
         "head_dim 128 does not divide d_model 192"),
        ({"d_model": 192, "head_dim": 64, "attention_layout": "gqa:2"}, "gqa group does not divide n_heads",
         "gqa:2 does not divide n_heads 3"),
        ({"d_model": 128, "head_dim": 64, "attention_layout": "gqa:2"}, "gqa group equals n_heads (mqa)",
         "gqa:2 with 2 heads is mqa"),
        ({"d_model": 64, "head_dim": 64, "attention_layout": "mqa"}, "mqa with one head is mha",
         "single head is mha"),
        ({"d_model": 66, "head_dim": 33}, "rope needs an even head_dim", "even head_dim, got 33"),
    ],
    ids=["head-dim", "gqa-divides", "gqa-is-mqa", "mqa-is-mha", "rope-odd"],
)  # fmt: skip
def test_knobs_that_do_not_fit_together_are_rejected_with_a_reason(knobs, kind, reason):
    rules = {"multiple_of": 2} if knobs["d_model"] == 66 else {}
    s = SearchSpace.from_knobs({**BASE, "aspect_ratio": 64, **knobs}, **rules)
    with pytest.raises(Rejected, match=reason) as info:
        s.config_from_params({})
    assert info.value.kind == kind


def test_gqa_derives_kv_heads_from_the_group():
    cfg = space(d_model=256, head_dim=32, attention_layout="gqa:4").config_from_params({})
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.kv_groups) == (8, 2, 4)


def test_budget_violations_read_as_sentences():
    cfg = space(d_model=256, aspect_ratio=16).config_from_params({})
    assert param_counts(cfg).total > 3e6
    assert Budget(params_max=2_000_000).violation(cfg).startswith("params ")
    assert " above the budget's max 2M" in Budget(params_max=2_000_000).violation(cfg)
    assert "below the budget's min 1G" in Budget(params_min=10**9).violation(cfg)
    assert "forward FLOPs/token" in Budget(flops_max=1e6).violation(cfg)
    assert Budget(params_max=10**9).violation(cfg) is None
    with pytest.raises(Rejected, match="above the budget's max 2M") as info:
        space(Budget(params_max=2_000_000), d_model=256, aspect_ratio=16).config_from_params({})
    assert info.value.kind == "params above budget"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"params_min": 5, "params_max": 2}, "^params: min 5 is above max 2"),
        ({"params_max": 2.5}, "^params: expected an integer"),
        ({"flops_max": -1.0}, "^flops_per_token: must be positive"),
    ],
    ids=["min-above-max", "fractional-params", "negative-flops"],
)
def test_bad_budgets_are_errors(kwargs, match):
    with pytest.raises(SpaceError, match=match):
        Budget(**kwargs)


@pytest.mark.parametrize(
    ("knobs", "match"),
    [
        ({"n_layers": 4}, r"^n_layers: unknown knob \(n_layers derives from aspect_ratio\)"),
        ({"d_model": None}, "^d_model: required"),
        ({"vocab_size": cat("vocab_size", 256, 512)}, "^vocab_size: must be a single value"),
        ({"d_model": 96}, "^d_model: 96 is not a multiple of multiple_of=64"),
        ({"d_model": Domain("d_model", "int", low=64, high=256, step=32)}, "^d_model: 96 is not a multiple"),
        ({"d_model": Domain("d_model", "float", low=64.0, high=128.0)}, "^d_model: takes integers"),
        ({"activation": cat("activation", "gelu", "swishy")}, "^activation: unknown activation 'swishy'"),
        ({"norm": "batchnorm"}, "^norm: unknown norm 'batchnorm'; valid: layernorm, rmsnorm"),
        ({"attention_layout": "gqa"}, "^attention_layout: unknown layout 'gqa'"),
        ({"attention_layout": "gqa:1"}, "^attention_layout: 'gqa:1' has one query head per KV head"),
        ({"activation": Domain("activation", "int", low=1, high=2)}, "^activation: takes a value or a list"),
        ({"bias": "yes"}, "^bias: expected true or false, got 'yes'"),
        ({"aspect_ratio": 0}, "^aspect_ratio: must be positive"),
    ],
    ids=[
        "derived-field", "missing-d_model", "searched-vocab", "d_model-alignment", "d_model-range-step",
        "d_model-float-range", "bad-activation", "bad-norm", "bad-layout", "gqa-1", "range-of-names",
        "bool-as-string", "zero-aspect",
    ],
)  # fmt: skip
def test_bad_spaces_are_errors_naming_the_knob(knobs, match):
    merged = {"d_model": 128, "aspect_ratio": 64, **BASE, **knobs}
    with pytest.raises(SpaceError, match=match):
        SearchSpace.from_knobs({k: v for k, v in merged.items() if v is not None})


def test_feasibility_enumerates_small_spaces_and_draws_from_large_ones_deterministically():
    s = space(Budget(params_max=2_000_000), **WIDE)
    assert s.size() == 4 * 3 * 9 * 2 * 3 * 3 * 2 * 2
    full = s.feasibility()
    assert full.exhaustive and full.checked == s.size()
    assert 0 < full.feasible < full.checked
    assert full.reasons[0] == ("params above budget", max(n for _, n in full.reasons))
    assert full.params_range[0] < 2_000_000 < full.params_range[1]  # over valid configs, in budget or not
    drawn = s.feasibility(max_enumerate=0, draws=300, seed=1)
    assert not drawn.exhaustive and drawn.checked == 300
    assert drawn == s.feasibility(max_enumerate=0, draws=300, seed=1)
    assert drawn != s.feasibility(max_enumerate=0, draws=300, seed=2)


def test_a_continuous_domain_makes_the_space_infinite_and_is_drawn_log_uniformly():
    s = space(d_ff_ratio=Domain("d_ff_ratio", "float", low=1.0, high=8.0, log=True))
    assert s.size() is None
    found = s.feasibility(draws=50)
    assert (found.exhaustive, found.checked, found.feasible) == (False, 50, 50)


def test_check_feasible_names_the_budget_and_the_costs_seen():
    s = space(Budget(params_max=1000), **WIDE)
    with pytest.raises(SpaceError, match="no config in the space meets the budget of params <= 1k") as info:
        s.check_feasible()
    assert "params above budget x" in str(info.value) and "params range seen 45.2k..16.9M" in str(info.value)
    with pytest.raises(SpaceError, match="no valid config in the space"):
        space(d_model=192, head_dim=cat("head_dim", 128, 256)).check_feasible()
    assert space(**WIDE).check_feasible().feasible > 0


def test_sample_configs_are_distinct_feasible_and_smallest_first():
    s = space(Budget(params_max=2_000_000), **WIDE)
    configs = sample_configs(s, 5, seed=3)
    assert len(set(configs)) == 5
    assert all(s.budget.violation(c) is None for c in configs)
    sizes = [param_counts(c).total for c in configs]
    assert sizes == sorted(sizes)
    assert configs == sample_configs(s, 5, seed=3)
    drawn = sample_configs(s, 5, seed=3, max_enumerate=0)
    assert len(drawn) == 5 and all(s.budget.violation(c) is None for c in drawn)
    assert len(sample_configs(space(), 5)) == 1  # a space of one point


def test_to_dict_is_canonical_json_with_defaults_spelled_out():
    implicit, explicit = space(**WIDE), space(**WIDE, norm="rmsnorm", qk_norm=False)
    assert implicit.to_dict() == explicit.to_dict()
    data = json.loads(json.dumps(implicit.to_dict()))
    assert [d["name"] for d in data["domains"]] == list(WIDE)
    assert list(data["fixed"]) == [k for k in KNOBS if k not in WIDE]
    assert (data["fixed"]["norm"], data["fixed"]["qk_norm"], data["fixed"]["bias"]) == (
        "rmsnorm",
        False,
        False,
    )


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_every_drawn_point_is_a_consistent_config_or_a_rejection(seed):
    s = space(Budget(params_max=3_000_000), **WIDE)
    for point in s._points(max_enumerate=0, draws=5, seed=seed)[0]:
        try:
            cfg = s.config_from_params(point)
        except Rejected as exc:
            assert exc.kind and exc.reason
            continue
        assert cfg.n_heads * cfg.head_dim == cfg.d_model == point["d_model"]
        assert cfg.d_ff % 64 == 0 and param_counts(cfg).total <= 3_000_000
        assert cfg.n_layers == max(1, round(cfg.d_model / point["aspect_ratio"]))
        assert cfg.attention_layout == point["attention_layout"].split(":")[0]
        assert layout_knob(cfg.n_heads, cfg.n_kv_heads) == point["attention_layout"]  # the exact inverse
