"""Which entry points of the plugin group this process loads: the one place that reads the
allow and block lists, used by the registry (in the parent) and by worker setup (in each worker)
so that both see the same plugins."""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points

ENTRY_POINT_GROUP = "hwlaunch.backends"
OWN_DISTRIBUTION = "hwlaunch"
ENV_ALLOW = "HWLAUNCH_PLUGINS"
ENV_BLOCK = "HWLAUNCH_DISABLE_PLUGINS"


def _split_env(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def distribution_of(ep: EntryPoint) -> str | None:
    return ep.dist.name if ep.dist is not None else None


def _load_order(ep: EntryPoint) -> tuple[int, str]:
    """Built-ins first, then third parties by name: clashes are decided the same every time."""
    return (0 if distribution_of(ep) == OWN_DISTRIBUTION else 1, ep.name)


def selected_entry_points(
    environ: Mapping[str, str] | None = None,
) -> tuple[list[EntryPoint], list[str]]:
    """The group's entry points in load order, without those the lists exclude, and a line for
    each excluded one. Built-ins ignore the allow list (``HWLAUNCH_PLUGINS`` picks third
    parties); the block list applies to every plugin."""
    env = os.environ if environ is None else environ
    allow = _split_env(env[ENV_ALLOW]) if ENV_ALLOW in env else None
    block = set(_split_env(env.get(ENV_BLOCK, "")))
    chosen: list[EntryPoint] = []
    skipped: list[str] = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=_load_order):
        builtin = distribution_of(ep) == OWN_DISTRIBUTION
        if ep.name in block or (allow is not None and not builtin and ep.name not in allow):
            why = ENV_BLOCK if ep.name in block else ENV_ALLOW
            skipped.append(f"{ep.name} (excluded by {why})")
            continue
        chosen.append(ep)
    return chosen, skipped
