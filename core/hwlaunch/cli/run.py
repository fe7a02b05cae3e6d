"""``hwlaunch run``: the command of the main job (the job itself is in ``_job``)."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import click

from hwlaunch.cli._job import (
    DEFAULT_PROMPTS,
    check,
    print_err,
    render,
    run_job,
    this_rank,
)
from hwlaunch.cli._model_check import (
    Parallelism,
    check_installed,
    check_model,
    check_vllm_job,
    choose_parallelism,
    require_vllm,
)
from hwlaunch.cli._options import setting_options
from hwlaunch.cli._progress import progress_style
from hwlaunch.plan import Plan
from hwlaunch.planning import settings
from hwlaunch.planning.settings import Sourced

DEFAULTS = {"world_size": 2}  # below every user setting: a run without flags has two ranks


@click.command()
@setting_options(DEFAULTS)
@click.option("--model", metavar="PATH", help="Local model directory (offline).")
@click.option(
    "--engine",
    type=click.Choice(["transformers", "vllm"]),
    default="transformers",
    show_default=True,
    help="transformers: its tensor parallelism on hwlaunch's workers; vllm: vLLM's engine, its "
    "workers on hwlaunch's executor (needs vLLM and --model).",
)
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
    engine: str,
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
    if engine == "vllm":
        require_vllm("hwlaunch run --engine vllm")  # before the model: the first fix to make
    facts = check_model(model)
    if engine == "vllm":
        model = check_vllm_job(model, parallel, facts, plan)
        parallelism = Parallelism("tensor", None)
    else:
        parallelism = choose_parallelism(parallel, facts, plan.world_size)
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
    if engine == "vllm":
        assert model is not None
        result = _vllm_job(
            plan, model, flags, config_file, prompts, max_new_tokens, reports, as_json
        )
    else:
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


def _vllm_job(
    plan: Plan,
    model: str,
    flags: dict[str, str | None],
    config_file: str | None,
    prompts: tuple[str, ...],
    max_new_tokens: int,
    reports: bool,
    as_json: bool,
) -> dict[str, Any]:
    """The job through vLLM; vLLM's log on stderr, so stdout holds the report alone."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    from hwlaunch.cli._vllm_job import run_vllm_job

    return run_vllm_job(
        plan,
        model=model,
        flags=flags,
        config_file=config_file,
        prompts=list(prompts) or list(DEFAULT_PROMPTS),
        max_new_tokens=max_new_tokens,
        progress_style=progress_style(reports, as_json),
    )
