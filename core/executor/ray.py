"""The ray executor: one Ray actor per rank, placed by a placement group, across nodes.

Ray is an optional dependency (``pip install 'hwlaunch[ray]'``), imported only here and only
when this executor runs. hwlaunch joins the cluster named by ``ray_address``, else the Ray
instance this process is already connected to, else it starts a private local instance bound
to 127.0.0.1. It ends only a connection it made itself: ``ray.shutdown()`` on a connection to
an existing cluster disconnects this driver and leaves the cluster running, and the local
instance hwlaunch started goes away with its last executor.

Placement: ``world_size`` bundles of one unit of the backend's Ray resource (``CPU``, ``GPU``,
``HPU``...). With one node (the default) the strategy is PACK, which fills a node before using
the next one, so a world size larger than one node's devices spills over to other nodes. With
``nnodes > 1`` it is STRICT_SPREAD when there is one rank per node (each bundle on its own
node, guaranteed) and SPREAD otherwise (bundles spread as evenly as Ray can; a warning says
when the ranks landed on a number of nodes other than ``nnodes``). Ranks are numbered node by
node, so the ranks of one node are contiguous and ``local_rank`` is the index among them, as
under torchrun.

The worker inside each actor is the backend's worker class, built and called through
``hwlaunch.worker_runtime`` exactly as in the mp executor, so errors and semantics match.

Liveness between calls: each actor also runs ``watch``, a call that never returns, in a
concurrency group of its own (so RPCs still run one at a time, on the actor's default
thread, not the process's main thread). Ray fails that call the moment it learns that the
actor died (its process killed, its node lost); a monitor thread waiting on these calls marks
the executor dead then, so ``check_health()`` and the next RPC fail at once.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import re
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hwlaunch.errors import (
    BackendUnavailableError,
    RpcTimeoutError,
    WorkerDiedError,
    WorkerStartupError,
)
from hwlaunch.executor.base import Executor, StatusCallback, free_port, raise_first_failure
from hwlaunch.plan import Plan
from hwlaunch.worker import Worker
from hwlaunch.worker_runtime import (
    Failure,
    answer,
    dumps,
    encode_extension,
    encode_method,
    loads,
    method_label,
    start_worker,
)

DEFAULT_STARTUP_TIMEOUT = 600.0
SHUTDOWN_GRACE = 5.0
WATCH_GROUP = "hwlaunch_watch"  # the actors' concurrency group for watch()
MONITOR_POLL = 0.5  # seconds between the monitor's checks that the executor is still open
# Ray copies arguments up to this size into each call; a larger payload is put in the object
# store once and shared by every rank.
INLINE_ARGS_LIMIT = 100 * 1024


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


def _setting_source(plan: Plan, setting: str, default: str) -> str:
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
                source = _setting_source(plan, "ray_address", "ray_address")
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


# -- placement -----------------------------------------------------------------------------
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


def placement_error(ray: Any, plan: Plan, strategy: str) -> str:
    """What was asked, what the cluster has, and how to fix it."""
    res, n = plan.ray_resource, plan.world_size
    total = float(ray.cluster_resources().get(res, 0))
    available = float(ray.available_resources().get(res, 0))
    alive = [node for node in ray.nodes() if node.get("Alive")]
    holding = [node for node in alive if node.get("Resources", {}).get(res, 0) >= 1]
    source = _setting_source(plan, "ray_pg_timeout", "HWLAUNCH_RAY_PG_TIMEOUT")
    spread = ", one per node" if strategy == "STRICT_SPREAD" else ""
    head = (
        f"Ray could not place {n} workers of backend {plan.backend} with {{{res!r}: 1}} each "
        f"(strategy {strategy}{spread}) within {plan.ray_pg_timeout:g}s (ray_pg_timeout from "
        f"{source}): "
    )
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
    elif total < n:
        why = (
            f"the cluster has {total:g} {res} in total on {len(holding)} node(s): "
            f"{n - total:g} {res} missing"
        )
        fix = f"add nodes with {res} to the cluster, or use world_size <= {int(total)}"
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


_EXIT_TYPE = re.compile(r"exit type: (\w+)", re.IGNORECASE)


def ray_reason(exc: BaseException) -> str:
    """A short cause from Ray's (long) actor-death message."""
    text = str(exc)
    found = _EXIT_TYPE.search(text)
    if found:
        return f"Ray worker exit type {found.group(1)}"
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


