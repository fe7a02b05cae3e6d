"""The ray executor's stacks: where each actor is, read from outside where it can be, else asked.

Why two readers: py-spy (``_outside_stacks``) reaches an actor that holds the GIL in C or is
stopped, but only on this driver's node; the actor's own answer, from its control concurrency
group, reaches every node while the actor's Python still runs. Both run within one deadline.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from hwlaunch.executor._outside_stacks import OutsideReads
from hwlaunch.executor.ray._actor import CONTROL_GROUP
from hwlaunch.executor.ray._placement import RankNode

__all__ = ["actor_stacks"]


def actor_stacks(
    ray: Any, actors: Sequence[Any], nodes: Sequence[RankNode], ranks: list[int], timeout: float
) -> dict[int, str]:
    """py-spy's read of each actor on this driver's node, else the actor's own answer from its
    control concurrency group, both within ``timeout``; a rank neither reached gets a line
    saying why."""
    deadline = time.monotonic() + timeout
    outside = OutsideReads(_local_pids(ray, nodes, ranks))
    refs = {
        actors[rank].stacks.options(concurrency_group=CONTROL_GROUP).remote(): rank
        for rank in ranks
        if rank < len(actors)
    }
    found: dict[int, str] = {}
    with contextlib.suppress(Exception):  # Ray is going away
        _own_stacks(ray, refs, found, outside, deadline)
    outside.wait(deadline)
    outside.close(timeout)
    found.update(outside.found)
    for rank in ranks:
        why = outside.failed.get(rank, "not on this node: py-spy reads local processes only")
        found.setdefault(rank, f"no stack within {timeout:g}s ({why}; the actor did not answer)")
    return dict(sorted(found.items()))


def _own_stacks(
    ray: Any, refs: dict[Any, int], found: dict[int, str], outside: OutsideReads, deadline: float
) -> None:
    """The actors' own answers into ``found``, until each rank has a stack from one reader or
    the other (py-spy's are taken meanwhile), or the deadline."""
    pending = dict(refs)
    while pending and (remaining := deadline - time.monotonic()) > 0:
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=min(remaining, 0.01))
        for ref in ready:
            rank = pending.pop(ref)
            with contextlib.suppress(Exception):  # that actor died
                found[rank] = ray.get(ref)
        outside.wait(time.monotonic())  # what py-spy has finished, without waiting
        if all(rank in outside.found for rank in pending.values()):
            return


def _local_pids(ray: Any, nodes: Sequence[RankNode], ranks: list[int]) -> dict[int, int | None]:
    """The pids of the ranks' actors that run on this driver's node."""
    here = ray.get_runtime_context().get_node_id()
    return {
        rank: nodes[rank].pid for rank in ranks if rank < len(nodes) and nodes[rank].node_id == here
    }
