"""launch(): resolve (unless given a plan), then start the plan's executor."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

from hwlaunch.errors import PluginError
from hwlaunch.executor._preflight import check_extension_path, refuse_imagined_machine
from hwlaunch.executor.base import Executor, StatusCallback
from hwlaunch.executor_spec import ExecutorSpec
from hwlaunch.plan import Plan


def launch(
    plan: Plan | None = None,
    *,
    worker_extension: type | str | None = None,
    init_distributed: bool = True,
    startup_timeout: float | None = None,
    on_status: StatusCallback | None = None,
    **resolve_keywords: Any,
) -> Executor:
    """Start ``plan.world_size`` workers and return their executor (a context manager).

    Without a plan, ``resolve_keywords`` are ``resolve()``'s keywords, and the warnings of the plan
    (a fallback from fork, a module-level launch without a main guard) and of the executor (a
    ``ray_address`` unused, this process being connected to another cluster) are issued as
    ``UserWarning`` pointing at the caller's line. A caller that passes a plan has seen it: the warnings stay in
    ``plan.warnings`` and ``executor.warnings``, for it to show. ``worker_extension`` (a class,
    or ``"package.module:ClassName"``) is mixed into the backend's worker class, so its methods
    can be called by name through ``collective_rpc``; a path is checked here first (the
    module found, the class in its source), without running it.

    A plan made with assumed facts that this machine lacks (a device, a start method, a
    launcher) is refused before any process starts: it describes another machine.
    """
    resolved_here = plan is None
    if plan is None:
        from hwlaunch.planning.resolver import resolve

        plan = resolve(**resolve_keywords)
        for text in plan.warnings:
            warnings.warn(f"hwlaunch: {text}", UserWarning, stacklevel=2)
    elif not isinstance(plan, Plan):
        raise TypeError(_not_a_plan(plan))
    elif resolve_keywords:
        raise TypeError(
            f"launch() got a plan and resolve() keywords {sorted(resolve_keywords)}; pass one or the other"
        )
    refuse_imagined_machine(plan)
    check_extension_path(worker_extension)
    executor = _start(plan, worker_extension, init_distributed, startup_timeout, on_status)
    if plan.facts is not None:
        from hwlaunch.planning.mainguard import note_launch

        guard = plan.facts.main_guard
        note_launch(guard)  # a later launch's spawned children re-run this one
        if guard.status == "unguarded" and guard.file:
            from hwlaunch.executor._mainprep import refuse_reimport

            refuse_reimport(guard.where() or guard.file)
    if resolved_here:
        for text in getattr(executor, "warnings", ()):
            warnings.warn(f"hwlaunch: {text}", UserWarning, stacklevel=2)
    return executor


def _not_a_plan(given: object) -> str:
    """What launch()'s first argument takes, for a caller who gave something else."""
    text = (
        f"launch() takes a Plan from hwlaunch.resolve() as its first argument (or no argument "
        f"and resolve()'s keywords), got the {type(given).__name__} {given!r}"
    )
    if isinstance(given, str | os.PathLike):
        return text + (
            ": a plan is not read from a file (the JSON of `hwlaunch resolve --json` is a "
            "record of a decision, not an input). Pass the settings as keywords, "
            "launch(backend=..., world_size=...), or a TOML config file of them, "
            "launch(config='hwlaunch.toml')"
        )
    if isinstance(given, Mapping):
        return text + ": pass settings as keywords, launch(**settings)"
    return text + ": pass a Plan, or resolve()'s keywords"


def _start(
    plan: Plan,
    worker_extension: type | str | None,
    init_distributed: bool,
    startup_timeout: float | None,
    on_status: StatusCallback | None,
) -> Executor:
    """The plan's executor, found by name among the registered ones; wrapped in the restart
    controller when the plan restarts groups and the executor declares that it can."""
    spec, cls = registered_executor(plan.executor)

    def start(group_plan: Plan) -> Executor:
        return cls(
            group_plan,
            worker_extension,
            init_distributed=init_distributed,
            startup_timeout=startup_timeout,
            on_status=on_status,
        ).start()

    if plan.max_restarts > 0 and spec.restarts:
        from hwlaunch.executor.restart import RestartingExecutor

        return RestartingExecutor(plan, start).start()
    return start(plan)


def registered_executor(name: str) -> tuple[ExecutorSpec, type[Executor]]:
    """The spec an executor plugin registered under ``name``, and its class, imported now.

    An executor whose class cannot be imported, or is no ``hwlaunch.Executor``, fails with a
    PluginError naming the executor, its plugin and the import path, never a bare ImportError.
    """
    from hwlaunch._checks import unknown_name_message
    from hwlaunch.executor._runtime import import_object
    from hwlaunch.planning.registry import default_registry

    registry = default_registry()
    entry = registry.executors.get(name)
    if entry is None:
        failed = "; ".join(f"{p.describe()} failed to load: {p.error}" for p in registry.failures)
        raise PluginError(
            f"{unknown_name_message('executor', name, registry.executors)} in the plan"
            + (f" ({failed})" if failed else "")
        )
    where = f"executor {name!r} of {entry.plugin.describe()} ({entry.spec.executor})"
    try:
        cls = import_object(entry.spec.executor)
    except Exception as exc:
        raise PluginError(
            f"{where} cannot be imported: {type(exc).__name__}: {exc}. Fix: reinstall "
            f"{entry.plugin.distribution or 'the plugin'}, or choose another executor"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Executor)):
        raise PluginError(f"{where} is not a subclass of hwlaunch.Executor")
    return entry.spec, cls
