"""hwlaunch: decide how to start accelerator workers, explain why, and drive them safely.

``import hwlaunch`` stays cheap (no torch, no Ray, not even pluggy or the resolver): only the
error classes load with the package; everything else loads on first use, so a program that
imports hwlaunch (or a worker process that unpickles one of its functions) pays for what it uses.
"""

from __future__ import annotations

from hwlaunch.errors import (
    BackendUnavailableError,
    ConfigError,
    ExecutorClosedError,
    HwlaunchError,
    MissingMainGuardError,
    NotPicklableError,
    PluginError,
    ReplyDecodeError,
    RpcTimeoutError,
    StartMethodError,
    WorkerDiedError,
    WorkerError,
    WorkerStartupError,
)

# Not ``from typing import TYPE_CHECKING``: typing alone costs more to import than the rest of
# this module, and mypy takes any name TYPE_CHECKING to be true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from hwlaunch.contract import CONTRACT_VERSION
    from hwlaunch.draft import PlanDraft
    from hwlaunch.executor import Executor
    from hwlaunch.executor.launcher import launch
    from hwlaunch.executor_spec import ExecutorSpec
    from hwlaunch.hookspecs import Register, RegisterExecutor, hookimpl
    from hwlaunch.plan import Decision, Plan
    from hwlaunch.planning.resolver import resolve
    from hwlaunch.spec import START_METHODS, BackendSpec, StartMethodRule
    from hwlaunch.worker import Worker

__version__ = "0.1.0"

_LAZY = {
    "CONTRACT_VERSION": "hwlaunch.contract",
    "PlanDraft": "hwlaunch.draft",
    "START_METHODS": "hwlaunch.spec",
    "BackendSpec": "hwlaunch.spec",
    "StartMethodRule": "hwlaunch.spec",
    "Register": "hwlaunch.hookspecs",
    "RegisterExecutor": "hwlaunch.hookspecs",
    "ExecutorSpec": "hwlaunch.executor_spec",
    "hookimpl": "hwlaunch.hookspecs",
    "Decision": "hwlaunch.plan",
    "Plan": "hwlaunch.plan",
    "resolve": "hwlaunch.planning.resolver",
    "launch": "hwlaunch.executor.launcher",
    "Executor": "hwlaunch.executor",
    "Worker": "hwlaunch.worker",
}

__all__ = [
    "CONTRACT_VERSION",
    "START_METHODS",
    "BackendSpec",
    "BackendUnavailableError",
    "ConfigError",
    "Decision",
    "Executor",
    "ExecutorClosedError",
    "ExecutorSpec",
    "HwlaunchError",
    "MissingMainGuardError",
    "NotPicklableError",
    "Plan",
    "PlanDraft",
    "PluginError",
    "Register",
    "RegisterExecutor",
    "ReplyDecodeError",
    "RpcTimeoutError",
    "StartMethodError",
    "StartMethodRule",
    "Worker",
    "WorkerDiedError",
    "WorkerError",
    "WorkerStartupError",
    "hookimpl",
    "launch",
    "resolve",
]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def __getattr__(name: str) -> Any:
    """Load the rest of the API on first use, keeping ``import hwlaunch`` light."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hwlaunch' has no attribute {name!r}")
