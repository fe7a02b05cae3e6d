"""``hwlaunch backends`` and ``hwlaunch resolve``: what is registered, and the plan with reasons."""

from __future__ import annotations

import json
import shutil
import sys
from typing import Any

import click

from hwlaunch._cells import Cell
from hwlaunch.cli._options import setting_options
from hwlaunch.contract import CONTRACT_VERSION
from hwlaunch.executor_spec import CAPABILITIES
from hwlaunch.planning import settings
from hwlaunch.planning.facts import probe_device
from hwlaunch.planning.registry import Registry, default_registry


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
            "executors": list(p.executors),
            "contract": p.contract,
            "warnings": list(p.warnings),
            "error": p.error,
        }
        for p in registry.plugins
    ]


def executor_rows(registry: Registry) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "plugin": entry.plugin.name,
            "distribution": entry.plugin.distribution,
            "version": entry.plugin.version,
            "executor": entry.spec.executor,
            "description": entry.spec.description,
            "max_world_size": entry.spec.max_world_size,
            "max_nodes": entry.spec.max_nodes,
            **{flag: getattr(entry.spec, flag) for flag in CAPABILITIES},
        }
        for name, entry in registry.executors.items()
    ]


def _print_executors(console: Any, registry: Registry) -> None:
    """The executors table: each with its plugin, class and limits."""
    from rich.table import Table

    executors = Table(title="hwlaunch executors", title_justify="left")
    for column in ("executor", "plugin", "class", "limits and capabilities", "description"):
        executors.add_column(column, overflow="fold")
    for e in executor_rows(registry):
        limits = [
            f"max {e['max_world_size']} worker(s)" if e["max_world_size"] else "",
            f"max {e['max_nodes']} node(s)" if e["max_nodes"] else "",
            *(label for flag, label in CAPABILITIES.items() if e[flag]),
        ]
        cells = (
            e["name"],
            f"{e['plugin']} ({e['distribution']} {e['version']})",
            e["executor"],
            ", ".join(x for x in limits if x) or "-",
            e["description"],
        )
        executors.add_row(*(Cell(cell) for cell in cells))
    console.print(executors, markup=False)


def _print_plugins(console: Any, registry: Registry) -> None:
    """Each plugin's module, distribution, contract and hooks, then the order of each hook."""
    for p in plugin_rows(registry):
        console.print(
            f"plugin {p['name']}: module {p['module']}, {p['distribution']} {p['version']}, "
            f"contract {p['contract']}, hooks: {', '.join(p['hooks']) or '-'}, "
            f"backends: {', '.join(p['backends']) or '-'}, "
            f"executors: {', '.join(p['executors']) or '-'}"
            + "".join(f", WARNING: {w}" for w in p["warnings"])
            + (f", FAILED: {p['error']}" if p["error"] else ""),
            markup=False,
            soft_wrap=True,
        )
    console.print(f"plugin contract {CONTRACT_VERSION}; hook order (first called first):")
    for hook, names in registry.hook_order().items():
        console.print(f"  {hook}: {', '.join(names) or '-'}", markup=False)


def _print_backends(console: Any, rows: list[dict[str, Any]]) -> None:
    """The backends table: one row per backend and per failed plugin."""
    from rich.table import Table

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
        cells = (
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
        table.add_row(*(Cell(cell) for cell in cells))
    console.print(table, markup=False)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--verbose", "-v", is_flag=True, help="Also list the executors, and each plugin's hooks."
)
def backends(as_json: bool, verbose: bool) -> None:
    """List the registered backends, their rules and probes, and plugins that failed."""
    registry = default_registry()
    rows = backend_rows(registry)
    if as_json:
        for warning in registry.selection_warnings:
            click.echo(f"warning: {warning}", err=True)
        payload: Any = (
            {
                "backends": rows,
                "executors": executor_rows(registry),
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

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    _print_backends(console, rows)
    console.print("[default start method in brackets]", markup=False)
    if verbose:
        _print_executors(console, registry)
        _print_plugins(console, registry)
    for skipped in registry.skipped:
        console.print(f"skipped plugin {skipped}", markup=False)
    for warning in registry.selection_warnings:
        console.print(f"warning: {warning}", markup=False, soft_wrap=True)


@click.command()
@setting_options()
@click.option(
    "--assume",
    multiple=True,
    metavar="KEY=VALUE",
    help="Assume a runtime fact, e.g. cuda.initialized=true (repeatable).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def resolve(
    as_json: bool, config_file: str | None, assume: tuple[str, ...], **flags: str | None
) -> None:
    """Show the plan (backend, executor, start method...) and the reason for each value."""
    from hwlaunch.planning.resolver import resolve_with_sources

    plan = resolve_with_sources(
        flags,
        settings.sources("cli"),
        config=config_file,
        config_source="--config",
        assume=assume,
        assume_source="--assume",
    )
    if as_json:
        click.echo(json.dumps(plan.to_dict(), indent=2))
    else:
        click.echo(plan.explain(width=shutil.get_terminal_size((120, 24)).columns), nl=False)
