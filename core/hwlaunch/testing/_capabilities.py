"""Which worker checks an executor gets, read from the capabilities its ExecutorSpec declares.

The conformance suites never compare an executor's name: a vendor's executor that declares what
a built-in declares gets the checks the built-in gets, and one that declares something it does
not do fails them (docs/writing-a-backend-plugin.md, "What the capabilities promise"). Each
function below reads one promise:

- ``start_method``: the lifecycle runs once per start method the backend allows;
- ``in_process``: one worker, in this process (no check that the ranks have processes of their
  own);
- ``ray``: the lifecycle runs on a real two-node Ray cluster, Ray's opt-out of its visibility
  rewrite is set in every actor, and the visibility variable is Ray's to set;
- ``needs_launcher``: never started by the suites, it runs only under its launcher;
- any other executor starts the ranks itself, one process each, and hwlaunch's
  ``worker_environment`` sets the binding's visibility variable in them.

This module imports pytest; ``import hwlaunch`` never imports it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import pytest

from hwlaunch.executor_spec import ExecutorSpec
from hwlaunch.spec import START_METHODS, BackendSpec

__all__ = [
    "lifecycle_cases",
    "local_rank_of",
    "own_processes",
    "ray_cases",
    "sets_binding",
    "two_node_cluster",
    "world_size_for",
]


def lifecycle_cases(
    names: Iterable[str], specs: Mapping[str, ExecutorSpec], owner: str
) -> list[Any]:
    """The (executor, start method) cases of the local lifecycle check: each start method for
    an executor that declares ``start_method``, else one case without; an executor that places
    its workers with Ray runs on the two-node cluster instead, one that adopts a launcher's
    ranks only under that launcher. An unregistered name is a case that fails with the names
    that are registered."""
    cases: list[Any] = []
    # In-process executors last: their worker may initialize the device in this process and
    # make fork unsafe for whatever follows.
    for name in sorted(names, key=lambda n: getattr(specs.get(n), "in_process", False)):
        spec = specs.get(name)
        if spec is None:
            cases.append(pytest.param(name, None, id=name))
        elif spec.ray or spec.needs_launcher:
            continue
        elif spec.start_method:
            cases += [pytest.param(name, m, id=f"{name}-{m}") for m in START_METHODS]
        else:
            cases.append(pytest.param(name, None, id=name))
    return cases or [_none(owner, "starts workers without Ray or a launcher", None, None)]


def ray_cases(names: Iterable[str], specs: Mapping[str, ExecutorSpec], owner: str) -> list[Any]:
    """The executors, among ``names``, that declare ``ray``: one two-node case each."""
    cases = [pytest.param(n, id=n) for n in names if (s := specs.get(n)) is not None and s.ray]
    return cases or [_none(owner, "declares ray", None)]


def _none(owner: str, what: str, *values: None) -> Any:
    reason = f"no executor in {owner}.executors {what}"
    return pytest.param(*values, id="none", marks=pytest.mark.skip(reason=reason))


def world_size_for(executor: ExecutorSpec, backend: BackendSpec, device_count: int) -> int:
    """Two workers, or fewer where the executor's ``max_world_size`` or (for an accelerator,
    one device per worker) the devices say so."""
    world = min(2, executor.max_world_size or 2)
    return min(world, device_count) if backend.is_accelerator else world


def own_processes(executor: ExecutorSpec) -> bool:
    """Whether every rank runs in a process of its own, not this one (all but ``in_process``)."""
    return not executor.in_process


def sets_binding(executor: ExecutorSpec) -> bool:
    """Whether hwlaunch sets the binding's visibility variable in the workers: in every process
    the executor starts itself; an in-process worker keeps this process's environment, and Ray
    sets the variable in its actors (``ray_noset_visibility_var`` opts out of that)."""
    return own_processes(executor) and not executor.ray


def local_rank_of(rank: int, world: int, nnodes: int) -> int | None:
    """A rank's index among the ranks of its node, which are contiguous (as under torchrun);
    None where the ranks do not divide evenly among the nodes (any placement is allowed)."""
    if world % nnodes:
        return None
    return rank % (world // nnodes)


@contextlib.contextmanager
def two_node_cluster(spec: BackendSpec) -> Iterator[str]:
    """A real Ray cluster of two nodes on 127.0.0.1, one slot of the backend's Ray resource
    each; yields its address and shuts it down (this process's Ray client first)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before Ray is imported
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    node: dict[str, Any] = {
        "num_cpus": 1,
        "object_store_memory": 100 * 1024**2,
        "node_ip_address": "127.0.0.1",
    }
    if spec.ray_resource == "GPU":
        node["num_gpus"] = 1
    elif spec.ray_resource != "CPU":
        node["resources"] = {spec.ray_resource: 1}
    cluster = cluster_utils.Cluster(
        initialize_head=True, head_node_args={**node, "include_dashboard": False}
    )
    try:
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        yield str(cluster.address)
    finally:
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()  # Ray refuses to remove a node this process is connected to
        cluster.shutdown()
