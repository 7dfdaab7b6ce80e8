"""How to run a search: the options the CLI and the Python API pass to `run_search`, checked once
when they are made. A module of its own so that the modules the driver calls can name the options
without importing the driver."""

from __future__ import annotations

from dataclasses import dataclass

from archsearch.errors import quoted
from archsearch.search.pool import SearchError
from archsearch.search.samplers import SAMPLERS
from archsearch.units import SEED_MAX, ray_resources_problem, short_number

DEFAULT_LEASE_S = 120.0  # a running trial whose driver went silent this long is presumed dead


@dataclass(frozen=True)
class SearchOptions:
    """How to run a search; the spec's `[search]` table gives the defaults the CLI passes here."""

    study: str
    trials: int  # finished trials (complete, pruned or failed) the study should reach
    workers: int = 1  # trials in flight at once
    sampler: str = "tpe"
    seed: int = 0
    resume: bool = False  # continue a study of this name (created if missing)
    prune: bool = True
    address: str | None = None  # a Ray cluster to join; None starts a local one
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    retries: int = 1  # re-runs of a trial whose worker died
    lease_s: float = DEFAULT_LEASE_S
    replay: str | None = None  # a study of the same space whose complete shapes run first

    def __post_init__(self) -> None:
        # Printable: a line break in the name split the one error line and the command that
        # continues the search (quoted across two lines) in two.
        if not self.study or len(self.study) > 512 or not self.study.isprintable():
            raise SearchError(
                f"--study must be a name of 1 to 512 printable characters, got {quoted(self.study)}"
            )
        if self.trials < 1:
            raise SearchError(f"--trials must be at least 1, got {short_number(self.trials)}")
        if self.retries < 0:
            raise SearchError(f"--retries must be >= 0, got {short_number(self.retries)}")
        if problem := ray_resources_problem(
            self.cpus_per_trial, self.gpus_per_trial, "trial", self.workers, self.address
        ):
            raise SearchError(problem)
        if not 0 <= self.seed <= SEED_MAX:
            seed = short_number(self.seed)
            raise SearchError(f"--seed must be in 0..{SEED_MAX} (Optuna's seed range), got {seed}")
        if self.sampler not in SAMPLERS:
            raise SearchError(f"sampler {self.sampler!r} is unknown; valid: {', '.join(SAMPLERS.names())}")
