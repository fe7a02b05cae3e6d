"""``hwlaunch run``: the command of the main job (the job itself is in ``_job``)."""

from __future__ import annotations

import json
import shutil

import click

from hwlaunch.cli._job import (
    DEFAULT_PROMPTS,
    check,
    print_err,
    render,
    run_job,
    this_rank,
)
from hwlaunch.cli._model_check import check_installed, check_model, choose_parallelism
from hwlaunch.cli._options import setting_options
from hwlaunch.cli._progress import progress_style
from hwlaunch.planning import settings
from hwlaunch.planning.settings import Sourced

DEFAULTS = {"world_size": 2}  # below every user setting: a run without flags has two ranks


@click.command()
@setting_options(DEFAULTS)
@click.option("--model", metavar="PATH", help="Local model directory (offline).")
@click.option(
    "--parallel",
    type=click.Choice(["tensor", "data"]),
    help="tensor: shard the model over the workers; data: a whole copy in each, the prompts "
    "split between them (default: tensor where the model shards, else data, with the reason).",
)
@click.option("--prompt", "prompts", multiple=True, metavar="TEXT", help="Prompt (repeatable).")
@click.option("--max-new-tokens", default=16, show_default=True, type=click.IntRange(1, 4096))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def run(
    config_file: str | None,
    model: str | None,
    parallel: str | None,
    prompts: tuple[str, ...],
    max_new_tokens: int,
    as_json: bool,
    **flags: str | None,
) -> None:
    """Start workers, check the process group, generate with a causal LM and verify it."""
    from hwlaunch.planning.resolver import resolve_with_sources

    plan = resolve_with_sources(
        flags,
        settings.sources("cli"),
        config=config_file,
        config_source="--config",
        defaults={k: Sourced(v, "hwlaunch run default") for k, v in DEFAULTS.items()},
    )
    # The model is checked before any worker starts, without importing transformers (see
    # _model_check): a bad --model is one line and exit 2.
    parallelism = choose_parallelism(parallel, check_model(model), plan.world_size)
    check_installed(parallelism.mode)
    reports = this_rank(plan) == 0  # under torchrun, srun or mpirun: rank 0 reports
    if not reports:
        pass
    elif not as_json:
        click.echo(plan.explain(width=shutil.get_terminal_size((120, 24)).columns), nl=False)
    else:
        for warning in plan.warnings:
            print_err(f"warning: {warning}")
    if reports and parallelism.note:
        print_err(f"note: {parallelism.note}")
    result = run_job(
        plan,
        model=model,
        parallelism=parallelism,
        prompts=list(prompts) or list(DEFAULT_PROMPTS),
        max_new_tokens=max_new_tokens,
        progress_style=progress_style(reports, as_json),
    )
    if reports and not as_json:
        click.echo(render(result))
    check(result)  # with --json, a failed check prints the report inside the error object
    if reports and as_json:
        click.echo(json.dumps(result, indent=2))
