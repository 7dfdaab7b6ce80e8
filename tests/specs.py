"""Tiny search specs for tests: a space whose trials train in seconds on a CPU.

Their trials profile no local kernels (`[profile] local = false`, the H100 modelled): timing them is
about a third of a tiny trial's CPU, and most tests do not read them. A test about the local
profile asks for it with `tiny_spec(profile=LOCAL_PROFILE)`.
"""

from __future__ import annotations

import textwrap

from archsearch.search.spec import parse_spec

TINY_TOML = """
[model]
vocab_size = 256
seq_len = 32
d_model = [64, 128]
aspect_ratio = [32, 64]
activation = ["gelu", "swiglu"]
head_dim = [32]
[proxy]
tokens = 2048
batch_size = 4
evals = 4
eval_batches = 1
device = "cpu"
[profile]
local = false
devices = ["h100-sxm"]
min_run_time = 0.002
[search]
trials = 4
prune = false
"""


def tiny_toml(**tables: str) -> str:
    """TINY_TOML with whole tables replaced, e.g. `tiny_toml(search="trials = 2")`."""
    text = TINY_TOML
    for name, body in tables.items():
        table = f"[{name}]\n{textwrap.dedent(body).strip()}\n"
        if f"[{name}]" not in text:
            text += table
            continue
        start = text.index(f"[{name}]")
        end = text.find("\n[", start + 1)
        text = text[:start] + table + (text[end + 1 :] if end >= 0 else "")
    return text


# The profile table as it was before tests went without local kernels: the specs whose fingerprints
# are pinned, and the tests that read a local profile, use it.
LOCAL_PROFILE = 'local = true\ndevices = ["h100-sxm"]\nmin_run_time = 0.002'


def tiny_spec(**tables: str):
    return parse_spec(tiny_toml(**tables), "tiny.toml")
