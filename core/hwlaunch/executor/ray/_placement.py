"""Placement: where each rank's actor goes, its local rank, and what the cluster lacks.

``world_size`` bundles of one unit of the backend's Ray resource (``CPU``, ``GPU``, ``HPU``...).
With one node (the default) the strategy is PACK, which fills a node before using the next one,
so a world size larger than one node's devices spills over to other nodes. With ``nnodes > 1``
it is STRICT_SPREAD when there is one rank per node (each bundle on its own node, guaranteed)
and SPREAD otherwise (bundles spread as evenly as Ray can; a warning says when the ranks landed
on a number of nodes other than ``nnodes``). Ranks are numbered node by node, so the ranks of
one node are contiguous and ``local_rank`` is the index among them, as under torchrun.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hwlaunch.executor.ray._cluster import setting_source
from hwlaunch.plan import Plan

__all__ = [
    "RankNode",
    "actor_resources",
    "local_ranks",
    "node_visibility",
    "placement_error",
    "placement_strategy",
    "rank_order",
]


@dataclass(frozen=True)
class RankNode:
    """Where one rank runs."""

    rank: int
    local_rank: int
    node_id: str
    node_ip: str
    pid: int


def placement_strategy(plan: Plan) -> str:
    if plan.nnodes <= 1:
        return "PACK"
    return "STRICT_SPREAD" if plan.world_size == plan.nnodes else "SPREAD"


def actor_resources(resource: str) -> dict[str, Any]:
    """What each rank's actor takes from its bundle of ``{resource: 1}``."""
    if resource == "CPU":
        return {"num_cpus": 1}
    if resource == "GPU":
        return {"num_cpus": 0, "num_gpus": 1}
    return {"num_cpus": 0, "resources": {resource: 1}}


def rank_order(bundle_nodes: Mapping[int, str]) -> list[int]:
    """The bundle of each rank: grouped by node (nodes in order of their first bundle)."""
    first: dict[str, int] = {}
    for bundle in sorted(bundle_nodes):
        first.setdefault(bundle_nodes[bundle], bundle)
    return sorted(bundle_nodes, key=lambda b: (first[bundle_nodes[b]], b))


def local_ranks(node_of_rank: Sequence[str]) -> list[tuple[int, int]]:
    """(local rank, local world size) of each rank: its index among the ranks of its node."""
    seen: dict[str, int] = {}
    local = []
    for node in node_of_rank:
        local.append(seen.get(node, 0))
        seen[node] = local[-1] + 1
    return [(lr, seen[node]) for lr, node in zip(local, node_of_rank, strict=True)]


def capacity_error(ray: Any, plan: Plan, source: str) -> str | None:
    """Why the cluster cannot hold the plan's world size at all (fewer of the backend's Ray
    resource in the whole cluster than ranks), or None: checked before the placement group is
    made, so that a world size no cluster of this size can hold is refused at once, without a
    bundle per rank built first or ``ray_pg_timeout`` waited out."""
    res, n = plan.ray_resource, plan.world_size
    total = float(ray.cluster_resources().get(res, 0))
    if total >= n:
        return None
    why, fix = _missing(ray, plan, total)
    return (
        f"Ray cannot place world_size {n} (from {source}) of backend {plan.backend}, "
        f"{{{res!r}: 1}} each: {why}. Fix: {fix} (a cluster that adds nodes on demand must "
        "have them before the launch: start them, or request them with "
        "ray.autoscaler.sdk.request_resources)"
    )


def _missing(ray: Any, plan: Plan, total: float) -> tuple[str, str]:
    """Why and the fix, for a cluster with fewer of the resource than ranks."""
    res, n = plan.ray_resource, plan.world_size
    if total == 0:
        has = ", ".join(
            f"{key} {value:g}"
            for key, value in sorted(ray.cluster_resources().items())
            if not key.startswith("node:") and key not in ("memory", "object_store_memory")
        )
        why = f"the cluster has no {res!r} resource at all (it has {has or 'nothing'})"
        fix = (
            f"start the Ray nodes on machines with {plan.backend} devices, declaring them "
            f"(`ray start --resources '{{\"{res}\": N}}'` when Ray does not detect them), or "
            "choose a backend the cluster has"
        )
        return why, fix
    alive = [node for node in ray.nodes() if node.get("Alive")]
    holding = [node for node in alive if node.get("Resources", {}).get(res, 0) >= 1]
    why = (
        f"the cluster has {total:g} {res} in total on {len(holding)} node(s): "
        f"{n - total:g} {res} missing"
    )
    return why, f"add nodes with {res} to the cluster, or use world_size <= {int(total)}"


def placement_error(ray: Any, plan: Plan, strategy: str) -> str:
    """What was asked, what the cluster has, and how to fix it."""
    res, n = plan.ray_resource, plan.world_size
    total = float(ray.cluster_resources().get(res, 0))
    available = float(ray.available_resources().get(res, 0))
    alive = [node for node in ray.nodes() if node.get("Alive")]
    holding = [node for node in alive if node.get("Resources", {}).get(res, 0) >= 1]
    source = setting_source(plan, "ray_pg_timeout", "HWLAUNCH_RAY_PG_TIMEOUT")
    spread = ", one per node" if strategy == "STRICT_SPREAD" else ""
    head = (
        f"Ray could not place {n} workers of backend {plan.backend} with {{{res!r}: 1}} each "
        f"(strategy {strategy}{spread}) within {plan.ray_pg_timeout:g}s (ray_pg_timeout from "
        f"{source}): "
    )
    if total < n:
        why, fix = _missing(ray, plan, total)
    elif strategy == "STRICT_SPREAD" and len(holding) < n:
        why = f"it needs {n} distinct nodes with {res}, and the cluster has {len(holding)}"
        fix = f"add nodes to the cluster, or use nnodes <= {len(holding)}"
    else:
        why = (
            f"the cluster has {total:g} {res} in total but only {available:g} free now "
            "(other jobs or actors hold the rest)"
        )
        fix = "wait for them to finish, or use a smaller world_size"
    return f"{head}{why}. Fix: {fix}; raise HWLAUNCH_RAY_PG_TIMEOUT if nodes are still joining"


def node_visibility(
    nodes: Sequence[str], device_ids: Sequence[Sequence[str]]
) -> dict[str, str | None]:
    """Each node's device-visibility value: the devices Ray gave its ranks, in local-rank order.

    Ray narrows a GPU actor's ``CUDA_VISIBLE_DEVICES`` to its own device, but workers bind to
    device ``local_rank`` (as under the mp executor), so every rank of a node sees the devices
    of all its ranks, ordered so that index ``local_rank`` is its own. None where Ray reported
    no device ids for a rank (a resource Ray does not manage): the variable is left alone.
    """
    found: dict[str, list[str] | None] = {}
    for node, ids in zip(nodes, device_ids, strict=True):
        if node in found and found[node] is None:
            continue
        found[node] = [*(found.get(node) or []), *ids] if ids else None
    return {node: None if ids is None else ",".join(ids) for node, ids in found.items()}
