"""Runs the plugins' ``hwlaunch_worker_setup`` hook inside a worker, before ``init_device``.

The parent's plan names the plugins (``plan.worker_setup``, in hook order); the worker loads just
those, through the same entry-point group and allow/block lists as the parent, so a worker pays
for plugin discovery only when some plugin asks for setup. A plugin the worker cannot load, or
whose hook raises, fails the worker's start-up with a PluginError naming the plugin, which the
executor reports as WorkerStartupError.
"""

from __future__ import annotations

import traceback
from importlib.metadata import EntryPoint
from typing import TYPE_CHECKING

from hwlaunch.errors import PluginError

if TYPE_CHECKING:
    import pluggy

    from hwlaunch._discovery import SlowLoads
    from hwlaunch.worker import Worker

HOOK = "hwlaunch_worker_setup"


def run_worker_setup(worker: Worker) -> None:
    """Call each named plugin's setup hook on ``worker``, in the plan's order."""
    names = worker.plan.worker_setup
    if not names:
        return
    import pluggy

    from hwlaunch import hookspecs
    from hwlaunch._discovery import SlowLoads, selected_entry_points
    from hwlaunch._hooks import call_plugin_hook

    selected, skipped = selected_entry_points()
    found = {ep.name: ep for ep in selected}
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    with SlowLoads() as loads:
        for name in names:
            _register(manager, found.get(name), name, skipped, loads, worker.rank)
    for impl in reversed(getattr(manager.hook, HOOK).get_hookimpls()):
        try:
            call_plugin_hook(manager, HOOK, impl.plugin, worker=worker)
        except Exception as exc:
            dist = found[impl.plugin_name].dist
            where = f" ({dist.name} {dist.version})" if dist is not None else ""
            raise PluginError(
                f"{HOOK} of plugin {impl.plugin_name!r}{where} failed in worker rank "
                f"{worker.rank}: {_line(exc)}"
            ) from exc
        worker.setup_plugins.append(impl.plugin_name)


def _register(
    manager: pluggy.PluginManager,
    ep: EntryPoint | None,
    name: str,
    skipped: list[str],
    loads: SlowLoads,
    rank: int,
) -> None:
    """Load plugin ``name`` in this worker (``loads``: names it if its load is slow)."""
    if ep is None:
        excluded = [s for s in skipped if s.startswith(f"{name} (")]
        why = excluded[0] if excluded else "not installed in the worker's environment"
        raise PluginError(
            f"plugin {name!r} must run {HOOK} in every worker, but this worker cannot load "
            f"it: {why}. Fix: install the plugin's distribution wherever workers run (every "
            "Ray node), with the same HWLAUNCH_PLUGINS / HWLAUNCH_DISABLE_PLUGINS"
        )
    try:
        with loads.loading(ep, f"plugin {name!r} (in worker rank {rank})"):
            manager.register(ep.load(), name=name)
    except Exception as exc:
        raise PluginError(f"plugin {name!r} cannot be loaded in the worker: {_line(exc)}") from exc


def _line(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip().replace("\n", " ")
