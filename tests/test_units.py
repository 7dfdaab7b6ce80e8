"""One table of SI suffixes for every number a user writes or reads."""

from __future__ import annotations

import pytest

from archsearch.space.export import parse_flops
from archsearch.storage.query import _tokens
from archsearch.units import SI_SUFFIXES, format_si, si_suffixes, si_value


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [(124439808, "", "124.4M"), (0.00034, "s", "340us"), (2e15, "FLOP", "2P" + "FLOP"), (7, "", "7"),
     (0.5, "s", "500ms"), (-3.1e6, "", "-3.1M"), (1e-9, "s", "1e-09s")],
)  # fmt: skip
def test_format_si(value, unit, text):
    assert format_si(value, unit) == text


def test_si_values_are_exact():
    assert si_value("1.1", "M") == 1_100_000 and si_value("7") == 7
    assert si_suffixes() == "k, M, G, T or P"


@pytest.mark.parametrize("suffix", sorted(SI_SUFFIXES))
def test_every_suffix_reads_the_same_in_filters_and_flops_limits(suffix):
    factor = SI_SUFFIXES[suffix]
    [number, _] = list(_tokens(f"3{suffix}"))
    assert number.value == 3 * factor
    assert parse_flops(f"3{suffix}") == 3 * factor
    assert format_si(3 * factor) == f"3{suffix}"
