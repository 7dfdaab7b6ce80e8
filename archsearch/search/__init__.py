"""The search service: space files, the Optuna driver, Ray workers, pruning."""
