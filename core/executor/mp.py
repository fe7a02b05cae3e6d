"""The mp executor: local worker processes that never hang, never orphan, never go daemonic.

Workers are started with ``multiprocessing.get_context(plan.start_method)``: the global start
method and the parent's ``os.environ`` stay untouched. Workers are not daemonic (so they may
start children of their own); the death pipe and PR_SET_PDEATHSIG tie them to the parent
instead. A monitor thread watches the process sentinels, so a worker that dies fails every
RPC at once and the others are shut down.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import pickle
import threading
import time
from collections.abc import Callable
from multiprocessing import connection
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from multiprocessing.util import Finalize
from typing import Any

from hwlaunch.errors import RpcTimeoutError, WorkerDiedError, WorkerStartupError
from hwlaunch.executor.base import (
    Executor,
    StatusCallback,
    free_port,
    raise_first_failure,
    worker_environment,
)
from hwlaunch.executor.forkserver import prepare_forkserver
from hwlaunch.executor.mp_child import worker_main
from hwlaunch.plan import Plan
from hwlaunch.worker_runtime import (
    Failure,
    dumps,
    encode_extension,
    encode_method,
    loads,
    method_label,
)

DEFAULT_STARTUP_TIMEOUT = 600.0
SHUTDOWN_GRACE = 5.0


class _WorkerGroup:
    """The processes and pipes of one executor; shut down by the executor or its finalizer.

    Kept apart from the executor object so that the finalizer holds no reference to it.
    """

    def __init__(self, world_size: int) -> None:
        self.processes: list[BaseProcess] = []
        self.conns: list[Connection] = []
        self.death_w: Connection | None = None
        self.died: WorkerDiedError | None = None
        self.closed = False
        self.busy = False
        self.lock = threading.Lock()
        self.wake_r: Connection | None = None
        self.wake_w: Connection | None = None
        self.monitor: threading.Thread | None = None
        self.world_size = world_size

    def death_of(self, rank: int) -> WorkerDiedError:
        process = self.processes[rank]
        process.join(0.1)  # the sentinel fired: collect the exit code
        return WorkerDiedError(rank, process.pid, process.exitcode)

    def watch(self) -> None:
        """Monitor thread: the first unexpected death shuts the whole group down."""
        assert self.wake_r is not None
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.processes)}
        while True:
            ready = connection.wait([*sentinels, self.wake_r])
            if self.wake_r in ready or self.closed:
                return
            rank = min(sentinels[s] for s in ready if isinstance(s, int))
            if self.died is None:
                self.died = self.death_of(rank)
            self.shutdown(polite=False)
            return

    def shutdown(self, polite: bool = True) -> None:
        """Ask, then SIGTERM, then SIGKILL; close every pipe. Idempotent, never hangs."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
        if self.wake_w is not None:
            try:
                self.wake_w.send_bytes(b"stop")
            except OSError:
                pass
        if polite and not self.busy and self.died is None:
            for conn in self.conns:
                try:
                    conn.send_bytes(pickle.dumps(("shutdown", 0, b"")))
                except OSError:
                    pass
            deadline = time.monotonic() + SHUTDOWN_GRACE
            for process in self.processes:
                process.join(max(0.0, deadline - time.monotonic()))
        for signal_step, wait in (("terminate", 2.0), ("kill", 2.0)):
            alive = [p for p in self.processes if p.is_alive()]
            if not alive:
                break
            for process in alive:
                getattr(process, signal_step)()
            deadline = time.monotonic() + wait
            for process in alive:
                process.join(max(0.0, deadline - time.monotonic()))
        pipes: list[Connection | None] = [*self.conns, self.death_w, self.wake_r, self.wake_w]
        for pipe in pipes:
            if pipe is not None:
                pipe.close()
        for process in self.processes:
            if not process.is_alive():
                process.close()
        if self.monitor is not None and self.monitor is not threading.current_thread():
            self.monitor.join(5.0)


