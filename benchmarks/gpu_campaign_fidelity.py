"""Part 5 of the GPU campaign: the search's own proxy, ranked against 10x its tokens, at GPU scale.

`SHAPES` shapes drawn at random (seed `SAMPLE_SEED`, fixed before any was trained) from a GPU
space, examples/gpu.toml's knobs at 5-50M parameters on the BPE corpus of benchmarks/gpu_corpus.py
(byte-level text would leave a GPU-sized model spelling), are each trained as that space's proxy
(the example's `[proxy]`: batch 4 x 1024, constant rate 3e-3 at width 128, bf16) for
`PROXY_TOKENS`, and again as `archsearch validate` trains a long run (`validate.long_settings`:
`MULTIPLIER` x the tokens, cosine) through `validate.long_run`, the task a validation runs. The
runs share the GPU as a search on one GPU does (`--gpus-per-trial 1/CONCURRENCY`): Ray tasks of a
fractional GPU each, since one 5-50M run at batch 4 leaves most of an H200 idle (the H200 step
model: its host's launches take 70-85% of each step).

Order, so that a cut budget leaves a score: every shape's proxy and long run at seed 0 (longest
first, which ends the set soonest), then the noise: the proxy at seed 1 (the proxy's own seed
noise) and a second long seed of every shape (the reference's noise: pairs closer than it are
ties). A plan may grow between sittings (runs added, none changed): the first sitting's plan had a
second long seed for 6 shapes spread over the sizes; the second added the proxy at `PROMOTED` times
its tokens (seed 0, the proxy's constant rate: what a search's promotion to a longer rung trains)
and the second long seed of the other shapes.
A run is started only when the H200 model (times the
measured over modelled ratio of the runs finished so far) says it ends inside the budget; each is
recorded as it finishes, to `gpu_campaign_<device>_fidelity.jsonl`: a plan line, then one line per
run. Rerun with the same records, nothing recorded is trained again.

Scored with `search.fidelity_stats`: Spearman and Kendall with 95% intervals over shapes, the
paired difference against -params and -FLOPs, pairs beyond the long runs' seed noise, iso-size
pairs (`fidelity.iso_pair_agreement`, within 25%), front recall and the knee's regret; beside
them the regime: sizes, tokens per parameter and epochs of each run.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from archsearch.trial import COMPLETE, FAILED

SHAPES = 20
SAMPLE_SEED = 2026_11_28
# 800k tokens: 195 steps of 4 x 1024 (about 3 s a run on the H200 model); 10x that is 8M, four
# epochs of the 1.9M training tokens of the BPE corpus: more and the long runs would rank shapes
# by how well they memorise.
PROXY_TOKENS = 800_000
MULTIPLIER = 10
PROXY_SEEDS = (0, 1)
# Added in the second sitting, after the first's score: the proxy at 2x and 4x its tokens (does a
# longer proxy, as promotion gives the contenders, rank better?).
PROMOTED = (2, 4)
CONCURRENCY = 5  # runs sharing the GPU, a fifth of it each in Ray's accounting
PARAMS = {"min": 5e6, "max": 5e7}
MODEL = {
    "d_model": {"min": 256, "max": 768, "step": 128},
    "aspect_ratio": {"min": 32, "max": 128, "step": 32},
}
RUN_START_S = 6.0  # a task's model build, CUDA context and first steps, beyond its modelled steps
RAY_START_S = 20.0
# The smoke: 4 shapes (the fewest scored), proxies of 4 steps of 4 x 32 tokens, evaluations of one batch.
# One run at a time: each Ray worker's first task imports torch (45 s on 2 loaded cores).
SMOKE = {"shapes": 4, "proxy_tokens": 512, "concurrency": 1}
SMOKE_TOKENS_PER_S = 20_000.0  # a tiny CPU run's speed, for the smoke's plan only


@dataclass(frozen=True)
class Run:
    """One training run of the set."""

    label: str  # the shape's
    kind: str  # "proxy", "proxy2x" / "proxy4x" (`PROMOTED`) or "long"
    seed: int
    config: dict[str, Any]
    settings: dict[str, Any]  # TrainSettings fields

    @property
    def key(self) -> str:
        return f"{self.label}/{self.kind}/{self.seed}"


def space_dict(example: dict[str, Any], vocab: int, data: Path) -> dict[str, Any]:
    """examples/gpu.toml's space at 5-50M parameters on the BPE corpus (`data`, `vocab` ids)."""
    spec = json.loads(json.dumps(example))  # a deep copy of plain TOML data
    spec["model"] |= {"vocab_size": vocab, **MODEL}
    spec["budget"]["params"] = dict(PARAMS)
    spec["proxy"] |= {"tokens": PROXY_TOKENS, "data": str(data)}
    return spec


