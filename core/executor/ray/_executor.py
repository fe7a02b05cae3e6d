"""The ray executor: one Ray actor per rank, placed by a placement group, across nodes.

Ray is an optional dependency (``pip install 'hwlaunch[ray]'``), imported only here and only
when this executor runs. The connection is ``_cluster``'s, the placement ``_placement``'s, and
what runs inside each actor ``_actor``'s.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import re
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from hwlaunch.errors import BackendUnavailableError, WorkerDiedError, WorkerStartupError
from hwlaunch.executor._runtime import Failure, Request, dumps, loads
from hwlaunch.executor.base import (
    Executor,
    StatusCallback,
    bound_devices,
    gather,
    worker_environment,
)
from hwlaunch.executor.ray._actor import RankActor
from hwlaunch.executor.ray._cluster import connect, import_ray, release
from hwlaunch.executor.ray._placement import (
    RankNode,
    actor_resources,
    local_ranks,
    node_visibility,
    placement_error,
    placement_strategy,
    rank_order,
)
from hwlaunch.plan import Plan

__all__ = ["RayExecutor"]

SHUTDOWN_GRACE = 5.0
# Ray copies arguments up to this size into each call; a larger payload is put in the object
# store once and shared by every rank.
INLINE_ARGS_LIMIT = 100 * 1024
_EXIT_TYPE = re.compile(r"exit type: (\w+)", re.IGNORECASE)


def ray_reason(exc: BaseException) -> str:
    """A short cause from Ray's (long) actor-death message."""
    text = str(exc)
    found = _EXIT_TYPE.search(text)
    if found:
        return f"Ray worker exit type {found.group(1)}"
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


