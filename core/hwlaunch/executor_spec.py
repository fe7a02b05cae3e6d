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


# The capabilities an executor declares, each read by the rules instead of the executor's name,
# with what ``hwlaunch backends --verbose`` shows for it.
CAPABILITIES = {
    "start_method": "start method",
    "needs_launcher": "adopts a launcher's ranks",
    "in_process": "in-process",
    "restarts": "restarts groups",
    "rpc_channel": "rpc channel",
    "ray": "Ray settings",
}


@dataclass(frozen=True)
class ExecutorSpec:
    """An executor as a plugin declares it: limits and capabilities, as data.

    ``executor`` is an import path ``"package.module:ClassName"`` of a subclass of
    ``hwlaunch.Executor``, constructed as ``Class(plan, worker_extension, *,
    init_distributed, startup_timeout, on_status)``. ``max_world_size`` and ``max_nodes`` are
    what it can run (None: no limit). The capabilities (what the rules give it; a vendor's
    executor gets what a built-in with the same capabilities gets):

    - ``start_method``: it starts local processes with the plan's multiprocessing start
      method, so the start-method rules (main guard, fork safety, daemonic parent) apply and
      plugins may propose a method;
    - ``needs_launcher``: it adopts the ranks that torchrun, srun or mpirun started; the
      resolver takes sizes from the launcher, and each worker its rank, rendezvous and device
      from the launcher's variables (``plan.ranks_from_launcher``);
    - ``in_process``: the worker runs in this process (no restart can replace it);
    - ``restarts``: a failed worker group can be replaced (``max_restarts``); the class
      implements ``watch_deaths`` and ``stop_group``;
    - ``rpc_channel``: it carries calls as the ``rpc_channel`` and ``rpc_spin`` settings say;
    - ``ray``: it places workers with Ray, reading ``ray_address``, ``ray_pg_timeout`` and the
      backend's ``ray_noset_visibility_var``.
    """

    name: str
    executor: str
    description: str = ""
    max_world_size: int | None = None
    max_nodes: int | None = None
    start_method: bool = False
    needs_launcher: bool = False
    in_process: bool = False
    restarts: bool = False
    rpc_channel: bool = False
    ray: bool = False

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
        for flag in CAPABILITIES:
            if not isinstance(getattr(self, flag), bool):
                raise _fail(flag, f"{getattr(self, flag)!r} must be a bool")
        if self.restarts and self.in_process:
            raise _fail(
                "restarts", "an in_process executor cannot restart: its worker is this process"
            )