def shrink_for_smoke(spec: dict[str, Any]) -> None:
    """The smoke's runs, on the campaign's tiny CPU space: shorter windows, tokens and evaluations,
    its narrowest width alone (the 4-layer d128 shapes' long runs took most of the smoke's training)."""
    spec["model"]["seq_len"] = 32
    spec["model"]["d_model"] = {"min": 64, "max": 64, "step": 64}
    spec["proxy"] |= {"tokens": SMOKE["proxy_tokens"], "device": "cpu", "eval_batches": 1}


def plan(spec_text: str, smoke: bool) -> tuple[list[dict[str, Any]], list[Run]]:
    """The shapes (label, config, params, forward FLOPs a token) and the runs, in their order
    before the estimates sort them (`ordered`)."""
    import dataclasses

    from archsearch.search.spec import parse_spec
    from archsearch.search.validate import long_settings
    from archsearch.space.costs import flop_counts, param_counts
    from archsearch.space.search_space import sample_configs

    spec = parse_spec(spec_text)
    n = SMOKE["shapes"] if smoke else SHAPES
    # Random draws, not the enumeration: the same shapes in milliseconds instead of seconds.
    configs = sample_configs(spec.space, n, seed=SAMPLE_SEED, max_enumerate=0)
    proxy = dataclasses.asdict(spec.proxy)
    shapes, runs = [], []
    for i, cfg in enumerate(configs):
        label = f"g{i:02d}-d{cfg.d_model}-L{cfg.n_layers}"
        shapes.append({"label": label, "config": cfg.to_dict(), "params": param_counts(cfg).total,
                       "flops": flop_counts(cfg).forward})  # fmt: skip
        for seed in PROXY_SEEDS:
            runs.append(Run(label, "proxy", seed, cfg.to_dict(), {**proxy, "seed": seed}))
        for seed in (0, 1):
            runs.append(Run(label, "long", seed, cfg.to_dict(), long_settings(proxy, MULTIPLIER, seed, None)))
    for m in PROMOTED:
        longer = {**proxy, "seed": 0, "tokens": m * proxy["tokens"]}
        runs += [Run(s["label"], f"proxy{m}x", 0, s["config"], longer) for s in shapes]
    return shapes, runs


def estimate_s(run: Run, device: str, concurrency: int) -> float:
    """Seconds `run` takes, one of `concurrency` sharing the GPU: its steps at the H200 model's
    step time, or at `concurrency` times its kernels' time where the GPU is what bounds them, plus
    its evaluations (a forward is about a third of a step) and `RUN_START_S`. On a CPU (the smoke):
    `SMOKE_TOKENS_PER_S`."""
    from archsearch.evaluators.counting import eager_host_ops, eager_kernel_count, eager_memory_ops
    from archsearch.evaluators.hardware import modelled_profile
    from archsearch.space.config import ArchConfig

    s = run.settings
    if device == "cpu":
        return 1.0 + s["tokens"] / SMOKE_TOKENS_PER_S
    cfg = ArchConfig.from_dict(run.config)
    batch = s["batch_size"]
    report = modelled_profile(
        cfg, device, batch, "bf16", launches=eager_kernel_count(cfg),
        memory_ops=eager_memory_ops(cfg, batch, "bf16"), host_ops=eager_host_ops(cfg),
    )  # fmt: skip
    assert report is not None  # a catalogued device
    step = max(report.step_time_s, concurrency * report.kernel_sum_s)
    steps = math.ceil(s["tokens"] / (batch * cfg.seq_len))
    return RUN_START_S + step * (steps + s["evals"] * s["eval_batches"] / 3)


