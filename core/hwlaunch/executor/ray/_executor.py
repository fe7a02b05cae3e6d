"""The ray executor: one Ray actor per rank, placed by a placement group, across nodes.

Ray is an optional dependency (``pip install 'hwlaunch[ray]'``), imported only here and only
when this executor runs. The connection is ``_cluster``'s, the placement ``_placement``'s, and
what runs inside each actor ``_actor``'s.

Liveness between calls: each actor also runs ``watch``, a call that never returns, in a
concurrency group of its own (so RPCs still run one at a time, on the actor's default
thread). Ray fails that call the moment it learns that the actor died (its process killed,
its node lost); a monitor thread waiting on these calls marks the executor dead then, so
``check_health()`` and the next RPC fail at once, and a restart controller is told.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hwlaunch.errors import BackendUnavailableError, WorkerDiedError, WorkerStartupError
from hwlaunch.executor._runtime import Failure, Request
from hwlaunch.executor.base import (
    Executor,
    ExecutorOptions,
    bound_devices,
    gather,
    worker_environment,
)
from hwlaunch.executor.ray._actor import CONTROL_GROUP, WATCH_GROUP, rank_actor_class
from hwlaunch.executor.ray._actor_output import OUTPUT_GROUP
from hwlaunch.executor.ray._cluster import (
    connect,
    import_ray,
    node_address,
    release,
    setting_source,
)
from hwlaunch.executor.ray._lifeline import Lifeline, actor_ray_config
from hwlaunch.executor.ray._output import OutputCollector
from hwlaunch.executor.ray._placement import (
    RankNode,
    actor_resources,
    capacity_error,
    local_ranks,
    node_visibility,
    placement_error,
    placement_strategy,
    rank_order,
)
from hwlaunch.executor.ray._stacks import actor_stacks
from hwlaunch.executor.state import ClosedState
from hwlaunch.executor.transport.codec import PICKLES
from hwlaunch.plan import Plan

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["RayExecutor"]

log = logging.getLogger("hwlaunch")
MONITOR_POLL = 0.5  # seconds between the monitor's checks that the executor is still open
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

    def __init__(self, ray: Any, owns_connection: bool, shutdown_timeout: float) -> None:
        self.ray = ray
        self.owns_connection = owns_connection
        self.shutdown_timeout = shutdown_timeout  # the actors' own shutdown() before ray.kill
        self.pg: Any = None
        self.actors: list[Any] = []
        self.nodes: list[RankNode] = []
        self.state = ClosedState()  # closed by shutdown; the first unexpected death
        self.busy = False
        self.lock = threading.Lock()
        self.released = False  # this group's use of the connection has ended
        self.monitor: threading.Thread | None = None
        self.on_death: Callable[[WorkerDiedError], None] | None = None  # the restart controller
        self.output: OutputCollector | None = None  # the ranks' stdout and stderr
        self.lifeline: Lifeline | None = None  # how the (detached) actors see this driver end

    # -- deaths --------------------------------------------------------------------------
    def record_death(self, rank: int, exc: BaseException) -> WorkerDiedError | None:
        """The first death of an actor (None when the group was closed on purpose)."""
        with self.lock:
            if self.state.died is None and not self.state.closed:
                node = self.nodes[rank] if rank < len(self.nodes) else None
                where = (
                    f"Ray actor on node {node.node_ip} (id {node.node_id[:12]}), {ray_reason(exc)}"
                    if node
                    else f"Ray actor, {ray_reason(exc)}"
                )
                self.state.record_death(
                    WorkerDiedError(rank, node.pid if node else None, None, where)
                )
            return self.state.died

    def start_monitor(self) -> None:
        """Watch every actor between (and during) calls; see the module docstring."""
        refs = {
            actor.watch.options(concurrency_group=WATCH_GROUP).remote(): rank
            for rank, actor in enumerate(self.actors)
        }
        self.monitor = threading.Thread(
            target=self._watch, args=(refs,), name="hwlaunch-ray-monitor", daemon=True
        )
        self.monitor.start()

    def _watch(self, refs: dict[Any, int]) -> None:
        ray = self.ray
        errors = importlib.import_module("ray.exceptions")
        ready: list[Any] = []
        # Never a call once the program left Ray (its ray.shutdown()): Ray ends the whole
        # process on one; a call in progress then raises SystemExit.
        while not self.state.closed and ray.is_initialized():
            try:
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=MONITOR_POLL)
                if ready and ray.is_initialized():
                    ray.get(ready[0])
            except errors.RayActorError as exc:
                died = self.record_death(refs[ready[0]], exc)
                if died is not None:
                    self.shutdown(polite=False, keep_connection=self.on_death is not None)
                    if self.on_death is not None:
                        self.on_death(died)
                return
            except (Exception, SystemExit):  # Ray is going away
                return

    def shutdown(self, polite: bool = True, *, keep_connection: bool = False) -> None:
        """Let workers leave the process group, then kill the actors and free the placement
        group. Idempotent; never hangs; quiet when Ray is already gone (interpreter exit).

        ``keep_connection``: a restart follows; the connection (perhaps a local Ray instance)
        stays for the next group, and the executor's own shutdown, which the controller
        calls, ends it.
        """
        with self.lock:
            first = self.state.close("shutdown() was called")
            release_now = self.owns_connection and not keep_connection and not self.released
            self.released = self.released or release_now
        ray = self.ray
        if not first:
            if release_now:
                self._join_monitor()
                release(ray)
            return
        try:
            if not ray.is_initialized():
                # This driver left Ray first (Ray's exit hook, or the program's ray.shutdown()):
                # a local instance went with its actors; detached ones in a cluster end
                # themselves, with their workers' shutdown(), once their lifeline closes.
                if self.lifeline is not None:
                    self.lifeline.abandon()
                return
            if polite and not self.busy and self.actors:
                self._stop_actors()
            if polite and self.output is not None:
                self.output.drain()  # what the ranks wrote up to here, before they are killed
            for actor in self.actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
            if self.pg is not None:
                with contextlib.suppress(Exception):
                    ray.util.remove_placement_group(self.pg)
            if self.lifeline is not None:
                self.lifeline.release()  # after the kills: a told actor is never left over
            if release_now:
                self._join_monitor()
        finally:
            if self.output is not None:
                self.output.close()
            if release_now:
                release(ray)

    def _join_monitor(self) -> None:
        """The monitor is done with Ray before the connection ends (it sees the group closed
        within ``MONITOR_POLL``)."""
        if self.monitor is not None and self.monitor is not threading.current_thread():
            self.monitor.join(MONITOR_POLL * 4)

    def _stop_actors(self) -> None:
        """Each actor's own shutdown(), within the grace; the late ones are logged, then
        killed with the others."""
        refs = [actor.stop.remote() for actor in self.actors]
        done, _ = self.ray.wait(refs, num_returns=len(refs), timeout=self.shutdown_timeout)
        finished = set(done)
        for rank, ref in enumerate(refs):
            if ref not in finished:
                pid = self.nodes[rank].pid if rank < len(self.nodes) else None
                log.warning(
                    "hwlaunch: worker rank %d (Ray actor, pid %s) did not finish its "
                    "shutdown() within the %gs shutdown_timeout: ray.kill",
                    rank,
                    pid,
                    self.shutdown_timeout,
                )


class RayExecutor(Executor):
    """Workers as Ray actors, one per rank, in a placement group that may span nodes."""

    def __init__(
        self,
        plan: Plan,
        worker_extension: type | str | None = None,
        **options: Unpack[ExecutorOptions],
    ) -> None:
        super().__init__(plan, worker_extension, **options)
        ray = import_ray(loopback=plan.ray_address is None)
        self._group = _ActorGroup(ray, connect(ray, plan, self.warnings), plan.shutdown_timeout)
        self._finalizer = weakref.finalize(self, self._group.shutdown)
        # Registered after Ray's own exit hook, so it runs before Ray disconnects.
        atexit.register(self._finalizer)
        self._errors = importlib.import_module("ray.exceptions")

    @property
    def nodes(self) -> list[RankNode]:
        """Where each rank runs (node id, node IP, pid, local rank), in rank order."""
        return list(self._group.nodes)

    @property
    def pids(self) -> list[int]:
        return [node.pid for node in self._group.nodes]

    # -- start-up ------------------------------------------------------------------------
    def start_ranks(self, extension: bytes | str | None, init_distributed: bool) -> None:
        group, plan, ray = self._group, self.plan, self._group.ray
        self._refuse_too_small_a_cluster()
        strategy = placement_strategy(plan)
        group.lifeline = Lifeline(node_address(ray))
        # Detached from this driver, as the actors are (see ``_lifeline``): Ray would remove
        # them the moment the driver dies, before the workers' own shutdown().
        group.pg = ray.util.placement_group(
            [{plan.ray_resource: 1.0} for _ in range(plan.world_size)],
            strategy=strategy,
            name=f"hwlaunch-{plan.backend}-{os.getpid()}-{id(self):x}",
            lifetime="detached",
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
        self._create_actors(order, local, group.lifeline.address)
        places = self._await(
            [a.place.remote(plan.ray_resource, r == 0) for r, a in enumerate(group.actors)],
            deadline,
            lambda rank, place: self.report_status(rank, "started"),
        )
        group.nodes = [
            RankNode(rank, local[rank][0], p["node_id"], p["node_ip"], p["pid"])
            for rank, p in enumerate(places)
        ]
        group.output = OutputCollector(ray, plan)
        group.output.start(group.actors, places, [rank_local for rank_local, _ in local])
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
                group.actors[1:] if rank == 0 else [],  # rank 0 ends last after a driver death
            )
            for rank, actor in enumerate(group.actors)
        ]
        self._await(starts, deadline, self._started)
        group.start_monitor()

    def _refuse_too_small_a_cluster(self) -> None:
        """Before a bundle per rank is built: a cluster with fewer of the resource than ranks."""
        source = setting_source(self.plan, "world_size", "the plan")
        too_small = capacity_error(self._group.ray, self.plan, source)
        if too_small is not None:
            raise BackendUnavailableError(too_small)

    def _create_actors(
        self, order: list[int], local: list[tuple[int, int]], lifeline: tuple[str, int]
    ) -> None:
        """One actor per rank in its bundle, with the rank's variables from process start."""
        group, plan, ray = self._group, self.plan, self._group.ray
        strategies = importlib.import_module("ray.util.scheduling_strategies")
        groups = {WATCH_GROUP: 1, CONTROL_GROUP: 1, OUTPUT_GROUP: 1}
        # Ray starts actors from its node's environment, not this driver's: what workers need
        # from here (worker_environment holds the propagate_env variables) travels in the
        # runtime environment, to every node.
        inherited = {k: v for k, v in os.environ.items() if k.startswith("HWLAUNCH_")}
        inherited.update(actor_ray_config(plan.shutdown_timeout))
        if plan.ray_noset_visibility_var:
            inherited[plan.ray_noset_visibility_var] = "1"  # the binding, not Ray, sets it
        for rank, bundle in enumerate(order):
            env = worker_environment(plan, rank, local[rank][0], "", 0, local[rank][1])
            for key in ("MASTER_ADDR", "MASTER_PORT", plan.device_control_env_var):
                env.pop(key or "", None)  # known once the actors are placed: see _start_env
            actor_class = ray.remote(concurrency_groups=groups)(
                rank_actor_class(plan.backend, rank)
            )
            group.actors.append(
                actor_class.options(
                    **actor_resources(plan.ray_resource),
                    scheduling_strategy=strategies.PlacementGroupSchedulingStrategy(
                        placement_group=group.pg, placement_group_bundle_index=bundle
                    ),
                    runtime_env={"env_vars": {**inherited, **env}},
                    lifetime="detached",
                ).remote(rank, plan.forward_signals, lifeline, group.pg)
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
        self.report_status(rank, "ready")

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
            deadline,
            self.startup_timed_out,
        )
        return results

    def _wait_one(self, refs: list[Any], remaining: float | None) -> list[Any]:
        ready, _ = self._group.ray.wait(refs, num_returns=1, timeout=remaining)
        return list(ready)

    # -- RPC -----------------------------------------------------------------------------
    def exchange(
        self, request: Request, label: str, timeout: float | None, reply_rank: int | None
    ) -> tuple[list[Any], dict[int, Failure]]:
        group, ray = self._group, self._group.ray
        payload = PICKLES.encode_request(request)
        arg = ray.put(payload) if len(payload) > INLINE_ARGS_LIMIT else payload
        results: list[Any] = [None] * len(group.actors)
        failures: dict[int, Failure] = {}

        def take(ref: Any, rank: int) -> bool:
            try:
                reply = ray.get(ref)
            except self._errors.RayActorError as exc:
                raise self._actor_died(rank, label, exc) from exc
            try:
                ok, value = PICKLES.decode_reply(reply)
            except Exception as exc:  # a class the driver cannot import: its error, not the rank's
                ok, value = False, Failure.current(exc, undecodable=True)
            if ok:
                results[rank] = value
            else:
                failures[rank] = value
            return True

        deadline = None if timeout is None else time.monotonic() + timeout
        group.busy = True
        try:
            refs = [
                actor.call.remote(arg, reply_rank in (None, rank))
                for rank, actor in enumerate(group.actors)
            ]
            pending = {ref: rank for rank, ref in enumerate(refs)}
            self.waiting_on = pending.values()  # what the stall watchdog names
            gather(
                pending,
                self._wait_one,
                take,
                deadline,
                lambda ranks: self.timed_out(label, ranks, timeout),
            )
        finally:
            group.busy = False
        return results, failures

    def _actor_died(self, rank: int, label: str, exc: BaseException) -> Exception:
        died = self._group.record_death(rank, exc)
        if died is None:
            return self.closed_during(label)
        return self.worker_died(died)

    def rank_stacks(self, ranks: list[int], timeout: float) -> dict[int, str]:
        group = self._group
        return actor_stacks(group.ray, group.actors, group.nodes, ranks, timeout)

    def signal_ranks(self, signum: int) -> None:
        """Each actor signals itself (on whichever node it runs), from a thread of its own:
        this runs in a signal handler, which must not enter Ray in the middle of a Ray call
        of the main thread."""
        actors = list(self._group.actors)

        def deliver() -> None:
            for actor in actors:
                with contextlib.suppress(Exception):  # that actor died, or Ray is going away
                    actor.deliver_signal.options(concurrency_group=CONTROL_GROUP).remote(signum)

        threading.Thread(target=deliver, name="hwlaunch-forward-signal", daemon=True).start()

    # -- state and stop ------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Closed by a call, or by the monitor thread that saw an actor die between calls."""
        return self.state.closed or self._group.state.closed

    def raise_if_closed(self) -> None:
        died = self._group.state.died  # seen by the monitor between calls
        if died is not None:
            self.state.record_death(died)
            self.state.close(f"worker rank {died.rank} died")
        super().raise_if_closed()

    def watch_deaths(self, callback: Callable[[WorkerDiedError], None]) -> None:
        # On the group, not self: the group's finalizer must not keep the executor alive.
        self._group.on_death = callback

    def stop_group(self) -> None:
        """Kill the actors and free the placement group; keep the connection for a restart."""
        self.state.close("the group is being restarted")
        self._group.shutdown(polite=False, keep_connection=True)

    def stop_ranks(self, polite: bool = True) -> None:
        """Polite: the actors' own shutdown(), then the connection ends (a local instance
        with it). After a fault (a timeout, a death): the actors are killed at once, and the
        connection stays until ``shutdown()`` or the program's exit, so that the error comes
        without waiting for a local Ray instance to end (``base.TIMEOUT_BOUND``)."""
        if polite:
            self._finalizer()
            atexit.unregister(self._finalizer)
        else:
            self._group.shutdown(polite=False, keep_connection=True)
