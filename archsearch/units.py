"""SI magnitudes, read and written one way everywhere: `2M` params, `1.5G` FLOPs, `340u` s.

One table of suffixes serves the parsers (trial filters, `--best-under-flops`) and the
formatters (tables, messages), so a suffix accepted in one place is accepted in all.
"""

from __future__ import annotations

import math
import os
import re
import sys
from decimal import Decimal, DecimalException

from archsearch.errors import ArchsearchError, quoted

# Suffix -> factor, for numbers a user writes. Exact integers, so `1.1M` is 1100000 exactly.
SI_SUFFIXES: dict[str, int] = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
# Model sizes are written "1.3B", "7B": B for billions, an alias of G for counts of things
# (parameters) only. It is not in SI_SUFFIXES because elsewhere B is a unit, bytes (`si(n, "B")`
# prints "1.5GB"), and a filter or FLOPs limit reading "2B" as 2e9 would be a trap.
COUNT_ALIASES: dict[str, str] = {"B": "G"}
# The largest count or byte size a user may write: the database's signed 64-bit BIGINT, so a
# parsed size can be stored, and within a float's range, so the arithmetic on it cannot overflow
# (`--scale-to 1e400` and `--memory 1e400GB` ended in OverflowError tracebacks).
MAX_WHOLE = 2**63 - 1
# Every seed a run takes (the sampler's, a training run's, validate's sample): Optuna seeds numpy's
# RandomState, which takes 0..2**32 - 1; numpy's Generator refuses a negative seed and torch's
# manual_seed one past 2**64 - 1, each with a traceback (`train --seed -1`). One range for all,
# the narrowest, so a seed one command takes every command takes.
SEED_MAX = 2**32 - 1
# The smallest fraction of a CPU or GPU Ray schedules (ray_option_utils._validate_resource_quantity):
# a smaller one, NaN or inf fails inside Ray, after Ray started and the study or ladder was opened.
RAY_RESOURCE_UNIT = 1e-4


# Logical CPUs a local Ray is started with at most (`workers x cpus-per-trial`, or the cores when
# more): Ray 2.60 started with 256 here (2 cores) in 12 s; with 1,024, 10,000 or 100 billion
# (`--workers 99999999999`), each tried under a `ulimit -v` of 8 GB, its start-up did not finish
# in 1-2 minutes and blamed an overloaded GCS.
LOCAL_RAY_MAX_CPUS = 256


def whole(x: float) -> int:
    """`round(x)` for a count made by scaling (tokens x a multiplier), the largest float's where
    the product overflowed to infinity: the bound that checks the count then refuses it in one
    line ("a 309-digit number"), where `round(inf)` would be an OverflowError traceback."""
    return round(min(x, sys.float_info.max))


# What Ray's `address` takes: "auto" (the cluster this machine belongs to), a GCS's HOST:PORT, or a
# Ray Client's ray://HOST:PORT.
_RAY_ADDRESS = re.compile(r"auto|(?:ray://)?[A-Za-z0-9_.\-\[\]:]*[A-Za-z0-9_\]]:[0-9]{1,5}")


def ray_resources_problem(
    cpus: float, gpus: float, per: str, workers: int = 1, address: str | None = None
) -> str | None:
    """What is wrong with `--workers`, `--cpus-per-{per}` and `--gpus-per-{per}` for Ray, or None.

    The one rule of search, validate and ladder: workers at least 1, and for a local Ray (no
    `address`) at most LOCAL_RAY_MAX_CPUS logical CPUs in all (or the cores, where there are more);
    CPUs a finite number >= RAY_RESOURCE_UNIT, GPUs 0 or the same (`validate --gpus-per-run nan`
    passed a `< 0` check and started Ray).
    """
    if address is not None and not _RAY_ADDRESS.fullmatch(address):
        # Checked before Ray sees it: Ray starts a local cluster for `--address ''` as if none were
        # given, and fails `'not a host'` with a ValueError after 8 s of start-up, blamed on the
        # environment (exit 1).
        return f"--address must be auto, HOST:PORT or ray://HOST:PORT, got {quoted(address)}"
    if not (math.isfinite(cpus) and cpus >= RAY_RESOURCE_UNIT):
        return f"--cpus-per-{per} must be a finite number >= {RAY_RESOURCE_UNIT:g}, got {cpus}"
    if not (math.isfinite(gpus) and (gpus == 0 or gpus >= RAY_RESOURCE_UNIT)):
        return f"--gpus-per-{per} must be 0 or a finite number >= {RAY_RESOURCE_UNIT:g}, got {gpus}"
    if workers < 1:
        return f"--workers must be at least 1, got {workers}"
    gpus_here = local_gpu_count() if address is None and gpus > 0 else None
    if gpus_here is not None and gpus > gpus_here:  # Ray queues such a task for ever, silently
        return (
            f"--gpus-per-{per} {gpus:g} is more than the {gpus_here} GPU{'s' if gpus_here != 1 else ''} "
            f"a local Ray finds here: every {per} would wait for one without end; use --gpus-per-{per} 0, "
            "or join a cluster with GPUs (--address)"
        )
    most = max(LOCAL_RAY_MAX_CPUS, os.cpu_count() or 1)
    if address is None and workers * cpus > most:
        return (
            f"--workers {_short(workers)} x --cpus-per-{per} {cpus:g} is more than the {most} CPUs a local "
            "Ray starts with; join a cluster (--address) for more"
        )
    return None


