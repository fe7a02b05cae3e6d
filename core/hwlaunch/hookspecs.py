"""The plugin contract's hooks (contract ``hwlaunch.CONTRACT_VERSION``).

A plugin is a module (or object) exposed through the entry-point group ``hwlaunch.backends``
that implements any of the hooks below with ``@hwlaunch.hookimpl``. Every hook is optional; a
plugin implements at least one. Order between plugins follows pluggy: ``tryfirst=True`` runs
first, ``trylast=True`` last, the rest in reverse order of loading (``hwlaunch backends
--verbose`` shows it).

Deprecation: a hook that a later major contract removes is declared with
:func:`deprecated_hookspec`, so that pluggy warns (``warn_on_impl``) where a plugin implements it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pluggy

from hwlaunch.contract import HwlaunchDeprecationWarning
from hwlaunch.executor_spec import ExecutorSpec
from hwlaunch.spec import BackendSpec

if TYPE_CHECKING:
    from hwlaunch.draft import PlanDraft
    from hwlaunch.worker import Worker

PROJECT_NAME = "hwlaunch"
ENTRY_POINT_GROUP = "hwlaunch.backends"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


def deprecated_hookspec(why: str, since: str, removal: str) -> Any:
    """``@hookspec`` for a hook that is deprecated since contract ``since`` and removed in
    ``removal``; pluggy warns at registration of every plugin that implements it."""
    return hookspec(
        warn_on_impl=HwlaunchDeprecationWarning(
            f"deprecated since plugin contract {since}, removed in {removal}: {why}"
        )
    )


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


@hookspec
def hwlaunch_adjust_plan(draft: PlanDraft) -> None:
    """Propose plan values with ``draft.propose(setting, value, reason)``; read the rest.

    Called once per resolution, after the rules have decided, by every plugin that implements
    it, the backend's own or a site policy plugin that provides no backend. Settings:
    ``start_method``, ``worker``, ``dist_backend``, ``env`` (a dict merged key by key) and
    ``preload``. ``draft.backend``, ``draft.facts`` and ``draft.decisions`` are read-only. A
    proposal never overrides a value the user set (keyword, flag, ``HWLAUNCH_*``, config file)
    and never breaks the backend's start-method rule: such a proposal is dropped with a warning
    naming the plugin. An accepted one shows in the plan with source ``plugin <name>``. The
    first plugin (in hook order) to propose a setting wins it.
    """


@hookspec
def hwlaunch_worker_setup(worker: Worker) -> None:
    """Prepare each worker process: register ops, models, allocators.

    Runs in every worker (mp under each start method, Ray actors on every node, the uni
    executor's worker thread) after the worker's environment is set and before
    ``worker.init_device()``. The plugin is loaded in the worker through the same entry point
    and ``HWLAUNCH_PLUGINS`` / ``HWLAUNCH_DISABLE_PLUGINS`` lists as in the parent. An exception
    fails the worker's start-up with a WorkerStartupError naming the plugin.
    """