def ordered(runs: list[Run], estimates: dict[str, float]) -> list[Run]:
    """The seed-0 proxy and long runs, then the promoted proxies, then the noise runs, each group
    longest first."""

    def group(r: Run) -> int:
        return 0 if r.seed == 0 and r.kind in ("proxy", "long") else 1 if r.seed == 0 else 2

    return sorted(runs, key=lambda r: (group(r), -estimates[r.key]))


def makespan(runs: list[Run], estimates: dict[str, float], concurrency: int) -> float:
    """When the last run ends, each started on the first free slot of `concurrency`, in order."""
    slots = [0.0] * concurrency
    for r in runs:
        i = min(range(concurrency), key=slots.__getitem__)
        slots[i] += estimates[r.key]
    return max(slots, default=0.0)


# ------------------------------------------------------------------------------------------------
# Running the set
# ------------------------------------------------------------------------------------------------


def run(
    info: Any, record: Any, spec_text: str, corpus: dict[str, Any], budget: Any, smoke: bool,
    address: str | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Train the runs `record` (`Record`) lacks, within `budget`, on a local Ray (or the cluster at
    `address`); each recorded as it finishes. Returns every run line recorded."""
    device = "cpu" if info.type == "cpu" else record.model
    concurrency = SMOKE["concurrency"] if smoke else CONCURRENCY
    shapes, runs = plan(spec_text, smoke)
    estimates = {r.key: estimate_s(r, device, concurrency) for r in runs}
    record.start({"device": info.to_dict(), "space": spec_text, "corpus": corpus, "shapes": shapes,
                  "runs": [r.key for r in runs], "concurrency": concurrency,
                  "estimates_s": {k: round(v, 2) for k, v in estimates.items()}})  # fmt: skip
    done = {line["key"] for line in record.runs()}
    todo = [r for r in ordered(runs, estimates) if r.key not in done]
    print(
        f"part 5: {len(shapes)} shapes, {len(runs)} runs: {len(done)} recorded, {len(todo)} to train "
        f"({concurrency} at a time; the plan's {makespan(todo, estimates, concurrency):.0f} s)",
        flush=True,
    )
    if todo:
        _train(todo, estimates, info, record, corpus["path"], concurrency, budget, address)
    return record.runs()


def _train(
    todo: list[Run], estimates: dict[str, float], info: Any, record: Any, data: str, concurrency: int,
    budget: Any, address: str | None,
) -> None:  # fmt: skip
    import ray

    from archsearch.search.raystart import bounded, start_bound
    from archsearch.search.validate import long_run

    if not budget.allows(RAY_START_S + min(estimates[r.key] for r in todo)):
        print(
            f"part 5: budget spent ({budget.left():.0f} s left): {len(todo)} runs left, run again to resume"
        )
        return
    cuda = info.type == "cuda"
    with bounded(start_bound()):
        if address:  # a cluster's resources are its own: num_cpus and num_gpus are refused there
            ray.init(address=address, log_to_driver=False)
        else:
            # A new local Ray ("local"): without an address Ray joins whichever it finds running on
            # the machine (another search's, a test's), which refuses num_cpus and num_gpus.
            ray.init(address="local", num_cpus=concurrency, num_gpus=1 if cuda else 0,
                     include_dashboard=False, log_to_driver=False)  # fmt: skip
    try:
        task = ray.remote(long_run).options(
            num_cpus=1, num_gpus=round(1 / concurrency, 4) if cuda else 0, max_retries=0
        )
        pending: dict[Any, tuple[Run, float]] = {}
        ratios: list[float] = []  # measured over estimated, of the runs finished
        queue, left_out = list(todo), []
        while queue or pending:
            factor = statistics.median(ratios) if ratios else 1.0
            while queue and len(pending) < concurrency:
                r = queue.pop(0)
                if not budget.allows(factor * estimates[r.key]):
                    left_out.append(r)  # a shorter one further on may still fit
                    continue
                request = {
                    "config": r.config,
                    "settings": r.settings,
                    "data": data,
                    "cpus": 1,
                    "checkpoint": False,
                }
                pending[task.remote(request)] = (r, time.monotonic())
            if not pending:
                break
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(1.0, min(10.0, budget.left())))
            for ref in ready:
                r, started = pending.pop(ref)
                seconds = time.monotonic() - started
                try:
                    result = ray.get(ref)
                except Exception as exc:  # one run's failure is recorded; the others go on
                    result = {
                        "status": FAILED,
                        "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0]}",
                    }
                ratios.append(seconds / estimates[r.key])
                line = record.add(r, result, seconds, estimates[r.key])
                loss = (
                    f"loss {line['val_loss']:.4f}" if line.get("val_loss") is not None else line.get("reason")
                )
                print(
                    f"part 5: {r.key}: {loss} in {seconds:.1f} s (planned {estimates[r.key]:.1f} s)",
                    flush=True,
                )
            if not ready and budget.left() <= 0:
                for ref, (r, _) in pending.items():
                    ray.cancel(ref, force=True)
                    left_out.append(r)
                pending.clear()
        if left_out:
            print(f"part 5: budget spent: {len(left_out)} runs left, run again to resume", flush=True)
    finally:
        ray.shutdown()


@dataclass(frozen=True)
class Record:
    """The part's JSONL: a plan line, then one line per finished run; `write` is the campaign's
    (atomic, mirrored) file writer, `event` its log."""

    path: Path
    write: Any
    model: str

    def lines(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def plan(self) -> dict[str, Any] | None:
        """The latest plan line (a plan grows by lines: runs added, none changed)."""
        return next((line for line in reversed(self.lines()) if line["kind"] == "plan"), None)

    def runs(self) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line["kind"] == "run"]

    def _append(self, line: dict[str, Any]) -> None:
        old = self.path.read_bytes() if self.path.exists() else b""
        self.write(self.path, old + json.dumps(line).encode() + b"\n")

    def start(self, plan: dict[str, Any]) -> None:
        """Write the plan line, or check the recorded one is this plan (else raise ValueError)."""
        recorded = self.plan()
        if recorded is None:
            self._append({"kind": "plan", "time": _now(), **plan})
            return
        if (
            any(recorded[k] != plan[k] for k in ("space", "shapes"))
            or recorded["corpus"]["fingerprint"] != plan["corpus"]["fingerprint"]
            or not set(recorded["runs"]) <= set(plan["runs"])
        ):
            raise ValueError(
                f"{self.path} records another plan (the space, the shapes or the corpus differ, or runs "
                "were dropped); record into another --out"
            )
        if set(plan["runs"]) != set(recorded["runs"]):  # runs added: the grown plan is the latest line
            self._append({"kind": "plan", "time": _now(), **plan})

    def add(self, r: Run, result: dict[str, Any], seconds: float, planned: float) -> dict[str, Any]:
        line = {
            "kind": "run", "time": _now(), "key": r.key, "label": r.label, "run": r.kind, "seed": r.seed,
            "tokens": r.settings["tokens"], "status": result.get("status"), "reason": result.get("reason"),
            "val_loss": result.get("val_loss"), "trained_tokens": result.get("tokens"),
            "val_curve": result.get("val_curve"), "wall_time_s": result.get("wall_time_s"),
            "seconds": round(seconds, 2), "planned_s": round(planned, 2),
        }  # fmt: skip
        self._append(line)
        return line


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


# ------------------------------------------------------------------------------------------------
# Scoring
# ------------------------------------------------------------------------------------------------


def score(plan_line: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fidelity of the recorded runs (printed); None with fewer than 4 complete shapes."""
    import numpy as np

    from archsearch.search import fidelity_stats as fs
    from archsearch.search.fidelity import iso_pair_agreement

    loss = {(r["label"], r["run"], r["seed"]): r["val_loss"] for r in runs
            if r["status"] == COMPLETE and r["val_loss"] is not None}  # fmt: skip
    shapes = [
        s for s in plan_line["shapes"] if (s["label"], "proxy", 0) in loss and (s["label"], "long", 0) in loss
    ]
    failed = [r["key"] for r in runs if r["status"] != COMPLETE]
    if failed:
        print(f"part 5: {len(failed)} runs failed: {', '.join(failed[:6])}")
    if len(shapes) < 4:
        print(f"part 5: {len(shapes)} shapes with a proxy and a long run: too few to score (4 needed)")
        return None
    labels = [s["label"] for s in shapes]
    target = np.array([loss[(label, "long", 0)] for label in labels])
    params = np.array([s["params"] for s in shapes], dtype=float)
    flops = np.array([s["flops"] for s in shapes], dtype=float)
    seeds = [seed for seed in PROXY_SEEDS if all((label, "proxy", seed) in loss for label in labels)]
    proxy = np.array([[loss[(label, "proxy", seed)] for label in labels] for seed in seeds])
    twice = [label for label in labels if (label, "long", 1) in loss]
    noise = (
        fs.seed_noise([loss[(lb, "long", 0)] for lb in twice], [loss[(lb, "long", 1)] for lb in twice])
        if twice else 0.0
    )  # fmt: skip
    summary: dict[str, Any] = fs.measures(proxy, target, flops, params_predictor=-params,
                                          flops_predictor=-flops, noise=noise)  # fmt: skip
    summary |= {
        "shapes": len(shapes), "proxy_seeds": seeds, "long_noise": noise, "long_noise_shapes": len(twice),
        "params_spearman": fs.rank_correlation(-params, target).to_dict(),
        "flops_spearman": fs.rank_correlation(-flops, target).to_dict(),
        "iso_pairs_proxy": list(iso_pair_agreement(proxy[0], target, params)),
        "iso_pairs_params": list(iso_pair_agreement(-params, target, params)),
    }  # fmt: skip
    if len(seeds) > 1:
        summary["proxy_noise"] = fs.seed_noise(proxy[0], proxy[1])
    if len(twice) >= 4:
        ceiling = fs.rank_correlation([loss[(lb, "long", 1)] for lb in twice],
                                      [loss[(lb, "long", 0)] for lb in twice])  # fmt: skip
        summary["long_seed_spearman"] = ceiling.to_dict()
    summary["promoted"] = _promoted(loss, labels, target, flops, params, noise, proxy[0])
    if len(twice) == len(labels):  # every shape's two long seeds: their mean, the steadier reference
        mean = (target + np.array([loss[(lb, "long", 1)] for lb in labels])) / 2
        summary["against_long_mean"] = {
            name: fs.rank_correlation(predictor, mean).to_dict()
            for name, predictor in [("proxy", proxy[0]), ("params", -params), ("flops", -flops)]
            + [(f"proxy{m}x", np.array([loss[(lb, f"proxy{m}x", 0)] for lb in labels]))
               for m in PROMOTED if all((lb, f"proxy{m}x", 0) in loss for lb in labels)]
        }  # fmt: skip
    summary["regime"] = regime(plan_line, shapes, runs)
    _print_score(summary)
    return summary


def _promoted(
    loss: dict, labels: list[str], target: Any, flops: Any, params: Any, noise: float, proxy: Any
) -> dict:
    """The proxy trained to each of `PROMOTED` times its tokens, scored as the proxy is, and against
    the proxy itself at the same seed (`proxy`: seed 0's losses), paired on the same shapes."""
    import numpy as np

    from archsearch.search import fidelity_stats as fs
    from archsearch.search.fidelity import iso_pair_agreement

    out: dict[str, Any] = {}
    for m in PROMOTED:
        if not all((lb, f"proxy{m}x", 0) in loss for lb in labels):
            continue
        promoted = np.array([loss[(lb, f"proxy{m}x", 0)] for lb in labels])
        measured = fs.measures(promoted[None, :], target, flops, params_predictor=-params,
                               flops_predictor=-flops, noise=noise)  # fmt: skip
        kept = ("spearman", "kendall", "vs_params", "pairs", "front_recall", "knee_regret")
        out[f"{m}x"] = {k: measured[k] for k in kept} | {
            "iso_pairs": list(iso_pair_agreement(promoted, target, params)),
            "proxy_seed0_spearman": fs.rank_correlation(proxy, target).to_dict(),
            "vs_proxy": fs.paired_difference(promoted[None, :], proxy, target).to_dict(),
        }
    return out


def regime(plan_line: dict[str, Any], shapes: list[dict[str, Any]], runs: list[dict[str, Any]]) -> dict:
    """Sizes, tokens per parameter and epochs of the runs scored."""
    params = [s["params"] for s in shapes]
    train_tokens = plan_line["corpus"]["train_tokens"]
    out: dict[str, Any] = {"params": [min(params), max(params)], "train_tokens": train_tokens}
    for kind in ("proxy", *(f"proxy{m}x" for m in PROMOTED), "long"):
        tokens = max((r["tokens"] for r in runs if r["run"] == kind), default=0)
        if not tokens:
            continue
        out[kind] = {"tokens": tokens, "tokens_per_param": [tokens / max(params), tokens / min(params)],
                     "epochs": tokens / train_tokens}  # fmt: skip
    return out


def _print_score(s: dict[str, Any]) -> None:
    from archsearch.search.fidelity_stats import estimate_text

    seeds = f"{len(s['proxy_seeds'])} seed{'s' if len(s['proxy_seeds']) > 1 else ''}"
    print(f"part 5: {s['shapes']} shapes, the proxy ({seeds}) against {MULTIPLIER}x its tokens (seed 0):")
    print(
        f"  Spearman: proxy {estimate_text(s['spearman'])}, params {estimate_text(s['params_spearman'])}, "
        f"FLOPs {estimate_text(s['flops_spearman'])}; Kendall proxy {estimate_text(s['kendall'])}"
    )
    print(
        f"  proxy minus params {estimate_text(s['vs_params'], '+.2f')}, minus FLOPs "
        f"{estimate_text(s['vs_flops'], '+.2f')} (paired, same shapes)"
    )
    print(f"  pairs beyond the long runs' seed noise ({s['long_noise']:.4f} nats over "
          f"{s['long_noise_shapes']} shapes): {s['pairs'][0]} of {s['pairs'][1]}; iso-size pairs (within "
          f"25%): proxy "
          f"{s['iso_pairs_proxy'][0]} of {s['iso_pairs_proxy'][1]}, params {s['iso_pairs_params'][0]} of "
          f"{s['iso_pairs_params'][1]}")  # fmt: skip
    print(
        f"  front recall {s['front_recall'][0]} of {s['front_recall'][1]}, the knee's regret "
        f"{s['knee_regret']:.4f} nats"
    )
    if "proxy_noise" in s:
        print(f"  proxy seed noise {s['proxy_noise']:.4f} nats (rms difference of two seeds)")
    if "long_seed_spearman" in s:
        print(
            "  the long runs' own ceiling: seed 1 against seed 0, Spearman "
            + estimate_text(s["long_seed_spearman"])
        )
    for m, p in s.get("promoted", {}).items():
        print(
            f"  the proxy at {m} its tokens: Spearman {estimate_text(p['spearman'])}, Kendall "
            f"{estimate_text(p['kendall'])}, minus params {estimate_text(p['vs_params'], '+.2f')}, minus "
            f"the proxy at seed 0 ({estimate_text(p['proxy_seed0_spearman'])}) "
            f"{estimate_text(p['vs_proxy'], '+.2f')}; pairs "
            f"beyond noise {p['pairs'][0]} of {p['pairs'][1]}, iso-size {p['iso_pairs'][0]} of "
            f"{p['iso_pairs'][1]}, front recall {p['front_recall'][0]} of {p['front_recall'][1]}, the "
            f"knee's regret {p['knee_regret']:.4f} nats"
        )
    if "against_long_mean" in s:
        print("  against the mean of the two long seeds (every shape): Spearman " + ", ".join(
            f"{name} {estimate_text(v)}" for name, v in s["against_long_mean"].items()))  # fmt: skip
    r = s["regime"]
    for kind in (k for k in r if k.startswith("proxy") or k == "long"):
        k = r[kind]
        low, high = k["tokens_per_param"]
        print(f"  {kind}: {k['tokens']:,} tokens, {low:.2f}-{high:.2f} tokens a parameter, "
              f"{k['epochs']:.2f} epochs of {r['train_tokens']:,}; shapes "
              f"{r['params'][0] / 1e6:.1f}-{r['params'][1] / 1e6:.1f}M parameters")  # fmt: skip