# -- the actor -----------------------------------------------------------------------------
class RankActor:
    """One rank inside a Ray actor process: hosts the backend's Worker."""

    def __init__(self) -> None:
        self.worker: Worker | None = None

    def place(self, resource: str, want_port: bool) -> dict[str, Any]:
        """Where this actor runs, the devices Ray gave it, and (rank 0) a rendezvous port."""
        ray = import_ray()
        context = ray.get_runtime_context()
        node_id = context.get_node_id()
        # The address the node was started with (127.0.0.1 for hwlaunch's local instance), not
        # get_node_ip_address(), which answers with the machine's routable address.
        ip = next(
            (n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id),
            ray.util.get_node_ip_address(),
        )
        return {
            "node_id": node_id,
            "node_ip": ip,
            "pid": os.getpid(),
            "device_ids": [str(i) for i in context.get_accelerator_ids().get(resource, [])],
            "port": free_port(ip) if want_port else None,
        }

    def start(
        self,
        env: dict[str, str],
        plan: Plan,
        extension: bytes | str | None,
        rank: int,
        local_rank: int,
        master_addr: str,
        master_port: int,
        init_distributed: bool,
    ) -> Failure | None:
        """Build the worker and run its start-up lifecycle; a failure comes back as data."""
        os.environ.update(env)
        try:
            self.worker = start_worker(
                plan,
                extension,
                rank=rank,
                local_rank=local_rank,
                master_addr=master_addr,
                master_port=master_port,
                init_distributed=init_distributed,
            )
        except BaseException as exc:
            return Failure.current(exc)
        return None

    def call(self, payload: bytes) -> bytes:
        """One RPC: ``(ok, result or Failure)``, pickled here so an unpicklable result is a
        WorkerError, as under the mp executor."""
        return answer(self.worker, payload)

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()

    def watch(self) -> None:
        """Never returns: Ray fails this call when the actor dies (see the module docstring)."""
        threading.Event().wait()


