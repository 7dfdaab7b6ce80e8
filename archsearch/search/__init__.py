"""The search service: space files, the Optuna driver, Ray workers, and what runs beside a search.

Running a search:
- `spec`: the space file (`SearchSpec`): what to search, how to score a trial and how long.
- `options`: how to run a search (`SearchOptions`), checked once.
- `driver`: owns the Optuna study (ask / tell), dispatches trials to Ray, records results
  (`run_search`); its study opened in `study_open`, a trial's values for Optuna in
  `objective_values`.
- `samplers`: Optuna samplers by name; `pruning`: successive halving of dominated proxy runs.
- `pool`: the pool of Ray tasks a search, `validate` and `ladder` run their work on; `raystart`
  starts or joins Ray, `reaper` ends a local Ray with its driver, `ray_logs` sends Ray's own
  messages to a file.
- `worker`: what a Ray worker does for one trial.

Reading what a search found (the reading side's newer code lives in `archsearch.results`):
- `pareto`: fronts, knee and hypervolume; `plots`: fronts drawn.
- `selection`: which trials to export, and the file tree that exports them.
- `fidelity` and `fidelity_stats`: how well a cheap loss ranks shapes as longer training does.
- `validate`: `archsearch validate`, retraining a calibration set to measure that ranking.

Size ladders: `ladder_plan` plans the rungs and `ladder_runs` trains them on Ray.
"""
