"""Reading what searches found, for people, beside running them (`archsearch.search`):

- `report`: the study report, gathered as records and rendered by `html`;
- `ladder_fit`: the scaling law fitted across size ladders (pure numpy and scipy);
- `ladder`: size ladders of chosen designs trained on Ray workers, stored per rung, and the
  loss they predict at another size.

The reading side is growing (fronts, selection, validation and plots still sit in `search/`
beside the code that runs a search); new reading-side code lives here. This room may import
`space`, `storage`, `evaluators` and `search`, never the other way round; `cli` imports it, lazily.
"""
