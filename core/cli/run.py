"""``hwlaunch run``: the CLI face of the main job (see hwlaunch.cli._job)."""

from __future__ import annotations

import json
import shutil

import click

from hwlaunch.cli._job import DEFAULT_PROMPTS, check, print_err, render, run_job
from hwlaunch.planning.settings import Sourced

RUN_SOURCES = {
    "backend": "--backend",
    "world_size": "--world-size",
    "executor": "--executor",
    "start_method": "--start-method",
    "ray_address": "--ray-address",
    "nnodes": "--nnodes",
}
RUN_DEFAULTS = {"world_size": Sourced(2, "hwlaunch run default")}


@click.command()
@click.option("--backend", metavar="NAME", help="Backend name (default: auto-detect).")
@click.option("--world-size", "-n", metavar="N", help="Number of workers (default: 2).")
@click.option("--nnodes", metavar="N", help="Number of nodes (more than 1 means Ray).")
@click.option("--executor", metavar="uni|mp|ray", help="How workers are started.")
@click.option("--start-method", metavar="fork|spawn|forkserver", help="For the mp executor.")
@click.option("--ray-address", metavar="ADDR", help="Ray cluster to join (executor ray).")
@click.option("--config", "config_file", metavar="FILE", help="Config file.")
@click.option("--model", metavar="PATH", help="Local model directory (offline).")
@click.option("--prompt", "prompts", multiple=True, metavar="TEXT", help="Prompt (repeatable).")
@click.option("--max-new-tokens", default=16, show_default=True, type=click.IntRange(1, 4096))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def run(
    config_file: str | None,
    model: str | None,
    prompts: tuple[str, ...],
    max_new_tokens: int,
    as_json: bool,
    **flags: str | None,
) -> None:
    """Start workers, check the process group, generate with a causal LM and verify it."""
    from hwlaunch.planning.resolver import resolve_with_sources

    plan = resolve_with_sources(
        flags, RUN_SOURCES, config=config_file, config_source="--config", defaults=RUN_DEFAULTS
    )
    if not as_json:
        click.echo(plan.explain(width=shutil.get_terminal_size((120, 24)).columns), nl=False)
    else:
        for warning in plan.warnings:
            print_err(f"warning: {warning}")
    result = run_job(
        plan,
        model=model,
        prompts=list(prompts) or list(DEFAULT_PROMPTS),
        max_new_tokens=max_new_tokens,
        quiet=as_json,
    )
    click.echo(json.dumps(result, indent=2) if as_json else render(result))
    check(result)
