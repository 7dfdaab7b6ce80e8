"""`SearchSpace`: the knobs a search samples, the rules that derive a shape from them, a budget.

A point of the space is a dict of knob values, one per `Domain`, whose names are the Optuna
parameter names. `config_from_params` turns a point into an `ArchConfig` through
`knobs.config_from_knobs`, or raises `Rejected` with the reason: knobs that do not fit together
(a head_dim that does not divide d_model, a GQA group that does not divide the heads) or a shape
outside the `Budget`. Every domain is suggested on every trial. Where the space can be
enumerated, `sample` proposes only feasible points: each knob among the values that still lead
to a valid, in-budget shape, under a name that says so when that is fewer than all of them.

Knobs, in the canonical order (`KNOBS`) that domains are suggested in:
vocab_size, seq_len (fixed), d_model, aspect_ratio (`n_layers = max(1, round(d_model / ratio))`),
d_ff_ratio (`d_ff = knobs.aligned_d_ff(...)`), head_dim (`n_heads = d_model // head_dim`),
attention_layout ("mha", "mqa" or "gqa:G", G query heads per KV head), activation, norm,
norm_placement, pos_embedding, parallel_block, bias, tie_embeddings, qk_norm.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from archsearch.errors import ConfigError, quoted
from archsearch.registry import Registry
from archsearch.space.config import ACTIVATIONS, NORM_PLACEMENTS, NORMS, POSITIONS, ArchConfig
from archsearch.space.costs import flop_counts, max_serve_batch, param_counts, serve_memory_bytes
from archsearch.space.knobs import (
    DEFAULT_D_FF_RATIO,
    DEFAULT_HEAD_DIM,
    DEFAULT_MULTIPLE_OF,
    config_from_knobs,
)
from archsearch.space.serve import ServeScenario
from archsearch.units import MAX_WHOLE, format_si


class SpaceError(ConfigError):
    """A search space that is badly defined; `key` names the knob (or budget key) at fault."""

    def __init__(self, detail: str, key: str | None = None) -> None:
        super().__init__(f"{key}: {detail}" if key else detail)
        self.detail, self.key = detail, key


class Rejected(ConfigError):
    """A sampled point that is not a valid or in-budget config. `kind` groups similar reasons."""

    def __init__(self, reason: str, kind: str = "invalid config") -> None:
        super().__init__(reason)
        self.reason, self.kind = reason, kind


# --- knobs: what each accepts ---
def _positive_int(v: Any) -> str | None:
    if not isinstance(v, int) or isinstance(v, bool):
        return f"expected an integer, got {v!r}"
    return None if v > 0 else f"must be positive, got {v}"


def _positive_number(v: Any) -> str | None:
    if not isinstance(v, int | float) or isinstance(v, bool):
        return f"expected a number, got {v!r}"
    return None if v > 0 and math.isfinite(v) else f"must be positive and finite, got {v}"


def _boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else f"expected true or false, got {v!r}"


def _name_in(registry: Registry[Any]) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if not isinstance(v, str):
            return f"expected a string, got {v!r}"
        return None if v in registry else f"unknown {registry.kind} {v!r}; valid: {', '.join(registry)}"

    return check


def _gqa_group(layout: str) -> int | None:
    """G of "gqa:G" (query heads per KV head), or None when `layout` has another form."""
    prefix, _, group = layout.partition(":")
    # More than 18 digits is no head count (and `int` refuses 4,300 with a traceback); ASCII
    # digits only, as written in a space file (`int` reads "gqa:٢", Arabic-Indic, as 2).
    whole = group.isascii() and group.isdecimal() and len(group) <= 18
    return int(group) if prefix == "gqa" and whole else None


def layout_knob(n_heads: int, n_kv_heads: int) -> str:
    """The `attention_layout` knob value that gives these head counts: "mha", "mqa" or "gqa:G"
    (G query heads per KV head). A single head is "mha", as in `ArchConfig.attention_layout`."""
    if n_kv_heads == n_heads:
        return "mha"
    return "mqa" if n_kv_heads == 1 else f"gqa:{n_heads // n_kv_heads}"


def _layout(v: Any) -> str | None:
    if not isinstance(v, str):
        return f"expected a string, got {v!r}"
    if v in ("mha", "mqa"):
        return None
    group = _gqa_group(v)
    if group is None:
        return f"unknown layout {quoted(v)}; valid: mha, mqa, gqa:G (G query heads per KV head, G >= 2)"
    return None if group >= 2 else f"{v!r} has one query head per KV head: write 'mha'"


@dataclass(frozen=True)
class Knob:
    """A search knob: its name (an ArchConfig field where one exists) and what it accepts."""

    name: str
    numeric: bool  # accepts ranges {min, max, step, log}
    integer: bool  # ranges must be of integers
    check: Callable[[Any], str | None]  # one value -> the reason it is invalid, or None
    default: Any = None  # the value when the space does not give the knob; None: required


_A = ArchConfig  # the variant fields default to the config's own defaults
KNOBS: Registry[Knob] = Registry("knob")  # registration order is the suggestion order
for _knob in (
    Knob("vocab_size", True, True, _positive_int),
    Knob("seq_len", True, True, _positive_int),
    Knob("d_model", True, True, _positive_int),
    Knob("aspect_ratio", True, False, _positive_number),
    Knob("d_ff_ratio", True, False, _positive_number, DEFAULT_D_FF_RATIO),
    Knob("head_dim", True, True, _positive_int, DEFAULT_HEAD_DIM),
    Knob("attention_layout", False, False, _layout, "mha"),
    Knob("activation", False, False, _name_in(ACTIVATIONS), _A.activation),
    Knob("norm", False, False, _name_in(NORMS), _A.norm),
    Knob("norm_placement", False, False, _name_in(NORM_PLACEMENTS), _A.norm_placement),
    Knob("pos_embedding", False, False, _name_in(POSITIONS), _A.pos_embedding),
    Knob("parallel_block", False, False, _boolean, _A.parallel_block),
    Knob("bias", False, False, _boolean, _A.bias),
    Knob("tie_embeddings", False, False, _boolean, _A.tie_embeddings),
    Knob("qk_norm", False, False, _boolean, _A.qk_norm),
):
    KNOBS.register(_knob.name, _knob)
REQUIRED = tuple(k.name for _, k in KNOBS.items() if k.default is None)
CONDITION = "|"  # joins a knob's name and the values it was narrowed to (`Domain.suggest_among`)
MAX_PARAMS = MAX_WHOLE  # the trial database's BIGINT (storage.schema.Trial.params_total)
MAX_ENUMERATE = 100_000  # spaces up to this many points are enumerated (feasibility, sampling)
SINGLE_VALUED = ("vocab_size", "seq_len")  # the data fixes them; searching them compares apples to pears
# ArchConfig fields the space derives, with the knob that sets each (for a helpful error).
DERIVED = {
    "n_layers": "aspect_ratio",
    "n_heads": "head_dim",
    "n_kv_heads": "attention_layout",
    "d_ff": "d_ff_ratio",
}


@dataclass(frozen=True)
class Domain:
    """The values one knob is sampled from: a categorical choice or an int / float range.

    Raises:
        SpaceError: an unknown kind, no choices, min > max, a non-positive step, log with step.
    """

    name: str  # the knob, also the Optuna parameter name
    kind: str  # "categorical", "int" or "float"
    choices: tuple[Any, ...] = ()  # categorical: str, int, float or bool values
    low: float | None = None
    high: float | None = None
    step: float | None = None  # None: every int, or a continuous float
    log: bool = False  # sample log-uniformly (ranges only)

    def __post_init__(self) -> None:
        def fail(detail: str) -> SpaceError:
            return SpaceError(detail, key=self.name)

        if self.kind == "categorical":
            if not self.choices:
                raise fail("needs at least one choice")
            if not all(isinstance(c, str | int | float | bool) for c in self.choices):
                raise fail(f"choices must be strings, numbers or booleans, got {list(self.choices)!r}")
            if len({(type(c), c) for c in self.choices}) < len(self.choices):
                raise fail(f"choices repeat: {list(self.choices)!r}")
            return
        if self.kind not in ("int", "float"):
            raise fail(f"domain kind {self.kind!r} is unknown; valid: categorical, int, float")
        if self.low is None or self.high is None:
            raise fail("a range needs min and max")
        bounds = [b for b in (self.low, self.high, self.step) if b is not None]
        if not all(isinstance(b, int | float) and not isinstance(b, bool) for b in bounds):
            raise fail(f"range bounds must be numbers, got {bounds!r}")
        if self.kind == "int" and not all(isinstance(b, int) for b in bounds):
            raise fail(f"an int range needs integer min, max and step, got {bounds!r}")
        if self.low > self.high:
            raise fail(f"min {self.low} is above max {self.high}")
        if self.step is not None and self.step <= 0:
            raise fail(f"step must be positive, got {self.step}")
        # Optuna takes no step on log ranges (an int log range steps by 1).
        if self.log and (self.low <= 0 or not (self.step is None or (self.kind == "int" and self.step == 1))):
            raise fail("a log range needs min > 0 and no step")
        if self.step is not None:
            n = (self.high - self.low) / self.step
            if abs(n - round(n)) > 1e-9:
                raise fail(f"max - min ({self.high} - {self.low}) must be a multiple of step {self.step}")

    def suggest(self, trial: Any) -> Any:
        """Ask `trial` (duck-typed like `optuna.Trial`) for this knob's value."""
        if self.kind == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.name, self.low, self.high, step=self.step or 1, log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)

    def count(self) -> int | None:
        """Number of distinct values, None for a continuous float range."""
        if self.kind == "categorical":
            return len(self.choices)
        if self.kind == "float" and self.step is None:
            return None
        return round((self.high - self.low) / (self.step or 1)) + 1

    def values(self) -> tuple[Any, ...] | None:
        """Every value when finite (in order), else None. Materialised: mind huge int ranges."""
        n = self.count()
        if self.kind == "categorical":
            return self.choices
        if n is None:
            return None
        if self.kind == "int":
            return tuple(range(self.low, self.high + 1, self.step or 1))
        # Rounded so that 2.0 + 3 * 0.1 reads 2.3, the value a user wrote.
        return tuple(round(self.low + i * self.step, 12) for i in range(n))

    def draw(self, rng: random.Random) -> Any:
        """One value drawn uniformly (log-uniformly for log ranges), for feasibility checks."""
        if self.log:
            x = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
            return min(self.high, max(self.low, round(x))) if self.kind == "int" else x
        if self.kind == "categorical":
            return rng.choice(self.choices)
        if self.kind == "int":
            return rng.randrange(self.low, self.high + 1, self.step or 1)
        if self.step is None:
            return rng.uniform(self.low, self.high)
        return round(self.low + rng.randrange(self.count()) * self.step, 12)

    def suggest_among(self, trial: Any, allowed: Collection[Any]) -> Any:
        """Ask `trial` for this knob's value among `allowed`, a non-empty subset of `values()`.

        All of them: under the knob's own name, as `suggest`. Fewer: under a name that says which
        (`d_model|128..256`, `attention_layout|mha/mqa`), since Optuna keeps one set of choices
        per parameter name; a contiguous run of an int range stays an int range for the sampler.
        """
        values = self.values() or ()
        if len(allowed) == len(values):
            return self._snap(self.suggest(trial), values)
        kept = [v for v in values if v in allowed]
        start = values.index(kept[0])
        if self.kind == "int" and tuple(kept) == values[start : start + len(kept)]:
            name = f"{self.name}{CONDITION}{kept[0]}..{kept[-1]}"
            return trial.suggest_int(name, kept[0], kept[-1], step=self.step or 1, log=self.log)
        return trial.suggest_categorical(f"{self.name}{CONDITION}{'/'.join(map(str, kept))}", kept)

    def _snap(self, value: Any, values: tuple[Any, ...]) -> Any:
        """A suggested number as the `values()` entry it is (Optuna's 2.0 + 3 * 0.1 vs 2.3)."""
        if self.kind == "categorical" or not values:
            return value
        return min(values, key=lambda v: abs(v - value))

    def describe(self) -> str:
        """`[128, 192, 256]`, `64..512 step 64` or `1.5..6.0 (log)`."""
        if self.kind == "categorical":
            return "[" + ", ".join(map(str, self.choices)) + "]"
        return (
            f"{self.low}..{self.high}"
            + (f" step {self.step}" if self.step else "")
            + (" (log)" if self.log else "")
        )

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "categorical":
            return {"name": self.name, "kind": self.kind, "choices": list(self.choices)}
        keys = ("name", "kind", "low", "high", "step", "log")
        return {k: getattr(self, k) for k in keys}


