"""What archsearch searches: the `ArchConfig` shape, its exact costs, width rules, presets and spaces.

- `config`: `ArchConfig`, one validated, frozen, serialisable shape;
- `costs`: its exact parameter, FLOP and memory counts;
- `width`: MLP width analysis (gated parity sizes, ReLU feature-retention risk);
- `presets`: published architectures with their published parameter counts;
- `knobs`: from search knobs to a concrete shape;
- `search_space`: `SearchSpace`, the knobs a search samples, the rules and the budget;
- `objectives`: the objectives a search minimises, defined once;
- `serve`: a serving scenario and the exact memory it costs a shape;
- `scale_candidates`: the shapes near the user's size that keep a trial's design choices;
- `export`: the export formats (a shape and its provenance in, files out).

Imports neither torch nor Ray, so sampling and costing stay cheap.
"""

from archsearch.space.config import (
    ACTIVATIONS,
    NORM_PLACEMENTS,
    NORMS,
    POSITIONS,
    ArchConfig,
    load_config,
    save_config,
)
from archsearch.space.costs import (
    DTYPE_BYTES,
    FlopCounts,
    ParamCounts,
    cost_report,
    flop_counts,
    kv_cache_bytes_per_token,
    param_counts,
    weight_bytes,
)
from archsearch.space.presets import PRESETS, Preset, preset
from archsearch.space.search_space import (
    KNOBS,
    Budget,
    Domain,
    Feasibility,
    Rejected,
    SearchSpace,
    SpaceError,
    sample_configs,
)
from archsearch.space.width import FeatureLoss, gated_d_ff, relu_feature_loss

__all__ = [
    "ACTIVATIONS",
    "DTYPE_BYTES",
    "KNOBS",
    "NORMS",
    "NORM_PLACEMENTS",
    "POSITIONS",
    "PRESETS",
    "ArchConfig",
    "Budget",
    "Domain",
    "Feasibility",
    "FeatureLoss",
    "FlopCounts",
    "ParamCounts",
    "Preset",
    "Rejected",
    "SearchSpace",
    "SpaceError",
    "cost_report",
    "flop_counts",
    "gated_d_ff",
    "kv_cache_bytes_per_token",
    "load_config",
    "param_counts",
    "preset",
    "relu_feature_loss",
    "sample_configs",
    "save_config",
    "weight_bytes",
]
