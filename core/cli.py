"""The ``hwlaunch`` command line: ``backends``, ``resolve`` and ``run``.

User errors (HwlaunchError with exit_code 2, click usage errors) print one message on stderr and
exit 2 without a traceback; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import json
import shutil
import sys
import traceback
from typing import Any

import click

from hwlaunch.cli_run import run
from hwlaunch.contract import CONTRACT_VERSION
from hwlaunch.errors import HwlaunchError
from hwlaunch.facts import probe_device
from hwlaunch.registry import Registry, default_registry

CLI_SOURCES = {
    "backend": "--backend",
    "world_size": "--world-size",
    "nnodes": "--nnodes",
    "executor": "--executor",
    "start_method": "--start-method",
    "ray_address": "--ray-address",
}


def plan_options(func: Any) -> Any:
    """The override flags shared by ``resolve`` and ``run`` (values are validated by resolve)."""
    options = [
        click.option("--backend", metavar="NAME", help="Backend name (see `hwlaunch backends`)."),
        click.option("--nnodes", metavar="N", help="Number of nodes (more than 1 means Ray)."),
        click.option("--executor", metavar="uni|mp|ray", help="How workers are started."),
        click.option(
            "--start-method",
            metavar="fork|spawn|forkserver",
            help="multiprocessing start method for the mp executor.",
        ),
        click.option("--ray-address", metavar="ADDR", help="Ray cluster to join."),
        click.option(
            "--config",
            "config_file",
            metavar="FILE",
            help="Config file (default: ./hwlaunch.toml or [tool.hwlaunch]).",
        ),
        click.option(
            "--assume",
            multiple=True,
            metavar="KEY=VALUE",
            help="Assume a runtime fact, e.g. cuda.initialized=true (repeatable).",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print JSON."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def backend_rows(registry: Registry) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name, entry in sorted(registry.backends.items(), key=lambda kv: -kv[1].spec.priority):
        spec, plugin = entry.spec, entry.plugin
        facts = probe_device(spec)
        rows.append(
            {
                "name": name,
                "plugin": plugin.name,
                "distribution": plugin.distribution,
                "version": plugin.version,
                "available": facts.available,
                "device_count": facts.device_count,
                "initialized": facts.initialized,
                "start_methods": {
                    "allowed": list(spec.start_methods.allowed),
                    "default": spec.start_methods.default,
                },
                "dist_backend": spec.dist_backend,
                "device_control_env_var": spec.device_control_env_var,
                "ray_resource": spec.ray_resource,
                "worker": spec.worker,
                "device_binding": spec.device_binding,
                "propagate_env": list(spec.propagate_env),
                "ray_noset_visibility_var": spec.ray_noset_visibility_var,
                "contract": plugin.contract,
                "error": facts.probe_error,
            }
        )
    for plugin in registry.failures:
        rows.append(
            {
                "name": None,
                "plugin": plugin.name,
                "distribution": plugin.distribution,
                "version": plugin.version,
                "available": False,
                "device_count": 0,
                "initialized": False,
                "start_methods": None,
                "dist_backend": None,
                "device_control_env_var": None,
                "ray_resource": None,
                "worker": None,
                "device_binding": None,
                "propagate_env": [],
                "ray_noset_visibility_var": None,
                "contract": plugin.contract,
                "error": plugin.error,
            }
        )
    return rows


def plugin_rows(registry: Registry) -> list[dict[str, Any]]:
    return [
        {
            "name": p.name,
            "module": p.module,
            "distribution": p.distribution,
            "version": p.version,
            "hooks": list(p.hooks),
            "backends": list(p.backends),
            "contract": p.contract,
            "warnings": list(p.warnings),
            "error": p.error,
        }
        for p in registry.plugins
    ]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="hwlaunch")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Decide how to start accelerator workers, explain why, and run them."""
    ctx.obj = {"debug": debug}


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--verbose", "-v", is_flag=True, help="Also list each plugin's module and hooks.")
def backends(as_json: bool, verbose: bool) -> None:
    """List the registered backends, their rules and probes, and plugins that failed."""
    registry = default_registry()
    rows = backend_rows(registry)
    if as_json:
        payload: Any = (
            {
                "backends": rows,
                "plugins": plugin_rows(registry),
                "hook_order": registry.hook_order(),
                "contract": CONTRACT_VERSION,
            }
            if verbose
            else rows
        )
        click.echo(json.dumps(payload, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    table = Table(title="hwlaunch backends", title_justify="left")
    for column in (
        "backend",
        "plugin",
        "available",
        "devices",
        "start methods",
        "comm",
        "visibility var",
        "binding",
        "ray",
        "error",
    ):
        table.add_column(column, overflow="fold")
    for row in rows:
        methods = row["start_methods"]
        table.add_row(
            row["name"] or "-",
            f"{row['plugin']} ({row['distribution']} {row['version']})",
            "yes" if row["available"] else "no",
            str(row["device_count"]),
            "-"
            if methods is None
            else " ".join(f"[{m}]" if m == methods["default"] else m for m in methods["allowed"]),
            row["dist_backend"] or "-",
            row["device_control_env_var"] or "-",
            row["device_binding"] or "-",
            row["ray_resource"] or "-",
            row["error"] or "",
        )
    console.print(table, markup=False)
    console.print("[default start method in brackets]", markup=False)
    if verbose:
        for p in plugin_rows(registry):
            console.print(
                f"plugin {p['name']}: module {p['module']}, {p['distribution']} {p['version']}, "
                f"contract {p['contract']}, hooks: {', '.join(p['hooks']) or '-'}, "
                f"backends: {', '.join(p['backends']) or '-'}"
                + "".join(f", WARNING: {w}" for w in p["warnings"])
                + (f", FAILED: {p['error']}" if p["error"] else ""),
                markup=False,
                soft_wrap=True,
            )
        console.print(f"plugin contract {CONTRACT_VERSION}; hook order (first called first):")
        for hook, names in registry.hook_order().items():
            console.print(f"  {hook}: {', '.join(names) or '-'}", markup=False)
    for skipped in registry.skipped:
        console.print(f"skipped plugin {skipped}", markup=False)


@cli.command()
@click.option("--world-size", "-n", metavar="N", help="Number of workers.")
@plan_options
def resolve(
    as_json: bool, config_file: str | None, assume: tuple[str, ...], **flags: str | None
) -> None:
    """Show the plan (backend, executor, start method...) and the reason for each value."""
    from hwlaunch.resolver import resolve_with_sources

    plan = resolve_with_sources(
        flags,
        CLI_SOURCES,
        config=config_file,
        config_source="--config",
        assume=assume,
        assume_source="--assume",
    )
    if as_json:
        click.echo(json.dumps(plan.to_dict(), indent=2))
    else:
        click.echo(plan.explain(width=shutil.get_terminal_size((120, 24)).columns), nl=False)


cli.add_command(run)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI and turn user errors into exit code 2 without a traceback."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        cli.main(args=args, prog_name="hwlaunch", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return int(exc.exit_code)
    except HwlaunchError as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"hwlaunch: error: {exc}", err=True)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