def _short(x: float) -> str:
    """`3100000` -> `3.1M`: magnitudes for messages."""
    return format_si(x, digits=3)


@dataclass(frozen=True)
class Budget:
    """Bounds on total parameters and forward FLOPs per token (`space.costs` conventions).

    Raises:
        SpaceError: a bound that is not positive, a non-integer parameter bound, min above max.
    """

    params_min: int | None = None
    params_max: int | None = None
    flops_min: float | None = None  # forward FLOPs per token, full-square attention
    flops_max: float | None = None

    def __post_init__(self) -> None:
        for key, low, high, integer in (
            ("params", self.params_min, self.params_max, True),
            ("flops_per_token", self.flops_min, self.flops_max, False),
        ):
            for bound in (low, high):
                reason = None if bound is None else (_positive_int if integer else _positive_number)(bound)
                if reason:
                    raise SpaceError(reason, key)
            if low is not None and high is not None and low > high:
                raise SpaceError(f"min {_short(low)} is above max {_short(high)}", key)

    def _check(self, params: int, flops: float) -> tuple[str, str] | None:
        """(kind, message) of the first bound broken, or None.

        Beyond any budget, a shape must have fewer than 2**63 parameters: the trial database
        stores the count as a signed 64-bit integer (d_model 1e9 has about 1e26).
        """
        if params > MAX_PARAMS:
            why = f"params {_short(params)} above 2**63 - 1, the most a trial's row stores"
            return "params too large to store", why
        for what, kind, value, low, high in (
            ("params", "params", params, self.params_min, self.params_max),
            ("forward FLOPs/token", "FLOPs/token", flops, self.flops_min, self.flops_max),
        ):
            if high is not None and value > high:
                return f"{kind} above budget", f"{what} {_short(value)} above the budget's max {_short(high)}"
            if low is not None and value < low:
                return f"{kind} below budget", f"{what} {_short(value)} below the budget's min {_short(low)}"
        return None

    def violation(self, cfg: ArchConfig) -> str | None:
        """Why `cfg` is outside the budget (e.g. "params 3.1M above the budget's max 2M"), or None."""
        broken = self._check(param_counts(cfg).total, flop_counts(cfg).forward)
        return None if broken is None else broken[1]

    def describe(self) -> str:
        parts = []
        for what, low, high in (
            ("params", self.params_min, self.params_max),
            ("forward FLOPs/token", self.flops_min, self.flops_max),
        ):
            if low is not None and high is not None:
                parts.append(f"{what} {_short(low)}..{_short(high)}")
            elif low is not None or high is not None:
                parts.append(f"{what} >= {_short(low)}" if high is None else f"{what} <= {_short(high)}")
        return ", ".join(parts) or "no bounds"


