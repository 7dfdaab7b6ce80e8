"""Where archsearch's accuracy figures were measured, and which of them a study's search can expect.

A fidelity or ladder figure holds in the regime that measured it: the models' size, their tokens
per parameter, the data. Three regimes stand behind archsearch's figures (docs/accuracy.md, "Which
regime measured what", has each with its command and date):

- `PUBLIC_GPU`: training runs recorded by others on GPUs, 48M-3.2B parameters on real tokens, scored
  with archsearch's own functions (`benchmarks/public_runs.py`);
- `LENT_GPU`: a GPU lent to the project, which has measured step and serving costs and the
  product's own proxy at 5-43M parameters on BPE tokens, against 10x its tokens;
- `TINY_CPU`: this project's CPU, byte-level proxies of 0.06-2M parameters trained for 240k tokens.

`validate` and `report` state a study's figures beside `expectation`'s sentence, one place for the
wording, so a user at GPU scale does not read the tiny regime's worst case as theirs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# A study is taken to sit in a regime when its median shape is within this factor of the sizes and
# tokens per parameter the regime measured: a measurement says little a factor of 2 past its edges.
SLACK = 2.0


@dataclass(frozen=True)
class Regime:
    """One regime's measurements, each with the command and date that made it."""

    name: str
    models: str  # what was trained, in a phrase
    params: tuple[float, float] | None  # total parameters of the shapes ranked; None: none ranked
    tokens_per_param: tuple[float, float] | None  # of the short (proxy) runs ranked
    ranking: str  # how a short run ranked longer training there
    ladder: str  # how the ladder law carried the loss past its top rung there
    source: str

    def holds(self, params: float, tokens_per_param: float | None) -> bool:
        """Whether a proxy of `params` total parameters at `tokens_per_param` (None: unknown, size
        alone decides) lies inside this regime, `SLACK` either way; never where it ranked nothing."""
        if self.params is None or self.tokens_per_param is None:
            return False
        low, high = self.params
        if not low / SLACK <= params <= high * SLACK:
            return False
        if tokens_per_param is None:
            return True
        low, high = self.tokens_per_param
        return low / SLACK <= tokens_per_param <= high * SLACK

    def span(self) -> str:
        """The sizes and tokens per parameter it ranked: "48M-3.2B parameters, 2-670 tokens per
        parameter"."""
        if self.params is None or self.tokens_per_param is None:
            return self.models
        (p0, p1), (t0, t1) = self.params, self.tokens_per_param
        return f"{params_text(p0)}-{params_text(p1)} parameters, {t0:g}-{t1:g} tokens per parameter"

    def line(self) -> str:
        """The regime's figures in one sentence."""
        return f"{self.name} ({self.models}): {self.ranking} ({self.source}); {self.ladder}"


