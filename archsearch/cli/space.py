"""`archsearch space check`: a space file validated and described without searching: its knobs,
size, feasible share and a few sampled configs with their costs."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from archsearch.cli.common import JsonFlag, SpaceArg, print_json, si, space_app, stdout
from archsearch.space import ArchConfig, param_counts


@space_app.command("check")
def space_check(
    space: SpaceArg,
    samples: Annotated[int, typer.Option(help="Sampled configs to show with their costs.", min=0)] = 5,
    seed: Annotated[int, typer.Option(help="Seed of the sampled configs.")] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Validate a space file; print its knobs, size, feasible share and a few sampled configs."""
    from archsearch.search.spec import load_spec
    from archsearch.space.search_space import sample_configs

    spec = load_spec(space)
    spec.preflight()  # a corpus the trials could not read, a batch no shape holds
    feasibility = spec.space.feasibility()
    configs = sample_configs(spec.space, samples, seed)
    if as_json:
        print_json(
            {
                "spec": spec.to_dict(),
                "fingerprint": spec.fingerprint,
                "size": spec.space.size(),
                "feasibility": dataclasses.asdict(feasibility),
                "samples": [{"config": c.to_dict(), **_costs(c)} for c in configs],
            }
        )
    else:
        console = stdout()
        table = Table("knob", "values")
        for domain in spec.space.domains:
            table.add_row(domain.name, escape(domain.describe()))
        for name, value in spec.space.fixed:
            table.add_row(name, escape(f"{value!r} (fixed)"))
        console.print(table)
        size = spec.space.size()
        how = "all" if feasibility.exhaustive else "random"
        console.print(
            f"size: {'continuous' if size is None else f'{size:,} points'}; "
            f"budget: {spec.space.budget.describe()}\n"
            f"feasible: {feasibility.feasible:,} of {feasibility.checked:,} checked ({how} points)"
        )
        for reason, count in feasibility.reasons:
            console.print(f"  rejected {count:,}: {escape(reason)}")
        if feasibility.exhaustive:
            console.print("samples: feasible by construction (each knob is offered the values left feasible)")
        console.print(
            f"objectives: {', '.join(spec.objectives)}; proxy: {_budget_text(spec.proxy)}; "
            f"sampler {spec.defaults.sampler}, {spec.defaults.trials} trials"
        )
        if configs:
            sample = Table("sampled config", "params", "FLOPs/token")
            for c in configs:
                costs = _costs(c)
                sample.add_row(c.describe(), si(costs["params_total"]), si(costs["flops_forward_per_token"]))
            console.print(sample)
    if feasibility.feasible == 0:
        spec.space.check_feasible()  # raises with the reasons: exit 2


def _costs(cfg: ArchConfig) -> dict[str, float]:
    from archsearch.space.costs import flop_counts

    return {"params_total": param_counts(cfg).total, "flops_forward_per_token": flop_counts(cfg).forward}


def _budget_text(proxy: Any) -> str:
    if proxy.tokens is not None:
        return f"{proxy.tokens:,} tokens"
    return f"{si(proxy.flops, 'FLOP')}" if proxy.flops is not None else f"{proxy.seconds:g} s"
