"""hwlaunch: decide how to start accelerator workers, explain why, and drive them safely.

``import hwlaunch`` stays cheap (no torch, no Ray): executors and workers load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hwlaunch.errors import (
    BackendUnavailableError,
    ConfigError,
    HwlaunchError,
    MissingMainGuardError,
    PluginError,
    RpcTimeoutError,
    StartMethodError,
    WorkerDiedError,
    WorkerError,
    WorkerStartupError,
)
from hwlaunch.hookspecs import Register, hookimpl
from hwlaunch.plan import Decision, Plan
from hwlaunch.resolver import resolve
from hwlaunch.spec import START_METHODS, BackendSpec, StartMethodRule

if TYPE_CHECKING:
    from hwlaunch.executor import Executor
    from hwlaunch.launcher import launch
    from hwlaunch.worker import Worker

__version__ = "0.1.0"

_LAZY = {
    "launch": "hwlaunch.launcher",
    "Executor": "hwlaunch.executor",
    "Worker": "hwlaunch.worker",
}

__all__ = [
    "START_METHODS",
    "BackendSpec",
    "BackendUnavailableError",
    "ConfigError",
    "Decision",
    "Executor",
    "HwlaunchError",
    "MissingMainGuardError",
    "Plan",
    "PluginError",
    "Register",
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


def __getattr__(name: str) -> Any:
    """Load the executor side of the API on first use, keeping ``import hwlaunch`` light."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hwlaunch' has no attribute {name!r}")
