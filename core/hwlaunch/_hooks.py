"""Calling one plugin's hooks through pluggy, so that a failure stays that plugin's.

Why not ``manager.hook.<name>(...)``: that runs every plugin's implementation in one call, and an
exception in one would fail the others. pluggy's subset hook caller keeps everything pluggy does
(argument names checked against the spec, tryfirst/trylast order, deprecation warnings) for one
plugin at a time. Used by the registry and the policy step in the parent and by worker setup in
each worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # workers import this module before they need pluggy
    import pluggy

__all__ = ["call_plugin_hook", "wrapper_hooks"]


def call_plugin_hook(
    manager: pluggy.PluginManager, hook: str, plugin: object, **kwargs: Any
) -> None:
    """Call ``plugin``'s implementations of ``hook`` (and no other plugin's) through pluggy."""
    others = [other for other in manager.get_plugins() if other is not plugin]
    manager.subset_hook_caller(hook, remove_plugins=others)(**kwargs)


def wrapper_hooks(manager: pluggy.PluginManager, plugin: object) -> list[str]:
    """Names of ``plugin``'s hooks declared as wrappers (``hookwrapper=True`` or ``wrapper=True``).

    hwlaunch calls each plugin's hooks on their own, so a wrapper would wrap nothing: such a
    plugin is rejected with the fix rather than silently doing nothing.
    """
    return sorted(
        caller.name
        for caller in manager.get_hookcallers(plugin) or []
        for impl in caller.get_hookimpls()
        if impl.plugin is plugin and (impl.hookwrapper or impl.wrapper)
    )
