"""Which entry points of the plugin group this process loads: the one place that reads the
allow and block lists, used by the registry (in the parent) and by worker setup (in each worker)
so that both see the same plugins."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points

from hwlaunch._checks import did_you_mean

ENTRY_POINT_GROUP = "hwlaunch.backends"
OWN_DISTRIBUTION = "hwlaunch"
ENV_ALLOW = "HWLAUNCH_PLUGINS"
ENV_BLOCK = "HWLAUNCH_DISABLE_PLUGINS"
ENV_STRICT = "HWLAUNCH_STRICT_PLUGINS"
PLUGIN_VARIABLES = (ENV_ALLOW, ENV_BLOCK, ENV_STRICT)  # every variable of plugin selection


def _split_env(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def distribution_of(ep: EntryPoint) -> str | None:
    return ep.dist.name if ep.dist is not None else None


def _load_order(ep: EntryPoint) -> tuple[int, str]:
    """Built-ins first, then third parties by name: clashes are decided the same every time."""
    return (0 if distribution_of(ep) == OWN_DISTRIBUTION else 1, ep.name)


@dataclass(frozen=True)
class Selection:
    """What the allow and block lists make of the installed plugins: the entry points to load
    (in load order), the variable that excluded each other one, and a warning for each listed
    name that matches no installed plugin (a typo would otherwise drop a plugin silently)."""

    chosen: list[EntryPoint] = field(default_factory=list)
    excluded: dict[str, str] = field(default_factory=dict)
    unmatched: list[str] = field(default_factory=list)


def select_plugins(environ: Mapping[str, str] | None = None) -> Selection:
    """Apply ``HWLAUNCH_PLUGINS`` and ``HWLAUNCH_DISABLE_PLUGINS`` to the group's entry points.
    Built-ins ignore the allow list (it picks third parties); the block list applies to all."""
    env = os.environ if environ is None else environ
    allow = _split_env(env[ENV_ALLOW]) if ENV_ALLOW in env else None
    block = _split_env(env.get(ENV_BLOCK, ""))
    selection = Selection()
    installed = sorted(entry_points(group=ENTRY_POINT_GROUP), key=_load_order)
    for ep in installed:
        builtin = distribution_of(ep) == OWN_DISTRIBUTION
        if ep.name in block or (allow is not None and not builtin and ep.name not in allow):
            selection.excluded[ep.name] = ENV_BLOCK if ep.name in block else ENV_ALLOW
        else:
            selection.chosen.append(ep)
    names = sorted({ep.name for ep in installed})
    for variable, listed in ((ENV_ALLOW, allow or []), (ENV_BLOCK, block)):
        for name in dict.fromkeys(listed):
            if name not in names:
                selection.unmatched.append(
                    f"{variable} names {name!r}, which matches no installed plugin"
                    f"{did_you_mean(name, names)} (installed: {', '.join(names) or 'none'})"
                )
    return selection


def selected_entry_points(
    environ: Mapping[str, str] | None = None,
) -> tuple[list[EntryPoint], list[str]]:
    """The group's entry points in load order, without those the lists exclude, and a line for
    each excluded one."""
    selection = select_plugins(environ)
    skipped = [f"{name} (excluded by {why})" for name, why in selection.excluded.items()]
    return selection.chosen, skipped