def check_export_formats(names: tuple[str, ...]) -> None:
    """The `export` rule's formats are known export formats (`space.export.EXPORT_FORMATS`).

    Raises:
        SpaceError: an unknown format, keyed `export`.
    """
    from archsearch.space.export import EXPORT_FORMATS

    for name in names:
        if name not in EXPORT_FORMATS:
            raise SpaceError(f"unknown format {name!r}; valid: {', '.join(EXPORT_FORMATS)}", key="export")


@dataclass(frozen=True)
class Feasibility:
    """How much of a space is valid and within budget, from enumeration or random draws."""

    checked: int  # points built
    feasible: int  # valid configs within the budget
    exhaustive: bool  # every point was checked
    reasons: tuple[tuple[str, int], ...]  # rejection kinds with counts, most common first
    params_range: tuple[int, int] | None  # over valid configs, in budget or not
    flops_range: tuple[int, int] | None  # forward FLOPs per token, likewise


@dataclass(frozen=True)
class SearchSpace:
    """Sampled domains, fixed knobs, derivation rules and a budget. Build with `from_knobs`.

    Raises:
        SpaceError: an unknown knob, a required knob missing, an invalid value, a d_model that is
            not a multiple of `multiple_of`.
    """

    domains: tuple[Domain, ...]  # sampled knobs, in KNOBS order
    fixed: tuple[tuple[str, Any], ...]  # (knob, value) pairs, in KNOBS order
    multiple_of: int = DEFAULT_MULTIPLE_OF  # alignment of derived widths (d_ff) and of d_model
    gated_parity: bool = True  # gated MLPs take 2/3 of d_ff_ratio (the 8/3 rule)
    budget: Budget = field(default_factory=Budget)
    export: tuple[str, ...] = ()  # formats every shape must export to exactly (`space.export`)
    # How shapes are served (the [serve] table): a shape whose weights, working memory and the
    # scenario's batch of caches exceed its memory limit is infeasible, like one over budget.
    serve: ServeScenario | None = None

    @classmethod
    def from_knobs(cls, knobs: Mapping[str, Any], **rules: Any) -> SearchSpace:
        """A space from knob name -> `Domain` (sampled) or plain value (fixed), in any order.

        Args:
            knobs: every knob given; the others take their defaults.
            **rules: `multiple_of`, `gated_parity`, `budget`, `export`, `serve`.
        """
        for name in knobs:
            if name not in KNOBS:
                hint = f" ({name} derives from {DERIVED[name]})" if name in DERIVED else ""
                raise SpaceError(f"unknown knob{hint}; valid: {', '.join(KNOBS)}", key=name)
        ordered = [(n, knobs[n]) for n in KNOBS if n in knobs]
        domains = tuple(v for _, v in ordered if isinstance(v, Domain))
        return cls(domains, tuple((n, v) for n, v in ordered if not isinstance(v, Domain)), **rules)

    def __post_init__(self) -> None:
        names = [d.name for d in self.domains] + [n for n, _ in self.fixed]
        order = KNOBS.names()
        for name in names:
            if name not in KNOBS:
                raise SpaceError(f"unknown knob; valid: {', '.join(KNOBS)}", key=name)
        if len(set(names)) < len(names):
            raise SpaceError(f"knobs given twice: {sorted(n for n in set(names) if names.count(n) > 1)}")
        for group in ([d.name for d in self.domains], [n for n, _ in self.fixed]):
            if group != sorted(group, key=order.index):
                raise SpaceError("domains and fixed knobs must follow KNOBS order (use from_knobs)")
        for name in REQUIRED:
            if name not in names:
                raise SpaceError("required", key=name)
        if (
            not isinstance(self.multiple_of, int)
            or isinstance(self.multiple_of, bool)
            or self.multiple_of <= 0
        ):
            raise SpaceError(f"must be a positive integer, got {self.multiple_of!r}", key="multiple_of")
        check_export_formats(self.export)
        for domain in self.domains:
            self._check_domain(domain)
        for name, value in self.fixed:
            if reason := KNOBS[name].check(value):
                raise SpaceError(reason, key=name)
        d_model = self._knob_values("d_model")
        if bad := next((v for v in d_model if v % self.multiple_of), None):
            raise SpaceError(
                f"{bad} is not a multiple of multiple_of={self.multiple_of} (alignment rule)", "d_model"
            )

    def _check_domain(self, domain: Domain) -> None:
        knob = KNOBS[domain.name]
        if domain.name in SINGLE_VALUED:
            raise SpaceError("must be a single value: the data fixes it", key=domain.name)
        if domain.kind != "categorical" and not knob.numeric:
            raise SpaceError("takes a value or a list of choices, not a range", key=domain.name)
        if domain.kind == "float" and knob.integer:
            raise SpaceError(f"takes integers, got the float range {domain.describe()}", key=domain.name)
        for value in domain.choices or (domain.low, domain.high):
            if reason := knob.check(value):
                raise SpaceError(reason, key=domain.name)

    def _knob_values(self, name: str) -> tuple[Any, ...]:
        """The values of a knob worth checking statically: a range gives its first two."""
        fixed = dict(self.fixed)
        if name in fixed:
            return (fixed[name],)
        domain = next(d for d in self.domains if d.name == name)
        if domain.kind == "categorical":
            return domain.choices
        second = domain.low + (domain.step or 1)
        return (domain.low, second) if second <= domain.high else (domain.low,)

    def knob_values(self) -> dict[str, Any]:
        """Every knob that is not sampled -> its value: fixed by the space, else the default."""
        sampled = {d.name for d in self.domains}
        values = {name: knob.default for name, knob in KNOBS.items() if name not in sampled}
        return values | dict(self.fixed)

    def _serve_violation(self, cfg: ArchConfig) -> tuple[str, str] | None:
        """(kind, message) when the serving scenario's batch does not fit its memory limit."""
        s = self.serve
        limit = None if s is None else s.memory_limit
        if s is None or limit is None:
            return None
        fits = max_serve_batch(cfg, s.context, limit, s.weight_dtype, s.cache_dtype, s.working_bytes)
        if fits >= s.batch:
            return None
        need = serve_memory_bytes(cfg, s.batch, s.context, s.weight_dtype, s.cache_dtype, s.working_bytes)
        return "serving memory above limit", (
            f"serving {s.batch} x {s.context} tokens needs {_short(need)}B, above the memory limit "
            f"{_short(limit)}B (largest batch that fits: {fits})"
        )

    def _check_costs(self, cfg: ArchConfig, params: int, flops: float) -> tuple[str, str] | None:
        """(kind, message) of the first bound `cfg` breaks: the budget, then serving memory."""
        return self.budget._check(params, flops) or self._serve_violation(cfg)

    # --- points -> configs ---
    def _build(self, params: Mapping[str, Any]) -> ArchConfig:
        names = {d.name for d in self.domains}
        if set(params) != names:
            raise SpaceError(f"params must name exactly the domains {sorted(names)}, got {sorted(params)}")
        knobs = {**self.knob_values(), **params}
        d_model, head_dim = knobs.pop("d_model"), knobs.pop("head_dim")
        layout, ratio = knobs.pop("attention_layout"), knobs.pop("d_ff_ratio")
        if d_model % head_dim:
            raise Rejected(
                f"head_dim {head_dim} does not divide d_model {d_model}", "head_dim does not divide d_model"
            )
        n_heads = d_model // head_dim
        if POSITIONS[knobs["pos_embedding"]].rotary and head_dim % 2:
            raise Rejected(f"rope needs an even head_dim, got {head_dim}", "rope needs an even head_dim")
        # One layout name per config: a point that is really another layout is rejected, not
        # relabelled, so the sampled knob always equals `cfg.attention_layout` (no duplicate points).
        if layout == "mha":
            n_kv_heads = n_heads
        elif layout == "mqa":
            if n_heads == 1:
                raise Rejected("mqa with a single head is mha", "mqa with one head is mha")
            n_kv_heads = 1
        else:
            group = _gqa_group(layout)
            if n_heads % group:
                raise Rejected(
                    f"{layout} does not divide n_heads {n_heads}", "gqa group does not divide n_heads"
                )
            if group == n_heads:
                raise Rejected(f"{layout} with {n_heads} heads is mqa", "gqa group equals n_heads (mqa)")
            n_kv_heads = n_heads // group
        if isinstance(ratio, float):
            # Undo binary error (2.0 + 3 * 0.1 = 2.3000000000000003) before aligned_d_ff's ceil,
            # which would otherwise add a whole multiple_of where the ratio lands on one exactly.
            ratio = Fraction(ratio).limit_denominator(1000)
        try:
            cfg = config_from_knobs(
                d_model=d_model, n_heads=n_heads, head_dim=head_dim, n_kv_heads=n_kv_heads, d_ff_ratio=ratio,
                multiple_of=self.multiple_of, gated_parity=self.gated_parity, **knobs,
            )  # fmt: skip
        except ConfigError as exc:
            raise Rejected(str(exc)) from None
        if self.export:
            from archsearch.space.export import EXPORT_FORMATS

            for name in self.export:
                if reason := EXPORT_FORMATS[name].refusal(cfg):
                    raise Rejected(f"not exportable as {name}: {reason}", f"not exportable as {name}")
        return cfg

    def config_from_params(self, params: Mapping[str, Any]) -> ArchConfig:
        """The config at a point of the space.

        Args:
            params: every domain's name -> its value (an Optuna trial's `params`; a name narrowed
                by `sample`, such as `attention_layout|mha/mqa`, stands for its knob).

        Returns:
            The `ArchConfig`, valid, within the budget and the serving memory limit.

        Raises:
            Rejected: the knobs do not make a valid config, or it breaks the budget or the
                serving memory limit.
            SpaceError: `params` does not name exactly the domains (a caller's bug).
        """
        cfg = self._build({name.partition(CONDITION)[0]: value for name, value in params.items()})
        broken = self._check_costs(cfg, param_counts(cfg).total, flop_counts(cfg).forward)
        if broken:
            raise Rejected(broken[1], broken[0])
        return cfg

    def sample(self, trial: Any) -> ArchConfig:
        """Suggest every domain on `trial` in order, always all of them, then build the config.

        Feasible by construction where the space can be enumerated (`feasible_points`): each
        knob is suggested among the values that some valid, in-budget point has with the knobs
        already chosen (`Domain.suggest_among`), so a head count gets only the KV layouts that
        divide it and a width only the depths its budget allows, and every proposal is a shape
        to train. A space too large or continuous to enumerate is suggested as is, and an
        infeasible point is rejected.

        Raises:
            Rejected: as `config_from_params` (only for spaces that cannot be enumerated).
        """
        points = self.feasible_points
        if points is None:
            return self.config_from_params({d.name: d.suggest(trial) for d in self.domains})
        if not points:
            raise Rejected("no point of the space is valid and within the budget", "no feasible point")
        params = {}
        for i, domain in enumerate(self.domains):
            value = domain.suggest_among(trial, {p[i] for p in points})
            params[domain.name] = value
            points = tuple(p for p in points if p[i] == value)
        return self.config_from_params(params)

    @functools.cached_property
    def feasible_points(self) -> tuple[tuple[Any, ...], ...] | None:
        """Every valid, in-budget point (its domains' values, in order), or None when the space
        has more than `MAX_ENUMERATE` points or a continuous domain. Computed once per space."""
        size = self.size()
        if size is None or size > MAX_ENUMERATE:
            return None
        names = [d.name for d in self.domains]
        feasible = []
        for values in itertools.product(*(d.values() for d in self.domains)):
            try:
                self.config_from_params(dict(zip(names, values, strict=True)))
            except Rejected:
                continue
            feasible.append(values)
        return tuple(feasible)

    def size(self) -> int | None:
        """Number of distinct points, None when a domain is continuous."""
        counts = [d.count() for d in self.domains]
        return None if None in counts else math.prod(counts)  # type: ignore[arg-type]

    def _points(self, max_enumerate: int, draws: int, seed: int) -> tuple[Iterator[dict[str, Any]], bool]:
        """Every point when there are at most `max_enumerate`, else `draws` random ones."""
        names = [d.name for d in self.domains]
        size = self.size()
        if size is not None and size <= max_enumerate:
            product = itertools.product(*(d.values() for d in self.domains))
            return (dict(zip(names, p, strict=True)) for p in product), True
        rng = random.Random(seed)
        return ({d.name: d.draw(rng) for d in self.domains} for _ in range(draws)), False

    def feasibility(
        self, *, max_enumerate: int = MAX_ENUMERATE, draws: int = 2_000, seed: int = 0
    ) -> Feasibility:
        """Count the valid, in-budget points: all of them when few enough, else a random sample.

        Args:
            max_enumerate: enumerate when `size()` is at most this.
            draws: random points otherwise, uniform per domain (log-uniform for log ranges).
            seed: seeds `random.Random` for the draws; the result is deterministic.
        """
        points, exhaustive = self._points(max_enumerate, draws, seed)
        reasons: Counter[str] = Counter()
        checked = feasible = 0
        params_seen: list[int] = []
        flops_seen: list[int] = []
        found: list[tuple[Any, ...]] = []
        for point in points:
            checked += 1
            try:
                cfg = self._build(point)
            except Rejected as exc:
                reasons[exc.kind] += 1
                continue
            params_seen.append(param_counts(cfg).total)
            flops_seen.append(flop_counts(cfg).forward)
            broken = self._check_costs(cfg, params_seen[-1], flops_seen[-1])
            if broken:
                reasons[broken[0]] += 1
            else:
                feasible += 1
                found.append(tuple(point.values()))
        size = self.size()
        if exhaustive and size is not None and size <= MAX_ENUMERATE:
            # The same pass `feasible_points` makes: a search start that checks, then samples,
            # enumerates the space once (about 6 s for examples/gpu.toml).
            self.__dict__.setdefault("feasible_points", tuple(found))
        return Feasibility(
            checked=checked, feasible=feasible, exhaustive=exhaustive,
            reasons=tuple(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
            params_range=(min(params_seen), max(params_seen)) if params_seen else None,
            flops_range=(min(flops_seen), max(flops_seen)) if flops_seen else None,
        )  # fmt: skip

    def check_feasible(self, **kw: Any) -> Feasibility:
        """`feasibility(**kw)`, raising when no point is feasible.

        Raises:
            SpaceError: no config in the space is valid and within the budget; the message gives
                the most common reasons and the cost ranges seen, to fix the budget by.
        """
        found = self.feasibility(**kw)
        if found.feasible:
            return found
        how = "all" if found.exhaustive else "random"
        why = ", ".join(f"{kind} x{n}" for kind, n in found.reasons[:3])
        if found.params_range is None:
            raise SpaceError(f"no valid config in the space (checked {how} {found.checked} points: {why})")
        (p0, p1), (f0, f1) = found.params_range, found.flops_range  # type: ignore[misc]
        bounds = self.budget.describe()
        what = "can be searched" if bounds == "no bounds" else f"meets the budget of {bounds}"
        # Sampled, not enumerated, the claim is about the points checked: a 100,000-value d_model
        # list was said to hold no config within the budget when 2,000 samples missed its few.
        claim = (
            f"no config in the space {what}" if found.exhaustive else f"none of the configs checked {what}"
        )
        raise SpaceError(
            f"{claim} (checked {how} "
            f"{found.checked} points: {why}; params range seen {_short(p0)}..{_short(p1)}, "
            f"forward FLOPs/token range {_short(f0)}..{_short(f1)})"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready and canonical: knobs in KNOBS order, every rule spelled out."""
        return {
            "domains": [d.to_dict() for d in self.domains],
            "fixed": self.knob_values(),  # defaults spelled out: leaving one out is the same space
            "multiple_of": self.multiple_of,
            "gated_parity": self.gated_parity,
            "budget": {
                k: getattr(self.budget, k) for k in ("params_min", "params_max", "flops_min", "flops_max")
            },
            # Only when set: a space without the rule keeps the fingerprint it always had.
            **({"export": list(self.export)} if self.export else {}),
            **({"serve": self.serve.to_dict()} if self.serve is not None else {}),
        }


def sample_configs(
    space: SearchSpace, n: int, seed: int = 0, *, max_enumerate: int = MAX_ENUMERATE
) -> list[ArchConfig]:
    """Up to `n` distinct feasible configs drawn at random, smallest (total params) first.

    Args:
        space: the space.
        n: how many; fewer come back when the space (or 100 draws per config) holds fewer.
        seed: seeds the draws.
        max_enumerate: pick from every feasible point when the space has at most this many.
    """
    points, exhaustive = space._points(max_enumerate, draws=100 * n, seed=seed)
    if exhaustive and space.feasible_points is not None:
        # The same points in the same order, less those `config_from_params` would reject,
        # enumerated once per space: `space check` has just counted them (5 of its 6 s on
        # examples/gpu.toml went to enumerating its 58,968 points a second time).
        names = [d.name for d in space.domains]
        points = (dict(zip(names, p, strict=True)) for p in space.feasible_points)
    found: dict[ArchConfig, None] = {}
    for point in points:
        try:
            found.setdefault(space.config_from_params(point))
        except Rejected:
            continue
        if not exhaustive and len(found) >= n:
            break
    configs = list(found)
    if exhaustive:
        configs = random.Random(seed).sample(configs, min(n, len(configs)))
    return sorted(configs, key=lambda c: (param_counts(c).total, c.to_json()))
