"""Search specs: the TOML file that says what to search, how to score a trial and how long.

Every table and key is optional unless marked; unknown tables or keys are errors. Example::

    [model]            # knobs: a scalar fixes one; a list is a categorical choice (one item: fixed);
                       # a table {min, max, step?, log?} is a range, of ints when min, max and step
                       # are ints, of floats otherwise
    vocab_size = 256   # required, a single value: the data fixes it
    seq_len = 128      # required, a single value
    d_model = { min = 128, max = 384, step = 64 }   # required; multiples of [rules].multiple_of
    aspect_ratio = [32, 64, 128]                    # required; d_model / n_layers
    d_ff_ratio = { min = 2.0, max = 6.0, step = 0.5 }
    activation = ["gelu", "swiglu"]
    head_dim = [32, 64]
    attention_layout = ["mha", "gqa:2", "mqa"]      # gqa:G: G query heads per KV head
    norm_placement = ["pre", "post"]
    tie_embeddings = true
    [rules]
    multiple_of = 64       # alignment of d_ff (and of every d_model)
    gated_parity = true    # gated MLPs take 2/3 of d_ff_ratio
    export = []            # e.g. ["hf"]: sample only shapes these export formats represent exactly
    [budget]
    params = { min = 1e5, max = 4e6 }    # total parameters
    flops_per_token = { max = 2e7 }      # forward FLOPs per token
    [proxy]                # TrainSettings fields but seq_len (the model's is used), plus `data`
    tokens = 200_000       # exactly one of tokens, flops, seconds (required)
    batch_size = 16
    evals = 4              # evaluations at 1/4, 2/4, 3/4 and the end: the pruning rungs' points
    data = "corpus.txt"    # relative to this file; left out: the bundled byte-level corpus
    threads = 1            # torch threads of a CPU run; left out: chosen from the shape and the
                           # CPUs of the trial (evaluators.settings.choose_threads)
    [profile]
    local = true           # time the step's kernels on this machine
    devices = ["h100-sxm"] # and model them on catalogued accelerators
    batch = 8              # default: [proxy].batch_size
    dtype = "auto"         # auto: locally the precision training ran in, bf16 on modelled GPUs
    min_run_time = 0.05    # seconds of repeats per kernel
    [objectives]
    minimize = ["loss", "flops"]   # loss, flops, step_time, kv_bytes, prefill_time, decode_time;
                                   # loss is required; the serving times need [serve].device a GPU
    step_time_device = "local"     # with step_time: "local" or a name from [profile].devices
    size_beta = 0.15               # the loss objective is loss - size_beta * ln(params / 1M):
                                   # the proxy loss credited for size (docs/accuracy.md, "The loss
                                   # objective"); left out: the proxy loss as it is
    extrapolate = 2.0              # and carried on by its last evaluation interval's change 2 more
                                   # times: + extrapolate * change; left out: 0
    [serve]                # how shapes are served (space.serve.ServeScenario); all optional
    batch = 1              # sequences decoded together
    prompt_len = 512       # tokens prefilled per sequence
    gen_len = 128          # tokens generated per sequence
    weight_dtype = "bf16"  # fp32, bf16, fp16 or fp8
    cache_dtype = "bf16"
    device = "h100-sxm"    # a catalogued GPU (modelled), or "local"
    memory = "80GB"        # limit: weights + batch x (prompt + gen) tokens of cache + working
                           # memory; a shape over it is infeasible. Default: a GPU's memory
    working_memory = "2GiB"
    [search]
    sampler = "tpe"        # tpe, nsga2, random or gp
    seed = 0
    trials = 20
    prune = true
    rungs = [0.25, 0.5]    # fractions of the proxy budget where losses are compared
    prune_min_trials = 4   # trials that must reach a rung before any is pruned there
    promote = { cap = 4, rule = "pasha", margin = "auto", max_contenders = 8, seeds = 1, stall_seeds = 2 }
                           # then train the front's contenders (at most 8, nearest the knee) on
                           # at 2x, 4x the proxy's tokens until their order holds, each at
                           # `seeds` proxy seeds (their mean ranks them); a contender whose
                           # first pass stalled is first checked at `stall_seeds` more
                           # seeds; left out: off

Every error is one line: `space.toml: [model].d_model: ...`. A budget no config can meet is not
an error here; `spec.space.check_feasible()` finds it at search start.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from archsearch.errors import HUGE_INTEGER, ArchsearchError, ConfigError, quoted
from archsearch.evaluators.catalogue import ACCELERATORS
from archsearch.evaluators.settings import TrainError, TrainSettings
from archsearch.fileio import names_no_path, read_text
from archsearch.search.promotion import PromoteError, PromoteSettings
from archsearch.search.samplers import SAMPLERS
from archsearch.space.objectives import DEFAULT_OBJECTIVES, SERVE_TIME_OBJECTIVES, LossRule, parse_objectives
from archsearch.space.search_space import KNOBS, Budget, Domain, SearchSpace, SpaceError, check_export_formats
from archsearch.space.serve import ServeError, ServeScenario
from archsearch.units import MAX_WHOLE, SEED_MAX, format_si, parse_bytes, short_number


class SpecError(ConfigError):
    """A search spec that cannot be read or breaks a rule; `key` is `[table].key` when known."""

    def __init__(self, detail: str, key: str | None = None) -> None:
        super().__init__(f"{key}: {detail}" if key else detail)
        self.detail, self.key = detail, key


# The dtypes evaluators.profiler can time (its TORCH_DTYPES; fp8 has no plain matmul), named here
# so a spec validates without importing torch.
PROFILE_DTYPES = ("fp32", "bf16", "fp16")
AUTO_DTYPE = "auto"  # evaluators.profiler.AUTO: what training runs in (bf16 on modelled GPUs)
LOCAL = "local"


@dataclass(frozen=True)
class ProfileSpec:
    """Where step times are measured (`local`) or modelled (`devices`, ACCELERATORS names)."""

    local: bool = True
    devices: tuple[str, ...] = ()
    batch: int | None = None  # sequences per profiled step; None: the proxy's batch_size
    # "auto": the local kernels in the precision training used (fp32 on a CPU without native
    # bf16, never emulated bf16), the modelled GPUs in bf16. A dtype named here is used for both.
    dtype: str = AUTO_DTYPE
    min_run_time: float = 0.05  # seconds of repeats per kernel: fast enough to profile every trial

    def __post_init__(self) -> None:
        if self.dtype not in (AUTO_DTYPE, *PROFILE_DTYPES):
            valid = ", ".join((AUTO_DTYPE, *PROFILE_DTYPES))
            raise SpecError(f"cannot profile {self.dtype!r}; valid: {valid}", "dtype")
        for name in self.devices:
            if name not in ACCELERATORS:
                raise SpecError(f"unknown accelerator {name!r}; valid: {', '.join(ACCELERATORS)}", "devices")
            if self.modelled_dtype not in ACCELERATORS[name].dtypes:
                valid = ", ".join(ACCELERATORS[name].dtypes)
                raise SpecError(f"{name} has no {self.dtype} peak; valid: {valid}", "dtype")
        if len(set(self.devices)) < len(self.devices):
            raise SpecError(f"devices repeat: {list(self.devices)}", "devices")
        if self.batch is not None and self.batch <= 0:
            raise SpecError(f"must be positive, got {short_number(self.batch)}", "batch")
        if not (math.isfinite(self.min_run_time) and self.min_run_time > 0):
            raise SpecError(f"must be finite and positive, got {self.min_run_time}", "min_run_time")

    @property
    def modelled_dtype(self) -> str:
        """The dtype the catalogued GPUs are modelled in."""
        return modelled_dtype(self.dtype)


def modelled_dtype(dtype: str) -> str:
    """A `[profile] dtype` as the catalogued GPUs are modelled in: "auto" is bf16 there (training's
    precision on every catalogued GPU), a named dtype is itself."""
    return "bf16" if dtype == AUTO_DTYPE else dtype


@dataclass(frozen=True)
class SearchDefaults:
    """How a search runs unless the command line says otherwise."""

    sampler: str = "tpe"  # one of SAMPLERS
    seed: int = 0
    trials: int = 20
    prune: bool = True  # stop trials that rank poorly at a rung (search.pruning decides how)
    rungs: tuple[float, ...] = (0.25, 0.5)  # fractions of the proxy budget, increasing, in (0, 1)
    prune_min_trials: int = 4  # too few losses at a rung rank nothing reliably
    # Once the trials are finished, train the front's contenders on at longer budgets until their
    # ranking holds (search.promotion); None: off.
    promote: PromoteSettings | None = None

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise SpecError(f"unknown sampler {self.sampler!r}; valid: {', '.join(SAMPLERS)}", "sampler")
        for key in ("trials", "prune_min_trials"):
            if getattr(self, key) <= 0:
                raise SpecError(f"must be positive, got {short_number(getattr(self, key))}", key)
        if not 0 <= self.seed <= SEED_MAX:
            seed = short_number(self.seed)
            raise SpecError(f"must be in 0..{SEED_MAX} (Optuna's seed range), got {seed}", "seed")
        if not all(0 < r < 1 for r in self.rungs) or list(self.rungs) != sorted(set(self.rungs)):
            raise SpecError(f"must be increasing fractions in (0, 1), got {list(self.rungs)}", "rungs")
        if self.prune and not self.rungs:
            raise SpecError("pruning needs at least one rung (or set prune = false)", "rungs")


@dataclass(frozen=True)
class SearchSpec:
    """A parsed search spec. Validated on construction, across tables.

    Raises:
        SpecError: objectives that are unknown, lack loss, or need an unprofiled device; a
            negative size beta; rungs that are not evaluation points of the proxy; a vocab the
            bundled corpus cannot use.
    """

    name: str  # the file's stem
    space: SearchSpace
    proxy: TrainSettings
    data: str | None  # corpus path, resolved against the spec's folder; None: bundled corpus
    profile: ProfileSpec
    objectives: tuple[str, ...] = DEFAULT_OBJECTIVES
    step_time_device: str | None = None  # "local" or a [profile].devices name; with step_time only
    # The loss objective (objectives.loss_objective): loss + extrapolate * change - size_beta *
    # ln(params / 1M), `change` the proxy curve's last evaluation interval's; None and 0: the proxy
    # loss as it is.
    size_beta: float | None = None
    extrapolate: float = 0.0
    defaults: SearchDefaults = SearchDefaults()
    source: str = ""  # the TOML text as read

    def __post_init__(self) -> None:
        try:
            parse_objectives(self.objectives)
        except ArchsearchError as exc:
            raise SpecError(str(exc), "[objectives].minimize") from None
        self._check_step_time()
        serve = self.space.serve
        for name in SERVE_TIME_OBJECTIVES:
            if name in self.objectives and (serve is None or not serve.modelled):
                raise SpecError(
                    f"{name} needs a [serve] table whose device is a catalogued GPU (see `archsearch "
                    "devices`); a local device is measured by `archsearch profile --serve`",
                    "[objectives].minimize",
                )
        if self.size_beta is not None and not (math.isfinite(self.size_beta) and self.size_beta >= 0):
            raise SpecError(f"must be a finite number >= 0, got {self.size_beta}", "[objectives].size_beta")
        if not (math.isfinite(self.extrapolate) and self.extrapolate >= 0):
            raise SpecError(
                f"must be a finite number >= 0, got {self.extrapolate}", "[objectives].extrapolate"
            )
        if self.defaults.prune:
            # The trainer reports losses only at its evaluation points, (i + 1) / evals.
            points = [i / self.proxy.evals for i in range(1, self.proxy.evals)]
            for rung in self.defaults.rungs:
                if not any(abs(rung - p) < 1e-9 for p in points):
                    shown = ", ".join(f"{p:g}" for p in points) or "none before the end"
                    raise SpecError(
                        f"{rung:g} is not an evaluation point of the proxy ([proxy].evals = "
                        f"{self.proxy.evals} evaluates at {shown})",
                        "[search].rungs",
                    )
        promote = self.defaults.promote
        if promote is not None and self.proxy.tokens is None:
            raise SpecError(
                "promotion multiplies the proxy's token budget: give [proxy].tokens, not flops or seconds",
                "[search].promote",
            )
        if (
            promote is not None
            and self.proxy.tokens is not None
            and self.proxy.tokens * promote.cap > MAX_WHOLE
        ):
            raise SpecError(
                f"cap {promote.cap:g} x [proxy].tokens is past 2**63 - 1, the most the database stores",
                "[search].promote",
            )
        vocab = self.space.knob_values()["vocab_size"]
        if self.data is None and vocab != 256:
            raise SpecError(f"the bundled corpus is bytes: must be 256, got {vocab}", "[model].vocab_size")

    def preflight(self) -> None:
        """What every trial depends on beyond the file itself, checked before any trial runs: the
        corpus (`check_data`), a proxy batch some shape could hold (`check_batch_memory`) and a
        cache folder the corpus can be built in (`data.check_cache_dir`).

        Raises:
            SpecError: one line naming the key.
            CacheError: the cache folder cannot be made (the environment's fault, exit 1).
        """
        from archsearch.evaluators.data import check_cache_dir

        self.check_batch_memory()
        check_cache_dir()
        self.check_data()

    def check_batch_memory(self) -> None:
        """Refuse a `[proxy] batch_size` whose logits alone outgrow the device the proxy trains on
        here (`evaluators.settings.logits_bytes`, a floor under every shape's training memory:
        `train_memory_bytes` counts them three times besides the weights and activations), so
        every trial would fail the trainer's own memory check.

        Skipped where the device cannot be described here (CUDA asked for on a driver without one:
        the workers may have it) or its memory is unknown.

        Raises:
            SpecError: naming the bytes needed and the device's.
        """
        from archsearch.evaluators.settings import logits_bytes, physical_memory_bytes

        knobs = self.space.knob_values()
        seq_len = self.proxy.seq_len or knobs["seq_len"]
        need = logits_bytes(self.proxy.batch_size * seq_len, knobs["vocab_size"])
        if self.proxy.device == "cpu":
            # The host's memory, as `resolve_device` reads it, without importing torch: a search's
            # driver, which trains nothing itself, then never pays torch's seconds of start-up.
            kind, memory = "cpu", physical_memory_bytes()
        else:
            from archsearch.evaluators.device import DeviceError, resolve_device

            try:
                info = resolve_device(self.proxy.device)
            except DeviceError:
                return
            kind, memory = info.type, info.memory_bytes
        if memory and need > memory:
            raise SpecError(
                f"{self.proxy.batch_size:,} sequences of {seq_len} tokens: their logits alone need "
                f"{format_si(need, 'B')}, more than this {kind}'s {format_si(memory, 'B')}",
                "[proxy].batch_size",
            )

    def check_data(self) -> None:
        """Open the `[proxy] data` corpus as each trial will, before any trial runs.

        Not done on construction: a large token file is scanned whole (its ids against the
        vocabulary), which `space check` and a search start pay once, and the bundled corpus
        (None) is built by the trials themselves.

        Raises:
            SpecError: the path is unreadable, a file is empty or malformed, a token id is past
                `vocab_size`, or a split is shorter than `seq_len + 1` tokens (one line).
        """
        if self.data is None or self.__dict__.get("_data_checked"):  # once per spec: a scan can be long
            return
        from archsearch.evaluators.data import DataError, load_dataset

        knobs = self.space.knob_values()  # vocab_size and seq_len are single values (load_spec)
        try:
            load_dataset(self.data, knobs["vocab_size"], seq_len=knobs["seq_len"])
        except DataError as exc:
            raise SpecError(str(exc), "[proxy].data") from None
        self.__dict__["_data_checked"] = True

    def _check_step_time(self) -> None:
        key, device = "[objectives].step_time_device", self.step_time_device
        if "step_time" not in self.objectives:
            if device is not None:
                raise SpecError("given but step_time is not an objective", key)
            return
        if device is None:
            raise SpecError(f"step_time needs a device: {LOCAL!r} or a [profile].devices name", key)
        if device == LOCAL and not self.profile.local:
            raise SpecError("'local' needs [profile].local = true", key)
        if device != LOCAL and device not in self.profile.devices:
            valid = ", ".join([LOCAL] * self.profile.local + list(self.profile.devices))
            raise SpecError(f"{device!r} is not profiled; valid: {valid or 'none'}", key)

    @property
    def serve(self) -> ServeScenario | None:
        """The serving scenario of the [serve] table (held by the space, whose feasibility it
        bounds), or None."""
        return self.space.serve

    @property
    def loss_rule(self) -> LossRule:
        """The loss objective's rule: what Optuna is told, the rungs compare and fronts rank."""
        return LossRule(self.size_beta, self.extrapolate)

    @property
    def profile_batch(self) -> int:
        return self.profile.batch or self.proxy.batch_size

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: everything parsed, without the source text."""
        return {
            "name": self.name,
            "space": self.space.to_dict(),
            "proxy": dataclasses.asdict(self.proxy),
            "data": self.data,
            "profile": {**dataclasses.asdict(self.profile), "devices": list(self.profile.devices)},
            "objectives": list(self.objectives),
            "step_time_device": self.step_time_device,
            "size_beta": self.size_beta,
            "extrapolate": self.extrapolate,
            "search": {**dataclasses.asdict(self.defaults), "rungs": list(self.defaults.rungs)},
        }

    @property
    def fingerprint(self) -> str:
        """sha256 of everything that changes which trials run and what they score.

        Left out: the name, the source text (comments, layout) and `[search].trials`, so a
        search can be resumed with more trials; `[search].promote`, so a finished search can be
        resumed to promote its contenders; `[proxy].threads`, which decides how fast a CPU
        trial runs, not what it computes (the same losses at 1 and 2 threads in
        `benchmarks/threads.py`; each trial's device fingerprint records its thread count), so a
        study resumes on a machine with other cores, and the files written before the setting
        existed keep their fingerprint (as do those without `size_beta`, `extrapolate` or
        `[proxy].warmup_tokens`). The
        sampler and seeds stay in: they decide which points are tried. `data` is the resolved
        path; the corpus's contents have their own fingerprint, checked when it is loaded.
        """
        canonical = self.to_dict()
        del canonical["name"], canonical["search"]["trials"], canonical["proxy"]["threads"]
        del canonical["search"]["promote"]  # what happens after the trials, not which run or what they score
        if canonical["size_beta"] is None:
            del canonical["size_beta"]
        if canonical["proxy"]["warmup_tokens"] is None:
            del canonical["proxy"]["warmup_tokens"]
        if not canonical["extrapolate"]:
            del canonical["extrapolate"]
        text = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


def load_spec(path: str | Path) -> SearchSpec:
    """Read and validate a search spec file.

    Raises:
        SpecError: the file is missing, unreadable, not TOML, or breaks a rule (one line, prefixed
            with the path).
    """
    path = Path(path)
    text = read_text(path, "search spec", SpecError)
    return parse_spec(text, source=str(path), base_dir=path.parent)


def parse_spec(text: str, source: str = "<string>", base_dir: Path | None = None) -> SearchSpec:
    """Parse and validate a search spec's TOML text (the format is in the module docstring).

    Args:
        text: the TOML.
        source: names the text in errors (a path), and its stem names the spec.
        base_dir: folder `[proxy].data` is relative to; None: the working directory.

    Raises:
        SpecError: TOML syntax, an unknown table or key, a wrong type, an invalid value.
    """
    try:
        return _parse(text, source, Path(".") if base_dir is None else base_dir)
    except SpecError as exc:
        raise SpecError(f"{source}: {exc}") from None


# --- TOML shapes -> objects ---
_TABLES = ("model", "rules", "budget", "proxy", "profile", "objectives", "serve", "search")
_TYPES = {  # schema type -> (what it says in errors, test)
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "number": ("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    "float": ("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "table": ("a table", lambda v: isinstance(v, dict)),
    # "80GB", "16GiB" or a whole number of bytes (units.parse_bytes)
    "bytes": ("bytes, e.g. 80GB", lambda v: isinstance(v, str | int) and not isinstance(v, bool)),
}
_RANGE = {"min": "number", "max": "number", "step": "number", "log": "bool"}
_RULES = {"multiple_of": "int", "gated_parity": "bool", "export": "list[str]"}
_PROFILE = {"local": "bool", "devices": "list[str]", "batch": "int", "dtype": "str", "min_run_time": "float"}
_OBJECTIVES = {
    "minimize": "list[str]", "step_time_device": "str", "size_beta": "float", "extrapolate": "float",
}  # fmt: skip
_SERVE = {
    "batch": "int",
    "prompt_len": "int",
    "gen_len": "int",
    "weight_dtype": "str",
    "cache_dtype": "str",
    "device": "str",
    "memory": "bytes",
    "working_memory": "bytes",
}
_SEARCH = {
    "sampler": "str",
    "seed": "int",
    "trials": "int",
    "prune": "bool",
    "rungs": "list[float]",
    "prune_min_trials": "int",
    "promote": "table",
}
_PROMOTE = tuple(f.name for f in dataclasses.fields(PromoteSettings))  # it checks their types itself
# TrainSettings' own fields, typed from their annotations ("int | None" -> int); seq_len is the
# model's, so it is left out.
_ANNOTATIONS = {"int": "int", "float": "float", "str": "str", "bool": "bool"}
_PROXY = {
    f.name: _ANNOTATIONS[str(f.type).split(" |")[0]]
    for f in dataclasses.fields(TrainSettings)
    if f.name != "seq_len"
} | {"data": "str"}


# --- the reference: every table's keys, their types and meaning (docs/reference/space-file.md is
# generated from `key_reference`, and a test fails when a key has no meaning here) ---
KEY_DOCS: dict[str, str] = {
    # [model]: the search knobs (space.search_space.KNOBS); each takes a value, a list or a range
    "model.vocab_size": "Vocabulary size; a single value: the data fixes it (256 for the bundled bytes).",
    "model.seq_len": "Context length of the proxy and of every shape; a single value.",
    "model.d_model": "Residual width; required; every value a multiple of [rules].multiple_of.",
    "model.aspect_ratio": "d_model / n_layers (n_layers = max(1, round(d_model / ratio))); required.",
    "model.d_ff_ratio": "d_ff / d_model of a plain MLP; gated MLPs take 2/3 of it ([rules].gated_parity).",
    "model.head_dim": "Width of one attention head; n_heads = d_model // head_dim.",
    "model.attention_layout": 'KV sharing: "mha", "mqa" or "gqa:G" (G query heads per KV head).',
    "model.activation": "MLP activation: relu, gelu, silu or the gated reglu, geglu, swiglu.",
    "model.norm": "rmsnorm or layernorm.",
    "model.norm_placement": "pre, post or sandwich (pre and after each sub-block).",
    "model.pos_embedding": "rope, learned or none.",
    "model.parallel_block": "Attention and MLP side by side on one norm (GPT-J, PaLM).",
    "model.bias": "Biases in the linear layers.",
    "model.tie_embeddings": "Share the input embedding with the output head.",
    "model.qk_norm": "Normalise queries and keys before attention.",
    "rules.multiple_of": "Alignment of d_ff (and of every d_model): kernels favour multiples of 64.",
    "rules.gated_parity": "Gated MLPs take 2/3 of d_ff_ratio: the plain MLP's parameters and FLOPs.",
    "rules.export": 'Sample only shapes these export formats represent exactly (e.g. ["hf"]).',
    "budget.params": "Total parameters, {min, max, or both}: shapes outside are never sampled.",
    "budget.flops_per_token": "Forward FLOPs per token, {min, max, or both}.",
    "proxy.tokens": "Training tokens of the proxy run; exactly one of tokens, flops, seconds.",
    "proxy.flops": "Training FLOPs of the proxy run, converted to tokens by the cost model.",
    "proxy.seconds": "Wall-clock seconds of training steps.",
    "proxy.batch_size": "Sequences per optimizer step.",
    "proxy.lr": "Peak Adam rate at base_width; hidden matrices scale it by base_width / d_model (muP).",
    "proxy.base_width": "The width at which lr applies unscaled.",
    "proxy.schedule": "cosine, wsd or constant (warm-up, then flat: what ranks shapes like long runs).",
    "proxy.warmup": "Warm-up as a fraction of the budget.",
    "proxy.warmup_tokens": (
        "Warm-up in tokens, overriding warmup: with the constant schedule a run can then resume to a "
        "longer budget (promotion); needs a tokens or flops budget."
    ),
    "proxy.min_lr": "Floor of the decay, a fraction of the peak.",
    "proxy.weight_decay": "AdamW weight decay, on hidden matrices only.",
    "proxy.grad_clip": "Gradient-norm clip.",
    "proxy.seed": "Seed of initialisation and data order.",
    "proxy.eval_batches": "Fixed held-out batches per evaluation.",
    "proxy.evals": "Evaluations spread evenly over the budget; the last is the trial's loss.",
    "proxy.device": 'Where proxies train: "cpu", "cuda", "cuda:N" or "auto".',
    "proxy.precision": "bf16, fp32 or auto; pin it (fp32 on CPUs) so every machine gives the same losses.",
    "proxy.compile": "torch.compile the model.",
    "proxy.threads": "Torch threads of a CPU run; left out: chosen from the shape and the free cores.",
    "proxy.data": "A token file (relative to the space file); left out: the bundled byte-level corpus.",
    "profile.local": "Time each shape's step kernels on the machine that trains it.",
    "profile.devices": "Catalogued accelerators to model each shape's step on (archsearch devices).",
    "profile.batch": "Sequences per profiled step; left out: the proxy's batch_size.",
    "profile.dtype": "auto (locally the training precision, bf16 on modelled GPUs), or fp32, bf16, fp16.",
    "profile.min_run_time": "Seconds of repeats per timed kernel.",
    "objectives.minimize": (
        'What the search minimises: "loss" first, then one or two of flops, step_time, kv_bytes, '
        "prefill_time, decode_time."
    ),
    "objectives.step_time_device": 'With step_time: "local" or a name from [profile].devices.',
    "objectives.size_beta": "The loss objective is loss - size_beta ln(params / 1M); left out: the loss.",
    "objectives.extrapolate": (
        "The loss objective adds extrapolate x the proxy curve's last evaluation interval's change "
        '(Accuracy, "The loss objective"); left out: 0.'
    ),
    "serve.batch": "Sequences decoded together.",
    "serve.prompt_len": "Tokens prefilled per sequence.",
    "serve.gen_len": "Tokens generated per sequence.",
    "serve.weight_dtype": "Weights in serving: fp32, bf16, fp16 or fp8.",
    "serve.cache_dtype": "The KV cache's dtype.",
    "serve.device": "A catalogued GPU the serving times are modelled on (archsearch devices).",
    "serve.memory": (
        'Memory limit, e.g. "80GB": a shape whose weights, working memory and cache do not fit is never '
        "sampled; default the GPU's memory."
    ),
    "serve.working_memory": 'Memory reserved beside weights and cache, e.g. "2GiB".',
    "search.sampler": "tpe, nsga2, random or gp.",
    "search.seed": "Sampler seed.",
    "search.trials": "Finished trials to reach.",
    "search.prune": "Stop trials that rank poorly at a rung.",
    "search.rungs": "Fractions of the proxy budget where losses are compared, increasing, in (0, 1).",
    "search.prune_min_trials": "Trials that must reach a rung before it prunes any.",
    "search.promote": (
        "After the trials, train the front's contenders at 2x, 4x, ... the proxy's tokens until "
        'their ranking holds: { cap = 4, rule = "pasha", margin = "auto", max_contenders = 8, seeds = 1, '
        "stall_seeds = 2 }. "
        "cap: the largest multiple, >= 1; rule: pasha (stop once no two contenders swap by more "
        "than the margin) or cap (every rung to the cap, whatever the order); "
        'margin: nats of the loss objective that count as a tie, "auto" = 0.063 (the tiny proxy\'s '
        "seed noise); max_contenders: the most shapes promoted, the knee and those nearest it, "
        ">= 2, default 8; seeds: proxy seeds each contender is trained at, at every rung, its value "
        "the mean over them (the first pass is the first; the others are [proxy].seed + 1, + 2, ... "
        "and train at the proxy's own budget first), 1 to 64, default 1; seeds = 3 with cap = 1 "
        "ranks by seed repeats alone, for 2 proxy runs per contender; stall_seeds: with one seed, "
        "the proxy seeds more at which a contender whose first pass stalled is trained at the "
        "proxy's budget before any climbs, its value the mean over them (contenders are then chosen "
        "again), 0 to 63, default 2. Needs [proxy].tokens; resumes "
        'exactly with schedule = "constant" and warmup_tokens. Left out: off.'
    ),
}


def key_reference() -> list[tuple[str, str, str, str]]:
    """Every key a space file takes: (table, key, type, meaning), tables in file order. [model]
    keys are the knobs, each a value, a list of choices or a range {min, max, step?, log?}."""
    from archsearch.space.search_space import KNOBS

    schemas: dict[str, dict[str, str]] = {
        "model": {name: ("number" if knob.numeric else "choice") for name, knob in KNOBS.items()},
        "rules": _RULES, "budget": _BUDGET, "proxy": _PROXY, "profile": _PROFILE,
        "objectives": _OBJECTIVES, "serve": _SERVE, "search": _SEARCH,
    }  # fmt: skip
    return [
        (table, key, kind, KEY_DOCS.get(f"{table}.{key}", ""))
        for table in _TABLES
        for key, kind in schemas.get(table, {"?": "?"}).items()
    ]


@contextmanager
def _in_table(table: str) -> Iterator[None]:
    """Key errors raised inside by their table: `d_model` becomes `[model].d_model`."""
    try:
        yield
    except (SpaceError, SpecError) as exc:
        raise SpecError(exc.detail, f"[{table}].{exc.key}" if exc.key else f"[{table}]") from None
    except TrainError as exc:
        raise SpecError(str(exc), f"[{table}]") from None


def _value(key: str, value: Any, kind: str) -> Any:
    """`value` checked against a schema type; a list becomes a tuple, an integral float an int."""
    if kind.startswith("list["):
        if not isinstance(value, list):
            raise SpecError(f"expected a list, got {value!r}", key)
        return tuple(_value(key, v, kind[5:-1]) for v in value)
    if kind == "int" and isinstance(value, float) and value.is_integer():
        return int(value)  # TOML reads 1e5 as a float
    words, test = _TYPES[kind]
    if not test(value):
        raise SpecError(f"expected {words}, got {value!r}", key)
    # A float field written as an int (lr = 1) is the same setting: one form, one fingerprint.
    return float(value) if kind == "float" else value


def _read(table: dict[str, Any], schema: dict[str, str], prefix: str = "") -> dict[str, Any]:
    """A table's keys checked against a schema: unknown keys and wrong types are errors.

    `prefix` names an inline table in errors: `d_model.` gives `d_model.step`.
    """
    for key in table:
        if key not in schema:
            raise SpecError(f"unknown key; valid: {', '.join(schema)}", prefix + key)
    return {key: _value(prefix + key, value, schema[key]) for key, value in table.items()}


def _knob(name: str, value: Any) -> Any:
    """A [model] value: a fixed scalar, a categorical `Domain` or a range `Domain`."""
    if name not in KNOBS:
        return value  # SearchSpace names it as unknown
    if isinstance(value, list):
        if len(value) == 1:
            return value[0]  # one choice is a fixed value: not an Optuna parameter
        return Domain(name, "categorical", tuple(value))
    if not isinstance(value, dict):
        return value  # SearchSpace checks the type against the knob
    bounds = _read(value, _RANGE, prefix=f"{name}.")
    if "min" not in bounds or "max" not in bounds:
        raise SpecError("a range needs min and max", name)
    if bounds["min"] == bounds["max"]:
        return bounds["min"]
    kind = "int" if all(isinstance(bounds.get(k, 1), int) for k in ("min", "max", "step")) else "float"
    if kind == "float":  # one form per value: {min = 2, max = 6.5} is 2.0..6.5
        bounds = {k: v if k == "log" else float(v) for k, v in bounds.items()}
    log = bounds.get("log", False)
    return Domain(name, kind, low=bounds["min"], high=bounds["max"], step=bounds.get("step"), log=log)


_BUDGET = {"params": "table", "flops_per_token": "table"}


def _serve(table: dict[str, Any]) -> ServeScenario | None:
    """The [serve] table as a scenario; None when the file has none."""
    if not table:
        return None
    values = _read(table, _SERVE)
    renamed = {"memory": "memory_bytes", "working_memory": "working_bytes"}
    for key in renamed:
        if key in values:
            try:
                values[key] = parse_bytes(values[key], key)
            except ArchsearchError as exc:
                raise SpecError(str(exc), key) from None
    from archsearch.evaluators.hardware_serving import resolve_scenario

    try:
        return resolve_scenario(ServeScenario(**{renamed.get(k, k): v for k, v in values.items()}))
    except ServeError as exc:
        raise SpecError(str(exc)) from None


def _budget(table: dict[str, Any]) -> Budget:
    bounds = {}
    for key, value in _read(table, _BUDGET).items():
        kind = "int" if key == "params" else "float"  # params are counted: 1e6 reads as 1000000
        limits = _read(value, {"min": kind, "max": kind}, prefix=f"{key}.")
        if not limits:
            raise SpecError("give min, max or both", key)
        prefix = "params" if key == "params" else "flops"
        bounds.update({f"{prefix}_{k}": v for k, v in limits.items()})
    return Budget(**bounds)


def _promote(table: dict[str, Any]) -> PromoteSettings:
    """`[search].promote`'s inline table as settings; errors name `promote.KEY`."""
    for key in table:
        if key not in _PROMOTE:
            raise SpecError(f"unknown key; valid: {', '.join(_PROMOTE)}", f"promote.{key}")
    try:
        return PromoteSettings(**table)
    except PromoteError as exc:
        raise SpecError(exc.detail, f"promote.{exc.key}") from None


def _refuse_huge_integers(value: Any, key: str = "") -> None:
    """No integer past 2**63 - 1 anywhere in the file (the most the database stores): a 400-digit
    `seq_len` or budget went on into float arithmetic and ended in an OverflowError traceback."""
    if isinstance(value, dict):
        for name, inner in value.items():
            _refuse_huge_integers(inner, f"{key}.{name}" if key else name)
    elif isinstance(value, list):
        for inner in value:
            _refuse_huge_integers(inner, key)
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_WHOLE:
        table, _, name = key.rpartition(".")
        where = f"[{table}].{name}" if table else name
        raise SpecError(f"{where}: {short_number(value)} is past 2**63 - 1, the most the database stores")


def _parse(text: str, source: str, base_dir: Path) -> SearchSpec:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # Notepad's UTF-8 starts with a byte-order mark: "Invalid statement (at line 1, column 1)".
        if text.startswith("\ufeff"):
            raise SpecError(
                "invalid TOML: the file starts with a byte-order mark (U+FEFF); save it without one"
            ) from None
        raise SpecError(f"invalid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses per nested array or inline table: `[` * 100_000
        raise SpecError("invalid TOML: nested too deeply to be a search spec") from None
    except ValueError:
        raise SpecError(f"invalid TOML: {HUGE_INTEGER}") from None
    try:
        _refuse_huge_integers(doc)
    except RecursionError:  # dotted keys or [a.a.a...] headers nest tables without tomllib recursing
        raise SpecError("invalid TOML: nested too deeply to be a search spec") from None
    for key, value in doc.items():
        if key not in _TABLES:
            raise SpecError(f"unknown table [{key}]; valid: {', '.join(_TABLES)}")
        if not isinstance(value, dict):
            raise SpecError(f"[{key}] must be a table, got {value!r}")
    tables = {name: doc.get(name, {}) for name in _TABLES}
    with _in_table("rules"):
        rules = _read(tables["rules"], _RULES)
        if rules.get("multiple_of", 1) <= 0:
            raise SpecError(f"must be positive, got {rules['multiple_of']}", "multiple_of")
        check_export_formats(rules.get("export", ()))
    with _in_table("budget"):
        budget = _budget(tables["budget"])
    with _in_table("serve"):
        serve = _serve(tables["serve"])
    with _in_table("model"):
        space = SearchSpace.from_knobs(
            {k: _knob(k, v) for k, v in tables["model"].items()}, budget=budget, serve=serve, **rules
        )
    with _in_table("proxy"):
        settings = _read(tables["proxy"], _PROXY)
        data = settings.pop("data", None)
        if data is not None:
            if names_no_path(data):  # "" was the space file's own folder, read whole
                raise SpecError(f"must name a file or folder, got {quoted(data)}", "data")
            try:
                resolved = (base_dir / Path(data).expanduser()).resolve()
            except RuntimeError as exc:  # a loop of symlinks, or `~user` of no user: a traceback before
                raise SpecError(f"cannot resolve {quoted(str(data))}: {exc}", "data") from None
            if not resolved.exists():
                raise SpecError(f"not found: {resolved}", "data")
            data = str(resolved)
        proxy = TrainSettings(**settings)
    with _in_table("profile"):
        profile = ProfileSpec(**_read(tables["profile"], _PROFILE))
    with _in_table("objectives"):
        objectives = _read(tables["objectives"], _OBJECTIVES)
    with _in_table("search"):
        search = _read(tables["search"], _SEARCH)
        if "promote" in search:
            search["promote"] = _promote(search["promote"])
        defaults = SearchDefaults(**search)
    return SearchSpec(
        name=Path(source).stem, space=space, proxy=proxy, data=data, profile=profile,
        objectives=objectives.get("minimize", DEFAULT_OBJECTIVES),
        step_time_device=objectives.get("step_time_device"), size_beta=objectives.get("size_beta"),
        extrapolate=float(objectives.get("extrapolate", 0.0)),
        defaults=defaults, source=text,
    )  # fmt: skip
