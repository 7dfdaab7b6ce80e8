"""SI magnitudes, read and written one way everywhere: `2M` params, `1.5G` FLOPs, `340u` s.

One table of suffixes serves the parsers (trial filters, `--best-under-flops`) and the
formatters (tables, messages), so a suffix accepted in one place is accepted in all.
"""

from __future__ import annotations

from decimal import Decimal

# Suffix -> factor, for numbers a user writes. Exact integers, so `1.1M` is 1100000 exactly.
SI_SUFFIXES: dict[str, int] = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
# What formatting uses, largest first; small quantities (seconds) get milli and micro too.
_FORMAT_PREFIXES = (
    *((float(f), s) for s, f in sorted(SI_SUFFIXES.items(), key=lambda kv: -kv[1])),
    (1.0, ""),
    (1e-3, "m"),
    (1e-6, "u"),
)


def si_suffixes() -> str:
    """ "k, M, G, T or P": the suffixes, for messages."""
    names = list(SI_SUFFIXES)
    return ", ".join(names[:-1]) + " or " + names[-1]


def si_value(digits: str, suffix: str = "") -> Decimal:
    """`("1.5", "G")` -> Decimal 1500000000, exactly.

    Raises:
        KeyError: an unknown suffix (callers say what they accept, via `si_suffixes`).
        decimal.InvalidOperation: `digits` is not a number.
    """
    return Decimal(digits) * (SI_SUFFIXES[suffix] if suffix else 1)


def format_si(value: float, unit: str = "", digits: int = 4) -> str:
    """`124439808` -> `124.4M`, `0.00034` -> `340u`: short magnitudes for tables and messages."""
    for factor, prefix in _FORMAT_PREFIXES:
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g}{prefix}{unit}"
    return f"{value:.{digits}g}{unit}"