class _ActorGroup:
    """The actors and placement group of one executor; shut down by it or by its finalizer.

    Kept apart from the executor object so that the finalizer holds no reference to it.
    """

    def __init__(self, ray: Any, owns_connection: bool) -> None:
        self.ray = ray
        self.owns_connection = owns_connection
        self.pg: Any = None
        self.actors: list[Any] = []
        self.nodes: list[RankNode] = []
        self.closed = False
        self.busy = False
        self.lock = threading.Lock()

    def shutdown(self, polite: bool = True) -> None:
        """Let workers leave the process group, then kill the actors and free the placement
        group. Idempotent; never hangs; quiet when Ray is already gone (interpreter exit)."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
        ray = self.ray
        try:
            if not ray.is_initialized():
                return  # Ray's own shutdown already ended every actor and placement group
            if polite and not self.busy and self.actors:
                refs = [actor.stop.remote() for actor in self.actors]
                ray.wait(refs, num_returns=len(refs), timeout=SHUTDOWN_GRACE)
            for actor in self.actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
            if self.pg is not None:
                with contextlib.suppress(Exception):
                    ray.util.remove_placement_group(self.pg)
        finally:
            if self.owns_connection:
                release(ray)


class RayExecutor(Executor):
    """Workers as Ray actors, one per rank, in a placement group that may span nodes."""

    def __init__(
        self,
        plan: Plan,
        worker_extension: type | str | None = None,
        *,
        init_distributed: bool = True,
        startup_timeout: float | None = None,
        on_status: StatusCallback | None = None,
    ) -> None:
        ray = import_ray(loopback=plan.ray_address is None)
        connection_warnings: list[str] = []
        self._group = _ActorGroup(ray, connect(ray, plan, connection_warnings))
        self._finalizer = weakref.finalize(self, self._group.shutdown)
        # Registered after Ray's own exit hook, so it runs before Ray disconnects.
        atexit.register(self._finalizer)
        self._errors = importlib.import_module("ray.exceptions")
        self._pending_warnings = connection_warnings
        super().__init__(
            plan,
            worker_extension,
            init_distributed=init_distributed,
            startup_timeout=startup_timeout,
            on_status=on_status,
        )

    @property
    def nodes(self) -> list[RankNode]:
        """Where each rank runs (node id, node IP, pid, local rank), in rank order."""
        return list(self._group.nodes)

    @property
    def pids(self) -> list[int]:
        return [node.pid for node in self._group.nodes]

    # -- start-up ------------------------------------------------------------------------
    def _start_ranks(self, extension: bytes | str | None, init_distributed: bool) -> None:
        self.warnings += self._pending_warnings
        group, plan, ray = self._group, self.plan, self._group.ray
        strategy = placement_strategy(plan)
        group.pg = ray.util.placement_group(
            [{plan.ray_resource: 1.0} for _ in range(plan.world_size)],
            strategy=strategy,
            name=f"hwlaunch-{plan.backend}-{os.getpid()}-{id(self):x}",
        )
        # ray.wait, not pg.wait(), which truncates its timeout to whole seconds.
        placed, _ = ray.wait([group.pg.ready()], timeout=plan.ray_pg_timeout)
        if not placed:
            raise BackendUnavailableError(placement_error(ray, plan, strategy))
        deadline = time.monotonic() + self.startup_timeout  # from here on, the workers' part
        table = ray.util.placement_group_table(group.pg)
        bundle_nodes = {int(b): str(n) for b, n in table["bundles_to_node_id"].items()}
        order = rank_order(bundle_nodes)
        node_of_rank = [bundle_nodes[b] for b in order]
        if plan.nnodes > 1 and len(set(node_of_rank)) != plan.nnodes:
            self.warnings.append(
                f"the plan asks for {plan.nnodes} nodes, and Ray placed the {plan.world_size} "
                f"ranks on {len(set(node_of_rank))} (strategy {strategy} is best-effort)"
            )
        local = local_ranks(node_of_rank)
        self._create_actors(order, local)
        places = self._await(
            [a.place.remote(plan.ray_resource, r == 0) for r, a in enumerate(group.actors)],
            deadline,
            lambda rank, place: self._status(rank, "started"),
        )
        group.nodes = [
            RankNode(rank, local[rank][0], p["node_id"], p["node_ip"], p["pid"])
            for rank, p in enumerate(places)
        ]
        visible = node_visibility(node_of_rank, [p["device_ids"] for p in places])
        master = (places[0]["node_ip"], int(places[0]["port"]))
        starts = [
            actor.start.remote(
                self._start_env(
                    master, bound_devices(plan, local[rank][0], visible[node_of_rank[rank]])
                ),
                plan,
                extension,
                rank,
                local[rank][0],
                *master,
                init_distributed,
            )
            for rank, actor in enumerate(group.actors)
        ]
        self._await(starts, deadline, self._started)

    def _create_actors(self, order: list[int], local: list[tuple[int, int]]) -> None:
        """One actor per rank in its bundle, with the rank's variables from process start."""
        group, plan, ray = self._group, self.plan, self._group.ray
        strategies = importlib.import_module("ray.util.scheduling_strategies")
        actor_class = ray.remote(RankActor)
        # Ray starts actors from its node's environment, not this driver's: what workers need
        # from here (worker_environment holds the propagate_env variables) travels in the
        # runtime environment, to every node.
        inherited = {k: v for k, v in os.environ.items() if k.startswith("HWLAUNCH_")}
        if plan.ray_noset_visibility_var:
            inherited[plan.ray_noset_visibility_var] = "1"  # the binding, not Ray, sets it
        for rank, bundle in enumerate(order):
            env = worker_environment(plan, rank, local[rank][0], "", 0, local[rank][1])
            for key in ("MASTER_ADDR", "MASTER_PORT", plan.device_control_env_var):
                env.pop(key or "", None)  # known once the actors are placed: see _start_env
            group.actors.append(
                actor_class.options(
                    **actor_resources(plan.ray_resource),
                    scheduling_strategy=strategies.PlacementGroupSchedulingStrategy(
                        placement_group=group.pg, placement_group_bundle_index=bundle
                    ),
                    runtime_env={"env_vars": {**inherited, **env}},
                ).remote()
            )

    def _start_env(self, master: tuple[str, int], visible: str | None) -> dict[str, str]:
        """What a rank learns once every actor is placed: the rendezvous and the devices its
        binding gives it on its node (left alone where Ray reported none)."""
        env = {"MASTER_ADDR": master[0], "MASTER_PORT": str(master[1])}
        var = self.plan.device_control_env_var
        if var and visible is not None:
            env[var] = visible
        return env

    def _started(self, rank: int, failure: Failure | None) -> None:
        if failure is not None:
            raise WorkerStartupError(
                rank, f"{failure.exc_type}: {failure.message}", failure.traceback
            )
        self._status(rank, "ready")

    def _await(
        self, refs: list[Any], deadline: float, on_result: Callable[[int, Any], None]
    ) -> list[Any]:
        """Start-up results in rank order; any failure is a WorkerStartupError."""
        ray, errors = self._group.ray, self._errors
        results: list[Any] = [None] * len(refs)

        def take(ref: Any, rank: int) -> bool:
            try:
                results[rank] = ray.get(ref)
            except errors.RayActorError as exc:
                raise WorkerStartupError(
                    rank, f"the Ray actor died while starting ({ray_reason(exc)})"
                ) from exc
            except errors.RayError as exc:
                raise WorkerStartupError(rank, f"{type(exc).__name__}: {exc}") from exc
            on_result(rank, results[rank])
            return True

        gather(
            {ref: rank for rank, ref in enumerate(refs)},
            self._wait_one,
            take,
            max(deadline - time.monotonic(), 0.0),
            self._startup_timed_out,
        )
        return results

    def _wait_one(self, refs: list[Any], remaining: float | None) -> list[Any]:
        ready, _ = self._group.ray.wait(refs, num_returns=1, timeout=remaining)
        return list(ready)

    # -- RPC -----------------------------------------------------------------------------
    def _exchange(
        self, request: Request, label: str, timeout: float | None, reply_rank: int | None
    ) -> tuple[list[Any], dict[int, Failure]]:
        group, ray = self._group, self._group.ray
        payload = dumps(request)
        arg = ray.put(payload) if len(payload) > INLINE_ARGS_LIMIT else payload
        results: list[Any] = [None] * len(group.actors)
        failures: dict[int, Failure] = {}

        def take(ref: Any, rank: int) -> bool:
            try:
                ok, value = loads(ray.get(ref))
            except self._errors.RayActorError as exc:
                raise self._actor_died(rank, label, exc) from exc
            if ok:
                results[rank] = value
            else:
                failures[rank] = value
            return True

        group.busy = True
        try:
            refs = [
                actor.call.remote(arg, reply_rank in (None, rank))
                for rank, actor in enumerate(group.actors)
            ]
            gather(
                {ref: rank for rank, ref in enumerate(refs)},
                self._wait_one,
                take,
                timeout,
                lambda ranks: self._timed_out(label, ranks, timeout),
            )
        finally:
            group.busy = False
        return results, failures

    def _actor_died(self, rank: int, label: str, exc: BaseException) -> Exception:
        if self._group.closed and self._died is None:
            return self._closed_during(label)
        node = self._group.nodes[rank]
        died = WorkerDiedError(
            rank, node.pid, None, f"Ray actor on node {node.node_ip}, {ray_reason(exc)}"
        )
        return self._worker_died(died)

    def _stop(self, polite: bool = True) -> None:
        if polite:
            self._finalizer()
        else:
            self._group.shutdown(polite=False)
        atexit.unregister(self._finalizer)
