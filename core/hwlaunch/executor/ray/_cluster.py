"""The connection to Ray: import it, join or start a cluster, and end only what hwlaunch made.

hwlaunch joins the cluster named by ``ray_address``, else the Ray instance this process is
already connected to, else it starts a private local instance bound to 127.0.0.1. It ends only
a connection it made itself: ``ray.shutdown()`` on a connection to an existing cluster
disconnects this driver and leaves the cluster running, and the local instance hwlaunch started
goes away with its last executor.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import threading
from typing import Any

from hwlaunch.errors import BackendUnavailableError
from hwlaunch.plan import Plan

__all__ = [
    "LOOPBACK_VAR",
    "connect",
    "import_ray",
    "node_address",
    "probe_address",
    "release",
    "setting_source",
]

LOOPBACK_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def import_ray(*, loopback: bool = False) -> Any:
    """The ``ray`` module, or an error that says how to install it.

    With ``loopback`` (hwlaunch may start a private local instance), ``LOOPBACK_VAR=0`` is set
    unless the user set it: Ray reads it once, at import, and without it replaces a node address
    of 127.0.0.1 by the machine's routable one, exposing the instance on the network.
    """
    if loopback and "ray" not in sys.modules:
        os.environ.setdefault(LOOPBACK_VAR, "0")
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise BackendUnavailableError(
            f"the ray executor needs Ray, which cannot be imported here ({exc}). "
            "Fix: pip install 'hwlaunch[ray]', or use executor 'mp' for one node"
        ) from None


# -- the connection to Ray ---------------------------------------------------------------
_connection_lock = threading.Lock()
_connection_users = 0  # live executors on the connection hwlaunch made (0: none made)
_connection_job: str | None = None  # that connection's job id, to recognise it


def setting_source(plan: Plan, setting: str, default: str) -> str:
    try:
        return plan.decision(setting).source
    except KeyError:
        return default


def probe_address(address: str, timeout: float = 10.0) -> None:
    """Fail fast on an address nothing listens at: ``ray.init`` would retry it for minutes."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", or a form Ray resolves itself
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
        pass


def connect(ray: Any, plan: Plan, warnings: list[str]) -> bool:
    """Join the plan's cluster; True when hwlaunch made the connection and must end it."""
    global _connection_users, _connection_job
    with _connection_lock:
        if ray.is_initialized():
            context = ray.get_runtime_context()
            current = context.gcs_address
            if plan.ray_address not in (None, "auto", current):
                warnings.append(
                    f"ray_address {plan.ray_address!r} is not used: this process is already "
                    f"connected to the Ray cluster at {current}"
                )
            if _connection_users and context.get_job_id() == _connection_job:
                _connection_users += 1
                return True
            return False
        if plan.ray_address:
            kwargs: dict[str, Any] = {"address": plan.ray_address}
        else:
            # "local" starts a new instance even when `ray start` runs on this machine; it is
            # private to this job, so it listens on the loopback interface only.
            kwargs = {
                "address": "local",
                "include_dashboard": False,
                "_node_ip_address": "127.0.0.1",
            }
            if os.environ.get(LOOPBACK_VAR) != "0":
                warnings.append(
                    f"the local Ray instance may bind to this machine's network address: Ray "
                    f"was imported before hwlaunch could set {LOOPBACK_VAR}=0. Set it before "
                    "importing ray to keep the instance on 127.0.0.1"
                )
        try:
            if plan.ray_address:
                probe_address(plan.ray_address)
            ray.init(**kwargs)
        except Exception as exc:
            if plan.ray_address:
                source = setting_source(plan, "ray_address", "ray_address")
                raise BackendUnavailableError(
                    f"cannot connect to the Ray cluster at {plan.ray_address!r} (from {source}): "
                    f"{type(exc).__name__}: {exc}. Fix: check that the cluster is up and "
                    f"reachable (`ray status --address {plan.ray_address}`), or unset "
                    "ray_address to start a local Ray instance"
                ) from exc
            raise BackendUnavailableError(
                f"cannot start a local Ray instance: {type(exc).__name__}: {exc}"
            ) from exc
        _connection_users = 1
        _connection_job = ray.get_runtime_context().get_job_id()
        return True


def release(ray: Any) -> None:
    """One executor less on hwlaunch's connection; the last one ends it."""
    global _connection_users, _connection_job
    with _connection_lock:
        _connection_users = max(_connection_users - 1, 0)
        if _connection_users == 0:
            _connection_job = None
            if ray.is_initialized():
                ray.shutdown()


def node_address(ray: Any) -> str:
    """The address this process's Ray node was started with (127.0.0.1 for hwlaunch's local
    instance), not get_node_ip_address(), which answers with the machine's routable one."""
    node_id = ray.get_runtime_context().get_node_id()
    address = next(
        (n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id),
        ray.util.get_node_ip_address(),
    )
    return str(address)