PUBLIC_GPU = Regime(
    name="public GPU runs",
    models="Gemstones and the OLMo-2 ladder, 48M-3.2B parameters on real tokens",
    params=(48e6, 3.2e9),
    tokens_per_param=(2.0, 670.0),  # 4B-32B-token runs of 48M-2B shapes
    ranking="a run of 1-9% of the final tokens ranked 22 shapes' final losses at Spearman "
    "0.945-0.991 and ordered 29-36 of 37 equal-size pairs (parameter count: 0.970, 28)",
    ladder="the ladder law was 0.97% off at the median, 1.65% at worst, 1.7-4.2x past the top "
    "rung, and 2.97% / 3.27% at 5x the largest tokens per parameter laddered (the same command)",
    source="python benchmarks/public_runs.py, 2026-11-28",
)
LENT_GPU = Regime(
    name="a lent GPU",
    models="an H200: 20 shapes of 5-43M parameters trained on BPE tokens, 77 shapes' steps timed",
    params=(5.3e6, 43.3e6),
    tokens_per_param=(0.018, 0.15),  # the 800k-token proxy; its 2x and 4x runs reach 0.6
    ranking="the proxy (800k tokens) ranked 20 shapes' 10x-longer losses at Spearman 0.56 [0.16, "
    "0.80] (parameter count 0.54), the same proxy trained to 4x its tokens at 0.81 [0.49, 0.95]",
    ladder="no ladder was measured there; its step-time model was 4.5% off at the median, 13.3% at "
    "worst, on 12 H200 shapes measured after its last change (the same command)",
    source="python benchmarks/gpu_campaign.py --report, 2026-11-28",
)
TINY_CPU = Regime(
    name="this CPU's byte-level proxies",
    models="0.06-2M parameters, 240k tokens on 2 cores",
    params=(0.06e6, 2e6),
    tokens_per_param=(0.12, 4.0),
    ranking="the loss objective ranked 56 fresh shapes' 10x-longer losses at Spearman 0.787 "
    "[0.65, 0.87] and ordered 81% of equal-size pairs",
    ladder="ladders were 2.3% off at the median, 3.9% at worst, 4x past the top rung (one seed; "
    "0.8-9.9% by seed; benchmarks/ladder_accuracy.py at 5 tokens per parameter)",
    source="python benchmarks/calibration.py --report, 2026-11-26",
)
REGIMES = (PUBLIC_GPU, LENT_GPU, TINY_CPU)
# The regimes that measured a proxy's ranking: the ones a study's search can be compared with.
RANKED = tuple(r for r in REGIMES if r.params is not None)


def params_text(n: float) -> str:
    """A parameter count as the docs write it: 60k, 2M, 3.2B."""
    for factor, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= factor:
            return f"{n / factor:.3g}{suffix}"
    return f"{n:.3g}"


def median_proxy(params: Sequence[float], tokens: Sequence[float | None]) -> tuple[float, float | None]:
    """The median shape's total parameters and the median proxy's tokens per parameter (None where
    no trial recorded its tokens) of a study's trials."""
    if not params:
        raise ValueError("no trials to place in a regime")
    p = sorted(float(x) for x in params)
    size = p[len(p) // 2]
    ratios = sorted(float(t) / float(n) for t, n in zip(tokens, params, strict=True) if t and n)
    return size, (ratios[len(ratios) // 2] if ratios else None)


def expectation(params: Sequence[float], tokens: Sequence[float | None]) -> str:
    """What a study's search should expect of its proxy's ranking, in one sentence: the measured
    regime its median shape sits in and how a short run ranked there, or that it sits in none.

    Args:
        params: total parameters of the study's trials.
        tokens: the tokens each trial's proxy trained (None where not recorded), in the same order.
    """
    size, ratio = median_proxy(params, tokens)
    at = f"{params_text(size)} parameters" + (
        f" at {ratio:.2g} tokens per parameter" if ratio is not None and math.isfinite(ratio) else ""
    )
    for regime in RANKED:
        if regime.holds(size, ratio):
            return (
                f"this study's proxy ({at}) sits in the regime of {regime.name} ({regime.models}), "
                f"where {regime.ranking} ({regime.source})."
            )
    names = " and ".join(f"{r.name} ({r.span()})" for r in RANKED)
    return (
        f"this study's proxy ({at}) sits outside the regimes where a ranking was measured, {names}: "
        "neither's figures hold for it, and `archsearch validate` on this study measures its own."
    )


def validation_regime(report: Mapping[str, Any], tokens: Mapping[int, int | None] | None = None) -> str:
    """The regime line under a stored `validate` report: its figures are the study's own, and what
    the measured regimes say of a proxy like its. `tokens` (trial number -> the proxy's tokens) fills
    in reports stored before their rows kept them; without either, size alone places the study."""
    rows = report.get("rows") or ()
    if not rows:
        return "regime: no trial was retrained, so nothing places this study in a regime."
    known = tokens or {}
    where = expectation(
        [r["params_total"] for r in rows],
        [r.get("proxy_tokens") or known.get(r.get("number")) for r in rows],
    )
    return (
        f"regime: the figures above are this study's own, its shapes retrained at "
        f"{report.get('multiplier', 0):g}x their proxy's tokens; {where}"
    )