class MultiprocExecutor(Executor):
    """Workers as local processes, one per rank, on one node."""

    def __init__(
        self,
        plan: Plan,
        worker_extension: type | str | None = None,
        *,
        init_distributed: bool = True,
        startup_timeout: float | None = None,
        on_status: StatusCallback | None = None,
    ) -> None:
        if plan.start_method is None:
            raise ValueError("the mp executor needs a plan with a start method")
        self.plan = plan
        self.warnings: list[str] = []
        self._rpc_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._group = _WorkerGroup(plan.world_size)
        self._finalizer = Finalize(self, self._group.shutdown, exitpriority=50)
        ctx = multiprocessing.get_context(plan.start_method)
        if plan.start_method == "forkserver":
            self.warnings += prepare_forkserver(ctx, plan.preload)
        try:
            self._start(
                ctx,
                encode_extension(worker_extension),
                init_distributed,
                startup_timeout
                or float(os.environ.get("HWLAUNCH_STARTUP_TIMEOUT", DEFAULT_STARTUP_TIMEOUT)),
                on_status,
            )
        except BaseException:
            self._group.shutdown(polite=False)
            raise

    # -- start-up ------------------------------------------------------------------------
    def _start(
        self,
        ctx: BaseContext,
        extension: bytes | str | None,
        init_distributed: bool,
        timeout: float,
        on_status: StatusCallback | None,
    ) -> None:
        group, plan = self._group, self.plan
        master_addr, master_port = "127.0.0.1", free_port()
        death_r, death_w = ctx.Pipe(duplex=False)
        group.death_w = death_w
        on_main_thread = threading.current_thread() is threading.main_thread()
        for rank in range(plan.world_size):
            parent_conn, child_conn = ctx.Pipe()
            group.conns.append(parent_conn)
            inherited: tuple[int, ...] = ()
            if plan.start_method == "fork":
                inherited = (death_w.fileno(), *(c.fileno() for c in group.conns))
            process = ctx.Process(  # type: ignore[attr-defined]
                target=worker_main,
                name=f"hwlaunch-{plan.backend}-rank{rank}",
                kwargs=dict(
                    rank=rank,
                    local_rank=rank,
                    plan=plan,
                    extension=extension,
                    master_addr=master_addr,
                    master_port=master_port,
                    init_distributed=init_distributed,
                    env=worker_environment(plan, rank, rank, master_addr, master_port),
                    conn=child_conn,
                    death_r=death_r,
                    inherited_fds=inherited,
                    pdeathsig=on_main_thread or plan.start_method == "forkserver",
                    parent_pid=None if plan.start_method == "forkserver" else os.getpid(),
                ),
                daemon=False,
            )
            process.start()
            group.processes.append(process)
            child_conn.close()
            if on_status:
                on_status(rank, "started")
        death_r.close()
        self._await_ready(timeout, on_status)
        group.wake_r, group.wake_w = ctx.Pipe(duplex=False)
        group.monitor = threading.Thread(target=group.watch, name="hwlaunch-monitor", daemon=True)
        group.monitor.start()

    def _await_ready(self, timeout: float, on_status: StatusCallback | None) -> None:
        group = self._group
        pending = dict(enumerate(group.conns))
        sentinels = {p.sentinel: rank for rank, p in enumerate(group.processes)}
        deadline = time.monotonic() + timeout
        while pending:
            remaining = deadline - time.monotonic()
            ready = connection.wait([*pending.values(), *sentinels], timeout=max(remaining, 0))
            if not ready:
                rank = min(pending)
                raise WorkerStartupError(
                    rank,
                    f"not ready within {timeout:g}s (HWLAUNCH_STARTUP_TIMEOUT); "
                    f"ranks still starting: {sorted(pending)}",
                )
            for obj in ready:
                if isinstance(obj, int):
                    continue
                rank = group.conns.index(obj)  # type: ignore[arg-type]
                try:
                    kind, value = pickle.loads(obj.recv_bytes())  # type: ignore[union-attr]
                except (EOFError, OSError):
                    continue  # the process died; its sentinel tells how
                if kind == "startup_error":
                    failure: Failure = value
                    raise WorkerStartupError(
                        rank, f"{failure.exc_type}: {failure.message}", failure.traceback
                    )
                del pending[rank]
                if on_status:
                    on_status(rank, "ready")
            for obj in ready:
                dead = sentinels.get(obj) if isinstance(obj, int) else None
                if dead is not None and dead in pending and not group.conns[dead].poll():
                    died = group.death_of(dead)
                    raise WorkerStartupError(dead, f"the process ended while starting: {died}")

    # -- RPC -----------------------------------------------------------------------------
    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        payload = dumps((encode_method(method), tuple(args), dict(kwargs or {})))
        with self._rpc_lock:
            group = self._group
            self._raise_if_unusable()
            rpc_id = next(self._ids)
            request = pickle.dumps(("call", rpc_id, payload))
            group.busy = True
            try:
                results = self._exchange(rpc_id, request, method, timeout)
            except KeyboardInterrupt:
                group.shutdown(polite=False)
                raise
            group.busy = False
            return results

    def _exchange(
        self,
        rpc_id: int,
        request: bytes,
        method: str | Callable[..., Any],
        timeout: float | None,
    ) -> list[Any]:
        group = self._group
        for rank, conn in enumerate(group.conns):
            try:
                conn.send_bytes(request)
            except OSError:
                raise self._died(rank) from None
        results: list[Any] = [None] * group.world_size
        failures: dict[int, Failure] = {}
        pending = dict(enumerate(group.conns))
        by_conn = {id(conn): rank for rank, conn in pending.items()}
        sentinels = {p.sentinel: rank for rank, p in enumerate(group.processes)}
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
            try:
                ready = connection.wait([*pending.values(), *sentinels], timeout=remaining)
            except (OSError, ValueError):  # the monitor closed the group under us
                self._raise_if_unusable()
                raise
            if not ready:
                group.shutdown(polite=False)
                raise RpcTimeoutError(method_label(method), sorted(pending), timeout or 0.0)
            for obj in ready:
                if isinstance(obj, int):
                    continue
                rank = by_conn[id(obj)]
                try:
                    reply_id, ok, value = loads(obj.recv_bytes())  # type: ignore[union-attr]
                except (EOFError, OSError):
                    raise self._died(rank) from None
                if reply_id != rpc_id:
                    continue
                del pending[rank]
                if ok:
                    results[rank] = value
                else:
                    failures[rank] = value
            for obj in ready:
                if isinstance(obj, int) and obj in sentinels:
                    raise self._died(sentinels[obj])
        raise_first_failure(failures)
        return results

    def _died(self, rank: int) -> WorkerDiedError:
        group = self._group
        if group.died is None:
            group.died = group.death_of(rank)
        group.shutdown(polite=False)
        return group.died

    def _raise_if_unusable(self) -> None:
        group = self._group
        if group.died is not None:
            raise group.died
        if group.closed:
            raise RuntimeError("this executor was shut down; launch a new one")

    def check_health(self) -> None:
        self._raise_if_unusable()
        for rank, process in enumerate(self._group.processes):
            if not process.is_alive():
                raise self._died(rank)
        self.collective_rpc("ping", timeout=30.0)

    def shutdown(self) -> None:
        self._finalizer()

    @property
    def pids(self) -> list[int | None]:
        return [p.pid for p in self._group.processes]
