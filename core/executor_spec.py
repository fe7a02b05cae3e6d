"""ExecutorSpec: what a plugin declares about an executor (a way to start and drive workers).

Like BackendSpec, it is data: the resolver reads the limits below to check a plan, and the
class is imported only when a plan with this executor is launched, so listing executors or
resolving never imports an executor's dependencies (Ray, a vendor's launcher).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hwlaunch.errors import PluginError

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _fail(field_name: str, problem: str) -> PluginError:
    return PluginError(f"invalid ExecutorSpec field {field_name!r}: {problem}")


@dataclass(frozen=True)
class ExecutorSpec:
    """An executor as a plugin declares it.

    ``executor`` is an import path ``"package.module:ClassName"`` of a subclass of
    ``hwlaunch.Executor``, constructed as ``Class(plan, worker_extension, *,
    init_distributed, startup_timeout, on_status)``. ``max_world_size`` and ``max_nodes`` are
    what it can run (None: no limit); ``start_method`` says it starts local processes with the
    plan's multiprocessing start method, so the start-method rules (main guard, fork safety,
    daemonic parent) apply; ``needs_launcher`` says it adopts ranks that torchrun, srun or
    mpirun started, so the resolver takes sizes from the launcher.
    """

    name: str
    executor: str
    description: str = ""
    max_world_size: int | None = None
    max_nodes: int | None = None
    start_method: bool = False
    needs_launcher: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise _fail(
                "name",
                f"{self.name!r} must be a lowercase identifier like 'mp' or 'acme-sub' "
                "(letters, digits, '-', '_'; starting with a letter)",
            )
        if not isinstance(self.executor, str) or not _IMPORT_PATH.match(self.executor):
            raise _fail(
                "executor", f"{self.executor!r} must be an import path 'package.module:Class'"
            )
        if not isinstance(self.description, str):
            raise _fail("description", f"{self.description!r} must be a string")
        for limit in ("max_world_size", "max_nodes"):
            value = getattr(self, limit)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise _fail(limit, f"{value!r} must be None (no limit) or an int >= 1")
        for flag in ("start_method", "needs_launcher"):
            if not isinstance(getattr(self, flag), bool):
                raise _fail(flag, f"{getattr(self, flag)!r} must be a bool")
