"""The plugin contract: one hook, ``hwlaunch_register_backends``.

A plugin is a module (or object) exposed through the entry-point group ``hwlaunch.backends``
that implements the hook below with ``@hwlaunch.hookimpl``.
"""

from __future__ import annotations

from typing import Protocol

import pluggy

from hwlaunch.spec import BackendSpec

PROJECT_NAME = "hwlaunch"
ENTRY_POINT_GROUP = "hwlaunch.backends"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


class Register(Protocol):
    """What a plugin receives: call it once with each BackendSpec the plugin provides."""

    def __call__(self, spec: BackendSpec) -> None: ...


@hookspec
def hwlaunch_register_backends(register: Register) -> None:
    """Register the plugin's backends by calling ``register(BackendSpec(...))`` for each.

    Keep it cheap: no device initialization and no vendor imports here. The registry calls
    each plugin's hook in isolation, so an exception fails only that plugin.
    """
