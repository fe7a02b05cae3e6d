"""What runs inside each Ray actor: one rank, hosting the backend's Worker.

Worker-side code: it builds and calls the worker through ``hwlaunch.executor._runtime`` exactly
as the mp child does, so errors and semantics match.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

from hwlaunch.executor._runtime import Failure, answer, start_worker
from hwlaunch.executor._stacks import thread_stacks
from hwlaunch.executor._worker_signals import install_dispatch
from hwlaunch.executor.base import free_port
from hwlaunch.executor.ray._cluster import import_ray
from hwlaunch.executor.ray._output import ActorOutput
from hwlaunch.plan import Plan
from hwlaunch.worker import Worker

__all__ = ["RankActor", "rank_actor_class"]


class RankActor:
    """One rank inside a Ray actor process: hosts the backend's Worker."""

    def __init__(self, forward_signals: tuple[str, ...] = ()) -> None:
        self.worker: Worker | None = None
        self.output = ActorOutput()  # first: everything the rank writes goes to the driver
        # Ray builds an actor on its process's main thread, the only one that may install
        # signal handlers; its calls run on others (``hwlaunch.executor._worker_signals``).
        install_dispatch(forward_signals, lambda: self.worker)

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


def rank_actor_class(backend: str, rank: int) -> type[RankActor]:
    """RankActor under the name ``hwlaunch_<backend>_rank<R>``: Ray titles each actor process
    ``ray::<class name>.<method>`` (and its kernel name after it), so ``ps`` and ``top`` show
    which rank an actor is, and Ray's tools still see one of its workers."""
    name = f"hwlaunch_{backend}_rank{rank}"
    return type(name, (RankActor,), {"__qualname__": name, "__doc__": RankActor.__doc__})
