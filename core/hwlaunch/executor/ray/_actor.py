"""What runs inside each Ray actor: one rank, hosting the backend's Worker.

Worker-side code: it builds and calls the worker through ``hwlaunch.executor._runtime`` exactly
as the mp child does, so errors and semantics match.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from typing import Any

from hwlaunch.executor import _driver_death as driver_death
from hwlaunch.executor._ports import free_port
from hwlaunch.executor._runtime import Failure, start_worker
from hwlaunch.executor._stacks import thread_stacks
from hwlaunch.executor._worker_signals import install_dispatch
from hwlaunch.executor.ray._actor_output import ActorOutput
from hwlaunch.executor.ray._cluster import import_ray, node_address
from hwlaunch.executor.ray._lifeline import watch as lifeline_watch
from hwlaunch.executor.ray._lifeline import watch_raylet
from hwlaunch.executor.transport.codec import answer
from hwlaunch.plan import Plan
from hwlaunch.worker import Worker

__all__ = ["CONTROL_GROUP", "WATCH_GROUP", "RankActor", "rank_actor_class"]

WATCH_GROUP = "hwlaunch_watch"  # the actors' concurrency group for watch()
CONTROL_GROUP = "hwlaunch_control"  # stacks() and signals, while a call runs
# After the driver's death, rank 0 waits this long at most for the other ranks to end, each
# within its own grace, before it removes the placement group (which ends the rest).
PEERS_WAIT = 120.0


class RankActor:
    """One rank inside a Ray actor process: hosts the backend's Worker."""

    def __init__(
        self,
        rank: int,
        forward_signals: tuple[str, ...],
        lifeline: tuple[str, int],
        placement_group: Any,
    ) -> None:
        self.worker: Worker | None = None
        self.rank = rank
        self.placement_group = placement_group
        self.peers: list[Any] = []  # rank 0: the other ranks' actors
        self.output = ActorOutput()  # first: everything the rank writes goes to the driver
        # Ray builds an actor on its process's main thread, the only one that may install
        # signal handlers; its calls run on others (``hwlaunch.executor._worker_signals``).
        install_dispatch(forward_signals, lambda: self.worker)
        self.raylet = os.getppid()
        try:
            lifeline_watch(lifeline, lambda: driver_death.begin(self._end))
        except OSError:  # the driver is gone already: nobody will end this detached actor
            self._end(1)
        watch_raylet(lambda: driver_death.begin(self._end))

    def place(self, resource: str, want_port: bool) -> dict[str, Any]:
        """Where this actor runs, the devices Ray gave it, and (rank 0) a rendezvous port."""
        ray = import_ray()
        context = ray.get_runtime_context()
        ip = node_address(ray)
        return {
            "node_id": context.get_node_id(),
            "node_ip": ip,
            "pid": os.getpid(),
            "host": socket.gethostname(),
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
        peers: list[Any],
    ) -> Failure | None:
        """Build the worker and run its start-up lifecycle; a failure comes back as data."""
        os.environ.update(env)
        self.peers = peers
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
        driver_death.register(self.worker, rank, plan.shutdown_timeout)
        return None

    def call(self, payload: bytes, keep_value: bool = True) -> bytes:
        """One RPC: ``(ok, result or Failure)``, pickled here so an unpicklable result is a
        WorkerError, as under the mp executor."""
        reply: bytes = answer(self.worker, payload, keep_value=keep_value)
        return reply

    def collect_output(self, wait: float) -> list[tuple[int, bytes]]:
        """The rank's output since the last call (``hwlaunch.executor.ray._output``); runs in
        a concurrency group of its own, beside calls."""
        return self.output.collect(wait)

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()

    def deliver_signal(self, signum: int) -> None:
        """A forwarded signal, sent to this process: Python runs its handler on the main
        thread, even while a call runs on another."""
        os.kill(os.getpid(), signum)

    def stacks(self) -> str:
        """Every thread's stack in this actor's process, read from the control concurrency
        group's thread while calls run (or hang) on the default one."""
        return thread_stacks()

    def watch(self) -> None:
        """Never returns: Ray fails this call when the actor dies (its process killed, its node
        lost). It runs in a concurrency group of its own, so calls still run one at a time."""
        threading.Event().wait()

    def _end(self, code: int) -> None:
        """The driver is gone and this rank's shutdown() has run (or its grace passed): end
        this process; rank 0 first waits for the other ranks to end theirs, then removes the
        placement group, which ends any rank still there."""
        if self.rank == 0 and os.getppid() == self.raylet:  # else Ray went with its raylet
            # In a thread: a Ray that is going away may not answer.
            remover = threading.Thread(target=self._remove_group_last, daemon=True)
            remover.start()
            remover.join(PEERS_WAIT + 5.0)
        os._exit(code)

    def _remove_group_last(self) -> None:
        ray = import_ray()
        with contextlib.suppress(Exception):
            refs = [
                peer.watch.options(concurrency_group=WATCH_GROUP).remote() for peer in self.peers
            ]
            ray.wait(refs, num_returns=len(refs), timeout=PEERS_WAIT)
        with contextlib.suppress(Exception):
            ray.util.remove_placement_group(self.placement_group)


def rank_actor_class(backend: str, rank: int) -> type[RankActor]:
    """RankActor under the name ``hwlaunch_<backend>_rank<R>``: Ray titles each actor process
    ``ray::<class name>.<method>`` (and its kernel name after it), so ``ps`` and ``top`` show
    which rank an actor is, and Ray's tools still see one of its workers."""
    name = f"hwlaunch_{backend}_rank{rank}"
    return type(name, (RankActor,), {"__qualname__": name, "__doc__": RankActor.__doc__})
