"""The plugin contract: two hooks, ``hwlaunch_register_backends`` and
``hwlaunch_register_executors``.

A plugin is a module (or object) exposed through the entry-point group ``hwlaunch.backends``
that implements one or both hooks below with ``@hwlaunch.hookimpl``.
"""

from __future__ import annotations

from typing import Protocol

import pluggy

from hwlaunch.executor_spec import ExecutorSpec
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


class RegisterExecutor(Protocol):
    """What a plugin receives: call it once with each ExecutorSpec the plugin provides."""

    def __call__(self, spec: ExecutorSpec) -> None: ...


@hookspec
def hwlaunch_register_executors(register: RegisterExecutor) -> None:
    """Register the plugin's executors by calling ``register(ExecutorSpec(...))`` for each.

    The built-in uni, mp, ray and external executors come through this hook too. Keep it
    cheap: the executor class is imported only when a plan that names it is launched.
    """
