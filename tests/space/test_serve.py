"""Serving costs: exact cache and weight bytes, the largest batch that fits, the scenario's rules."""

from __future__ import annotations

import dataclasses
import re

import pytest

from archsearch.errors import ArchsearchError
from archsearch.space import preset
from archsearch.space.costs import kv_cache_bytes, max_serve_batch, serve_memory_bytes, weight_bytes
from archsearch.space.serve import ServeError, ServeScenario, serve_costs
from archsearch.units import parse_bytes

LLAMA2 = preset("llama2-7b")


def test_llama2_7b_cache_is_512_kib_per_token_and_2_gib_at_4096():
    # BRIEF.md section 11: 32 layers x 32 KV heads of 128, key and value, 2 bytes.
    assert kv_cache_bytes(LLAMA2, 1) == 512 * 2**10
    assert kv_cache_bytes(LLAMA2, 4096) == 2 * 2**30
    assert kv_cache_bytes(LLAMA2, 4096, batch=3, dtype="fp8") == 3 * 2**30
    assert kv_cache_bytes(LLAMA2, 0) == 0
    # Llama-3-8B's GQA (8 KV heads) holds a quarter of that per token.
    assert kv_cache_bytes(preset("llama3-8b"), 1) == 128 * 2**10


@pytest.mark.parametrize(
    ("kv_heads", "per_token"), [(32, 2 * 32 * 32 * 128 * 2), (8, 2 * 32 * 8 * 128 * 2), (1, 2 * 32 * 128 * 2)]
)
def test_grouping_divides_the_cache_and_depth_multiplies_it(kv_heads, per_token):
    cfg = dataclasses.replace(LLAMA2, n_kv_heads=kv_heads)
    assert kv_cache_bytes(cfg, 1) == per_token
    deeper = dataclasses.replace(cfg, n_layers=64)
    assert kv_cache_bytes(deeper, 1) == 2 * per_token


def test_the_largest_batch_that_fits_is_free_memory_over_one_sequences_cache():
    weights = 6_738_415_616 * 2  # the published count in bf16
    assert weight_bytes(LLAMA2) == weights
    # (80e9 - 13.48e9) / 2 GiB = 30.98: 30 sequences of 4096 tokens fit an 80 GB part.
    assert max_serve_batch(LLAMA2, 4096, 80 * 10**9) == 30
    assert serve_memory_bytes(LLAMA2, 30, 4096) <= 80 * 10**9 < serve_memory_bytes(LLAMA2, 31, 4096)
    # Working memory is taken first; too little memory for the weights is no batch at all.
    assert max_serve_batch(LLAMA2, 4096, 80 * 10**9, working_bytes=3 * 2**30) == 29
    assert max_serve_batch(LLAMA2, 4096, weights) == 0
    assert max_serve_batch(LLAMA2, 4096, 10**9) == 0
    # fp8 weights and cache: half the weights, twice the sequences per byte.
    assert max_serve_batch(LLAMA2, 4096, 80 * 10**9, "fp8", "fp8") == (80 * 10**9 - weights // 2) // 2**30


def test_serve_costs_take_a_catalogued_gpus_memory_as_the_limit():
    from archsearch.evaluators.hardware_serving import resolve_scenario  # the catalogue is the evaluators'

    def serve_costs_on(cfg, scenario):
        return serve_costs(cfg, resolve_scenario(scenario))

    costs = serve_costs_on(LLAMA2, ServeScenario(batch=1, prompt_len=4000, gen_len=96, device="h100-sxm"))
    assert costs.kv_bytes_per_token == 512 * 2**10
    assert costs.kv_bytes == 2 * 2**30
    assert costs.memory_limit == 80 * 10**9 and costs.max_batch == 30 and costs.fits
    too_many = serve_costs_on(LLAMA2, ServeScenario(batch=31, prompt_len=4096, gen_len=1, device="h100-sxm"))
    assert too_many.max_batch == 30 and not too_many.fits
    local = serve_costs(LLAMA2, ServeScenario())
    assert local.memory_limit is None and local.max_batch is None and local.fits
    stated = serve_costs(LLAMA2, ServeScenario(device="cpu", memory_bytes=parse_bytes("16GiB")))
    assert stated.memory_limit == 16 * 2**30 and stated.max_batch == (16 * 2**30 - 13_476_831_232) // (
        640 * 2**19
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"batch": 0}, "batch must be a positive integer up to 2**31 - 1, got 0"),
        ({"prompt_len": 1.5}, "prompt_len must be a positive integer up to 2**31 - 1, got 1.5"),
        ({"gen_len": True}, "gen_len must be a positive integer up to 2**31 - 1, got True"),
        ({"weight_dtype": "int3"}, "weight_dtype 'int3' is unknown; valid: fp32, bf16, fp16, fp8"),
        ({"cache_dtype": "bf17"}, "cache_dtype 'bf17' is unknown"),
        ({"device": ""}, "device must be a device name, got ''"),
        ({"memory_bytes": -1}, "memory_bytes must be a whole number of bytes >= 0, got -1"),
        ({"memory_bytes": 0}, "a memory limit of 0 bytes holds no shape: give more, or none for no limit"),
        ({"working_bytes": None}, "working_bytes must be a whole number of bytes >= 0, got None"),
    ],
)
def test_a_bad_scenario_is_one_line_naming_the_field(changes, message):
    with pytest.raises(ServeError, match=re.escape(message)) as info:
        ServeScenario(**changes)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ArchsearchError)


def test_scenario_devices_and_context():
    from archsearch.evaluators.hardware_serving import resolve_scenario

    assert ServeScenario(device="cuda:1").local and not ServeScenario(device="cuda:1").modelled
    assert ServeScenario(device="h200").modelled and ServeScenario(device="h200").memory_limit is None
    assert resolve_scenario(ServeScenario(device="h200")).memory_limit == 141 * 10**9
    assert resolve_scenario(ServeScenario(device="h200", memory_bytes=7)).memory_limit == 7
    assert resolve_scenario(ServeScenario(device="cpu")) == ServeScenario(device="cpu")
    for bad in ("tpu-v5", "cuda:x"):
        with pytest.raises(
            ServeError, match=f"unknown device '{bad}'; measured: local, cpu, cuda, cuda:N; modelled: a100"
        ):
            resolve_scenario(ServeScenario(device=bad))
    assert ServeScenario(prompt_len=100, gen_len=28).context == 128
    assert ServeScenario().replace(batch=4).batch == 4
    with pytest.raises(ServeError):
        ServeScenario().replace(batch=-4)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80GB", 80 * 10**9),
        ("16GiB", 16 * 2**30),
        ("1.5 MB", 1_500_000),
        ("1e9", 10**9),
        (123, 123),
        ("0", 0),
    ],
)
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["-1GB", "80 gigs", "GB", "", True, "nan"])
def test_parse_bytes_rejects(text):
    with pytest.raises(ArchsearchError, match="must be a number of bytes >= 0"):
        parse_bytes(text, "memory")