@dataclass(frozen=True)
class RankNode:
    """Where one rank runs."""

    rank: int
    local_rank: int
    node_id: str
    node_ip: str
    pid: int


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
        self.died: WorkerDiedError | None = None
        self.closed = False
        self.busy = False
        self.lock = threading.Lock()
        self.released = False  # this group's use of the connection has ended
        self.monitor: threading.Thread | None = None
        self.on_death: Callable[[WorkerDiedError], None] | None = None

    # -- deaths --------------------------------------------------------------------------
    def record_death(self, rank: int, exc: BaseException) -> WorkerDiedError | None:
        """The first death of an actor (None when the group was closed on purpose)."""
        with self.lock:
            if self.died is None and not self.closed:
                node = self.nodes[rank] if rank < len(self.nodes) else None
                where = (
                    f"Ray actor on node {node.node_ip} (id {node.node_id[:12]}), {ray_reason(exc)}"
                    if node
                    else f"Ray actor, {ray_reason(exc)}"
                )
                self.died = WorkerDiedError(rank, node.pid if node else None, None, where)
            died = self.died
        return died

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
        while not self.closed:
            try:
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=MONITOR_POLL)
                if ready:
                    ray.get(ready[0])
            except errors.RayActorError as exc:
                died = self.record_death(refs[ready[0]], exc)
                if died is not None:
                    self.shutdown(polite=False, keep_connection=self.on_death is not None)
                    if self.on_death is not None:
                        self.on_death(died)
                return
            except Exception:  # Ray is going away (interpreter exit, a disconnect)
                return

    def shutdown(self, polite: bool = True, *, keep_connection: bool = False) -> None:
        """Let workers leave the process group, then kill the actors and free the placement
        group. Idempotent; never hangs; quiet when Ray is already gone (interpreter exit).

        ``keep_connection``: a death seen while a restart controller watches; the connection
        (perhaps a local Ray instance) stays for the next group, and the executor's own
        shutdown, which the controller calls, ends it.
        """
        with self.lock:
            first = not self.closed
            self.closed = True
            release_now = self.owns_connection and not keep_connection and not self.released
            self.released = self.released or release_now
        ray = self.ray
        if not first:
            if release_now:
                release(ray)
            return
        try:
            if not ray.is_initialized():
                return  # Ray's own shutdown already ended every actor and placement group
            if polite and not self.busy and self.died is None and self.actors:
                refs = [actor.stop.remote() for actor in self.actors]
                ray.wait(refs, num_returns=len(refs), timeout=SHUTDOWN_GRACE)
            for actor in self.actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
            if self.pg is not None:
                with contextlib.suppress(Exception):
                    ray.util.remove_placement_group(self.pg)
            if self.monitor is not None and self.monitor is not threading.current_thread():
                self.monitor.join(MONITOR_POLL * 4)  # done with Ray before the connection ends
        finally:
            if release_now:
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
        self.plan = plan
        self.warnings: list[str] = []
        self._rpc_lock = threading.Lock()
        extension = encode_extension(worker_extension)
        ray = import_ray(loopback=plan.ray_address is None)
        self._group = _ActorGroup(ray, connect(ray, plan, self.warnings))
        self._finalizer = weakref.finalize(self, self._group.shutdown)
        # Registered after Ray's own exit hook, so it runs before Ray disconnects.
        atexit.register(self._finalizer)
        timeout = startup_timeout or float(
            os.environ.get("HWLAUNCH_STARTUP_TIMEOUT", DEFAULT_STARTUP_TIMEOUT)
        )
        try:
            self._start(extension, init_distributed, timeout, on_status)
        except BaseException:
            self._group.shutdown(polite=False)
            atexit.unregister(self._finalizer)
            raise

    # -- start-up ------------------------------------------------------------------------
    def _start(
        self,
        extension: bytes | str | None,
        init_distributed: bool,
        timeout: float,
        on_status: StatusCallback | None,
    ) -> None:
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
        deadline = time.monotonic() + timeout  # from here on, start-up is the workers' part
        table = ray.util.placement_group_table(group.pg)
        bundle_nodes = {int(b): str(n) for b, n in table["bundles_to_node_id"].items()}
        order = rank_order(bundle_nodes)
        node_of_rank = [bundle_nodes[b] for b in order]
        local = local_ranks(node_of_rank)
        if plan.nnodes > 1 and len(set(node_of_rank)) != plan.nnodes:
            self.warnings.append(
                f"the plan asks for {plan.nnodes} nodes, and Ray placed the {plan.world_size} "
                f"ranks on {len(set(node_of_rank))} (strategy {strategy} is best-effort)"
            )

        strategies = importlib.import_module("ray.util.scheduling_strategies")
        actor_class = ray.remote(concurrency_groups={WATCH_GROUP: 1})(RankActor)
        inherited = {k: v for k, v in os.environ.items() if k.startswith("HWLAUNCH_")}
        for rank, bundle in enumerate(order):
            env = {
                **inherited,
                **plan.env,
                "RANK": str(rank),
                "LOCAL_RANK": str(local[rank][0]),
                "WORLD_SIZE": str(plan.world_size),
                "LOCAL_WORLD_SIZE": str(local[rank][1]),
            }
            group.actors.append(
                actor_class.options(
                    **actor_resources(plan.ray_resource),
                    scheduling_strategy=strategies.PlacementGroupSchedulingStrategy(
                        placement_group=group.pg, placement_group_bundle_index=bundle
                    ),
                    runtime_env={"env_vars": env},
                ).remote()
            )

        def started(rank: int, place: dict[str, Any]) -> None:
            if on_status:
                on_status(rank, "started")

        places = self._await(
            [a.place.remote(plan.ray_resource, r == 0) for r, a in enumerate(group.actors)],
            deadline,
            timeout,
            started,
        )
        group.nodes = [
            RankNode(rank, local[rank][0], p["node_id"], p["node_ip"], p["pid"])
            for rank, p in enumerate(places)
        ]
        master_addr, master_port = places[0]["node_ip"], int(places[0]["port"])
        visible = node_visibility(node_of_rank, [p["device_ids"] for p in places])

        def ready(rank: int, failure: Failure | None) -> None:
            if failure is not None:
                raise WorkerStartupError(
                    rank, f"{failure.exc_type}: {failure.message}", failure.traceback
                )
            if on_status:
                on_status(rank, "ready")

        starts = []
        for rank, actor in enumerate(group.actors):
            env = {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)}
            var, value = plan.device_control_env_var, visible[node_of_rank[rank]]
            if var and value is not None:
                env[var] = value
            starts.append(
                actor.start.remote(
                    env,
                    plan,
                    extension,
                    rank,
                    local[rank][0],
                    master_addr,
                    master_port,
                    init_distributed,
                )
            )
        self._await(starts, deadline, timeout, ready)
        group.start_monitor()

    def _await(
        self,
        refs: list[Any],
        deadline: float,
        timeout: float,
        on_result: Callable[[int, Any], None],
    ) -> list[Any]:
        """Start-up results in rank order; any failure is a WorkerStartupError."""
        ray = self._group.ray
        errors = importlib.import_module("ray.exceptions")
        pending = {ref: rank for rank, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        while pending:
            remaining = max(deadline - time.monotonic(), 0.0)
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=remaining)
            if not ready:
                raise WorkerStartupError(
                    min(pending.values()),
                    f"not ready within {timeout:g}s (HWLAUNCH_STARTUP_TIMEOUT); ranks still "
                    f"starting: {sorted(pending.values())}",
                )
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    results[rank] = ray.get(ref)
                except errors.RayActorError as exc:
                    raise WorkerStartupError(
                        rank, f"the Ray actor died while starting ({ray_reason(exc)})"
                    ) from exc
                except errors.RayError as exc:
                    raise WorkerStartupError(rank, f"{type(exc).__name__}: {exc}") from exc
                on_result(rank, results[rank])
        return results

    # -- RPC -----------------------------------------------------------------------------
    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
        *,
        setup: bool = False,
    ) -> list[Any]:
        payload = dumps((encode_method(method), tuple(args), dict(kwargs or {})))
        with self._rpc_lock:
            group = self._group
            self._raise_if_unusable()
            ray = group.ray
            arg = ray.put(payload) if len(payload) > INLINE_ARGS_LIMIT else payload
            group.busy = True
            try:
                refs = [actor.call.remote(arg) for actor in group.actors]
                return self._gather(refs, method, timeout)
            except KeyboardInterrupt:
                group.shutdown(polite=False)
                raise
            finally:
                group.busy = False

    def _gather(
        self, refs: list[Any], method: str | Callable[..., Any], timeout: float | None
    ) -> list[Any]:
        group = self._group
        ray = group.ray
        errors = importlib.import_module("ray.exceptions")
        pending = {ref: rank for rank, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        failures: dict[int, Failure] = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=remaining)
            if not ready:
                group.shutdown(polite=False, keep_connection=group.on_death is not None)
                raise RpcTimeoutError(method_label(method), sorted(pending.values()), timeout or 0)
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    ok, value = loads(ray.get(ref))
                except errors.RayActorError as exc:
                    raise self._died(rank, exc) from exc
                if ok:
                    results[rank] = value
                else:
                    failures[rank] = value
        raise_first_failure(failures)
        return results

    def _died(self, rank: int, exc: BaseException) -> Exception:
        group = self._group
        died = group.record_death(rank, exc)
        group.shutdown(polite=False, keep_connection=group.on_death is not None)
        if died is None:
            return RuntimeError("this executor was shut down during the call")
        return died

    def _raise_if_unusable(self) -> None:
        group = self._group
        if group.died is not None:
            raise group.died
        if group.closed:
            raise RuntimeError("this executor was shut down; launch a new one")

    def check_health(self) -> None:
        self._raise_if_unusable()
        self.collective_rpc("ping", timeout=30.0)

    def watch_deaths(self, callback: Callable[[WorkerDiedError], None]) -> None:
        self._group.on_death = callback

    def stop_group(self) -> None:
        """Kill the actors and free the placement group; keep the connection for a restart."""
        self._group.shutdown(polite=False, keep_connection=True)

    def shutdown(self) -> None:
        self._finalizer()
        atexit.unregister(self._finalizer)

    @property
    def nodes(self) -> list[RankNode]:
        """Where each rank runs (node id, node IP, pid, local rank), in rank order."""
        return list(self._group.nodes)

    @property
    def pids(self) -> list[int]:
        return [node.pid for node in self._group.nodes]