def local_gpu_count() -> int | None:
    """GPUs a local Ray would find here, or None where that cannot be told without starting it.

    CUDA_VISIBLE_DEVICES when set (Ray honours it); else NVIDIA's driver's list of GPUs; else 0
    only where no GPU driver of any kind is present (no NVIDIA or AMD device node, no nvidia-smi
    or rocm-smi). A 0 lets `search --gpus-per-trial 1` refuse at once where Ray would wait for
    ever for a GPU the machine does not have; a driver with no count is None, as it may have GPUs.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "NoDevFiles"])
    nvidia = "/proc/driver/nvidia/gpus"
    if os.path.isdir(nvidia):
        return len(os.listdir(nvidia))
    import shutil

    drivers = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")
    if any(os.path.exists(d) for d in drivers) or shutil.which("nvidia-smi") or shutil.which("rocm-smi"):
        return None
    return 0


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


_MAX_TEXT = "the database stores at most 2**63 - 1 (9.2e18)"


def _short(text: str | int) -> str:
    """A parsed value as messages quote it: a huge integer by its number of digits."""
    if isinstance(text, int):
        return short_number(text)
    return quoted(text)


def short_number(value: float) -> str:
    """A number as a message shows it: an integer past 2**63 - 1 by its number of digits (`str`
    refuses integers of more than 4,300 digits, and 400 flood a line), else in full or `.4g`; what
    is not a number (True, text) as its repr."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, int):
        if abs(value) > MAX_WHOLE:
            # Exact below the 4,300 digits `str` converts; about, from the logarithm, past them.
            exact = abs(value).bit_length() < 14_000
            digits = len(str(abs(value))) if exact else math.floor(math.log10(abs(value))) + 1
            return f"a {digits}-digit number"
        return str(value)
    return f"{value:.4g}"


_COUNT = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]?)\s*")


def parse_count(text: str, what: str = "count") -> int:
    """ "1.3B", "1.3G", "350M", "2e9" -> a positive whole number (rounded to the nearest unit).

    Takes the SI suffixes and COUNT_ALIASES ("B" for billions), as model sizes are written.

    Raises:
        ArchsearchError: not a positive number with an optional suffix; the message names `what`.
    """
    match = _COUNT.fullmatch(text)
    suffix = COUNT_ALIASES.get(match.group(2), match.group(2)) if match else ""
    exact = value = None
    if match is not None and (not suffix or suffix in SI_SUFFIXES):
        try:
            exact = si_value(match.group(1), suffix)
            value = exact.to_integral_value()
        except DecimalException:
            value = None
    if value is not None and value.is_finite() and value > MAX_WHOLE:
        raise ArchsearchError(f"{what} {_short(text)} is too large: {_MAX_TEXT}")
    if value == 0 and exact is not None and exact > 0:  # "0.5": positive, but no whole count
        raise ArchsearchError(f"{what} {_short(text)} rounds to 0: a count is a whole number, at least 1")
    if value is None or not value.is_finite() or value <= 0:
        suffixes = ", ".join([*SI_SUFFIXES, *(f"{a} (= {s})" for a, s in COUNT_ALIASES.items())])
        raise ArchsearchError(
            f"{what} {text!r} must be a positive number, optionally with one of {suffixes} "
            "(e.g. 1.3B or 350M)"
        )
    return int(value)


# Byte units a user writes: SI (decimal, as datasheets state memory) and binary (as allocators do).
BYTE_UNITS: dict[str, int] = {
    "": 1, "B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
}  # fmt: skip
_BYTES = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*")


def parse_bytes(text: str | int, what: str = "memory") -> int:
    """ "80GB" -> 80e9, "16GiB" -> 16 * 2**30, "1e9" or 10**9 -> 10**9: a whole number of bytes >= 0.

    Raises:
        ArchsearchError: not a number >= 0 with an optional unit of BYTE_UNITS; names `what`.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value: Decimal | None = Decimal(text)
    else:
        match = _BYTES.fullmatch(text) if isinstance(text, str) else None
        value = None
        if match is not None and match.group(2) in BYTE_UNITS:
            try:
                value = (Decimal(match.group(1)) * BYTE_UNITS[match.group(2)]).to_integral_value()
            except DecimalException:
                value = None
    if value is not None and value.is_finite() and value > MAX_WHOLE:
        raise ArchsearchError(f"{what} {_short(text)} is too large: {_MAX_TEXT} (bytes)")
    if value is None or not value.is_finite() or value < 0:
        units = ", ".join(u for u in BYTE_UNITS if u)
        raise ArchsearchError(
            f"{what} {text!r} must be a number of bytes >= 0, optionally with one of {units}"
        )
    return int(value)


def env_seconds(name: str, default: float, most: float = 86_400.0) -> float:
    """A bound in seconds from the environment variable `name`, else `default` (unset or empty):
    a number in (0, `most`), so a wait it bounds stays bounded (`inf` would lift the bound).

    Raises:
        ArchsearchError: another value, named (a typo is not silently the default).
    """
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < most:
        raise ArchsearchError(f"${name} must be a number of seconds in (0, {most:g}), got {quoted(text)}")
    return value
