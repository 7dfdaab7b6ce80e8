"""Reading what searches found, for people, beside running them (`archsearch.search`):

- `report`: the study report, gathered as records and rendered by `html`;
- `ladder_fit`: the scaling law fitted across size ladders (pure numpy and scipy);
- `ladder`: the law fitted over a study's stored size ladders and the loss it predicts at
  another size (the rungs are planned and trained in `search.ladder_plan` and `search.ladder_runs`);
- `ladder_plot`: the ladders and their law drawn to a PNG.
- `regimes`: which measured regime a study's proxy sits in and what was measured there, the one
  wording `validate` and the report use.
- `scale_ranking`: a trial's design at the user's size: the candidate shapes
  (`space.scale_candidates`) ranked by modelled step time on a catalogued GPU, for
  `export --scale-to`.

The reading side is growing (fronts, selection, validation and plots still sit in `search/`
beside the code that runs a search); new reading-side code lives here. This room may import
`space`, `storage`, `evaluators` and `search`, never the other way round (`search.ladder_runs`
is handed `ladder.fit_study_ladders` by its caller to fit the rungs it has just trained). `cli`
imports this room lazily.
"""
