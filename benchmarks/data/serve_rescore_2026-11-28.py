"""One-off (2026-11-28): two recorded CPU serve runs re-scored with the bytes their calls move as
counted after the serving counter stopped counting `_unsafe_view` (`serve_profiler._OpCounter`).

The measured seconds are the records'; each row's modelled seconds lose the bytes the old rule
counted and the new one does not, at the run's measured elementwise rate (the only place those
bytes enter a CPU prediction: `serving._serve_time`'s memory-bound ops). Reproduces the records'
own medians under the old rule, so the difference is the rule's alone (docs/how-to/serving.md).

    cd benchmarks/data && python serve_rescore_2026-11-28.py serve_accuracy_cpu_2026-11-27_interleaved?.json
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys

import torch

from archsearch.evaluators import serve_profiler as sp
from archsearch.evaluators.model import KVCache, ProxyLM
from archsearch.space.config import ArchConfig


class OldRule(sp._OpCounter):
    """The counter before: `_unsafe_view` read its argument and wrote its result."""

    def count_bytes(self, func, name, args, kwargs, out):  # type: ignore[no-untyped-def]
        if name == "_unsafe_view":
            tensors = [a for a in args if isinstance(a, torch.Tensor)] + [out]
            self.add_bytes("elementwise", sum(t.numel() * t.element_size() for t in tensors))
            return
        super().count_bytes(func, name, args, kwargs, out)


def call_bytes(cfg: ArchConfig, batch: int, context: int, counter: type) -> tuple[int, int]:
    """(prefill, decode) memory-bound bytes of `measure_serve`'s calls, run here in fp32."""
    torch.manual_seed(0)
    model = ProxyLM(dataclasses.replace(cfg, seq_len=max(cfg.seq_len, context + 1))).eval()
    cache = KVCache(model.cfg, batch, context + 1)
    prompt = torch.randint(0, cfg.vocab_size, (batch, context))
    moved = []
    with torch.no_grad():
        for length, idx in ((0, prompt), (context, prompt[:, -1:])):
            cache.length = length
            c = counter()
            with c:
                model(idx, cache, last_only=True)
            moved.append(c.memory_bytes)
    return moved[0], moved[1]


def main() -> None:
    for path in sys.argv[1:]:
        record = json.load(open(path))
        rate, batch = record["local_model"]["elementwise_bandwidth_bytes_per_s"], record["batch"]
        errors: dict[str, tuple[list[float], list[float]]] = {"prefill": ([], []), "decode": ([], [])}
        for row in record["rows"]:
            cfg = ArchConfig.from_dict(row["config"])
            old = call_bytes(cfg, batch, row["context"], OldRule)
            new = call_bytes(cfg, batch, row["context"], sp._OpCounter)
            for i, phase in enumerate(("prefill", "decode")):
                modelled, real = row[f"{phase}_modelled_s"], row[f"{phase}_measured_s"]
                errors[phase][0].append(abs(modelled / real - 1))
                errors[phase][1].append(abs((modelled - (old[i] - new[i]) / rate) / real - 1))
        for phase, (before, after) in errors.items():
            print(
                f"{path.rsplit('/', 1)[-1]} {phase}: median |error| {statistics.median(before):.1%}, worst "
                f"{max(before):.1%} -> {statistics.median(after):.1%}, {max(after):.1%} ({len(before)} pairs)"
            )


if __name__ == "__main__":
    main()
