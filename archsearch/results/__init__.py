"""Reading what searches found, beside running them (`archsearch.search`).

- `ladder_fit`: the scaling law fitted across size ladders (pure numpy and scipy);
- `ladder`: size ladders of chosen designs trained on Ray workers, stored per rung, and the
  loss they predict at another size.

This room may import `space`, `storage`, `evaluators` and `search`; `cli` imports it, lazily.
"""
