"""The mp executor: local worker processes that never hang, never orphan, never go daemonic.

Workers are started with ``multiprocessing.get_context(plan.start_method)``: the global start
method and the parent's ``os.environ`` stay untouched. Workers are not daemonic (so they may
start children of their own); the death pipe and PR_SET_PDEATHSIG tie them to the parent
instead. A monitor thread watches the process sentinels, so a worker that dies fails every
RPC at once and the others are shut down.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing import connection
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from multiprocessing.util import Finalize
from typing import Any

import psutil

from hwlaunch.errors import (
    RpcTimeoutError,
    WorkerDiedError,
    WorkerStartupError,
    describe_exitcode,
)
from hwlaunch.executor import process_tree
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
SHUTDOWN_GRACE = 5.0  # seconds a polite shutdown waits before SIGTERM
SIGNAL_GRACE = 2.0  # seconds after SIGTERM before SIGKILL, and after SIGKILL before giving up
EXIT_CODE_WAIT = 1.0  # a worker whose pipe hit EOF is exiting: time to collect its exit code


@contextlib.contextmanager
def _global_start_method_kept() -> Iterator[None]:
    """Leave multiprocessing's global start method unset if it was.

    Starting a spawn or forkserver child asks ``multiprocessing.get_start_method()`` (CPython's
    ``spawn.get_preparation_data``), which fixes the global default as a side effect; a later
    ``multiprocessing.set_start_method()`` in the user's program would then fail with "context
    has already been set".
    """
    default: Any = multiprocessing.context._default_context  # private: no public way to unset
    was_unset = default._actual_context is None
    try:
        yield
    finally:
        if was_unset:
            default._actual_context = None


class _WorkerGroup:
    """The processes and pipes of one executor; shut down by the executor or its finalizer.

    Kept apart from the executor object so that the finalizer holds no reference to it.

    Threads that touch a group: the caller's RPC thread (one at a time), the monitor thread,
    and whoever calls ``shutdown()`` (a user thread, the finalizer at exit). ``lock`` guards the
    state they share. The pipes and process sentinels are closed only when no RPC is waiting
    on them: closing a descriptor another thread is polling would let its number be reused
    under that thread, so a shutdown during an RPC leaves the closing to the RPC's thread.
    """

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.processes: list[BaseProcess] = []
        self.pids: list[int | None] = []
        self.identities: list[psutil.Process | None] = []  # pid + start time, for sweeps
        self.conns: list[Connection] = []
        self.death_w: Connection | None = None
        self.wake_r: Connection | None = None
        self.wake_w: Connection | None = None
        self.monitor: threading.Thread | None = None
        self.lock = threading.Lock()
        self.died: WorkerDiedError | None = None  # the first unexpected death
        self.on_death: Callable[[WorkerDiedError], None] | None = None
        self.closing = False  # shutdown has begun
        self.closed_because = "shutdown() was called"
        self.finished = threading.Event()  # shutdown has ended: every worker is gone
        self.rpc_thread: int | None = None  # ident of the thread inside collective_rpc
        self.release_pending = False  # the RPC thread closes the pipes when it leaves
        self.released = False

    # -- deaths --------------------------------------------------------------------------
    def record_death(self, rank: int, *, wait: bool = True) -> WorkerDiedError | None:
        """A worker ended on its own: remember the first such death and shut the group down.

        Returns None when the group was already closing on request (a worker ending then is
        the shutdown's doing, not a death). With ``wait``, returns once every worker is gone.
        """
        with self.lock:
            if self.died is None and not self.closing:
                process = self.processes[rank]
                process.join(EXIT_CODE_WAIT)  # it has ended or is ending: collect its exit code
                self.died = WorkerDiedError(rank, self.pids[rank], process.exitcode)
            died = self.died
        self.shutdown(polite=False, wait=wait)
        return died

    def watch(self) -> None:
        """Monitor thread: the first unexpected death shuts the whole group down."""
        assert self.wake_r is not None
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.processes)}
        ready = connection.wait([*sentinels, self.wake_r])
        if self.wake_r in ready or self.closing:
            return
        rank = min(sentinels[s] for s in ready if isinstance(s, int) and s in sentinels)
        # Not waiting: a shutdown already in progress elsewhere joins this thread.
        died = self.record_death(rank, wait=False)
        if died is not None and self.on_death is not None:
            self.on_death(died)

    # -- shutdown ------------------------------------------------------------------------
    def shutdown(
        self, polite: bool = True, *, wait: bool = True, reason: str | None = None
    ) -> None:
        """Ask, then SIGTERM, then SIGKILL; close every pipe. Idempotent, never hangs.

        A second caller while a shutdown is in progress waits for it to end (with ``wait``),
        so that when any shutdown returns, the workers are gone.
        """
        with self.lock:
            first = not self.closing
            self.closing = True
            if first and reason is not None:
                self.closed_because = reason
            in_rpc = self.rpc_thread is not None
        if not first:
            if wait:
                self.finished.wait(SHUTDOWN_GRACE + 3 * SIGNAL_GRACE)
            return
        try:
            self._stop_workers(polite and not in_rpc and self.died is None)
            if self.monitor is not None and self.monitor is not threading.current_thread():
                self.monitor.join(SIGNAL_GRACE)
            with self.lock:
                if self.rpc_thread in (None, threading.get_ident()):
                    self.release()
                else:
                    self.release_pending = True
        finally:
            self.finished.set()

    def _stop_workers(self, polite: bool) -> None:
        # Each worker kills its own descendants on the way out; what a worker that was killed
        # (or that could not finish) left behind is swept here once it has ended.
        seen = [process_tree.descendants(worker) for worker in self.identities]
        try:
            self._end_workers(polite)
        finally:
            for worker, found in zip(self.identities, seen, strict=True):
                process_tree.sweep(worker, found)

    def _end_workers(self, polite: bool) -> None:
        if self.wake_w is not None:
            with contextlib.suppress(OSError):
                self.wake_w.send_bytes(b"stop")  # the monitor stops watching
        if polite:
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.send_bytes(pickle.dumps(("shutdown", 0, b"")))
            deadline = time.monotonic() + SHUTDOWN_GRACE
            for process in self.processes:
                process.join(max(0.0, deadline - time.monotonic()))
        if self.death_w is not None:
            # EOF on the death pipe ends a worker even while its main thread is stuck in native
            # code (a rendezvous, a collective) where its Python SIGTERM handler cannot run.
            self.death_w.close()
        for step in ("terminate", "kill"):
            alive = [p for p in self.processes if p.exitcode is None]
            if not alive:
                break
            for process in alive:
                getattr(process, step)()
            deadline = time.monotonic() + SIGNAL_GRACE
            for process in alive:
                process.join(max(0.0, deadline - time.monotonic()))

    def release(self) -> None:
        """Close the pipes and the process handles (their sentinels). Call under ``lock``."""
        if self.released:
            return
        self.released = True
        pipes: list[Connection | None] = [*self.conns, self.death_w, self.wake_r, self.wake_w]
        for pipe in pipes:
            if pipe is not None:
                pipe.close()
        for process in self.processes:
            if process.exitcode is not None:  # one that survived SIGKILL keeps its handle
                process.close()

    def leave_rpc(self) -> None:
        """The RPC thread is done with the pipes; close them if a shutdown left that to it."""
        with self.lock:
            self.rpc_thread = None
            if self.release_pending:
                self.release()


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
        # exitpriority >= 0: runs in multiprocessing's atexit hook *before* it joins every
        # non-daemonic child, so that join finds the workers already gone instead of hanging.
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
        # fork and spawn children start from this process's environment as it is now; the fork
        # server's children from the server's, as it was when the server started. Sending ours
        # makes every start method see the same variables.
        forkserver = plan.start_method == "forkserver"
        environ = dict(os.environ) if forkserver else {}
        # One node: gloo's sockets stay on loopback (by default they bind the address the host
        # name resolves to, often an external one). The user's own setting wins.
        if sys.platform.startswith("linux") and "GLOO_SOCKET_IFNAME" not in os.environ:
            environ["GLOO_SOCKET_IFNAME"] = "lo"
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
                    env=environ | worker_environment(plan, rank, rank, master_addr, master_port),
                    replace_environ=forkserver,
                    conn=child_conn,
                    death_r=death_r,
                    inherited_fds=inherited,
                    # The kernel sends PR_SET_PDEATHSIG when the *thread* that forked the child
                    # ends: only safe from the main thread, or from the fork server's.
                    pdeathsig=on_main_thread or forkserver,
                    parent_pid=None if forkserver else os.getpid(),
                ),
                daemon=False,
            )
            with _global_start_method_kept():
                process.start()
            group.processes.append(process)
            group.pids.append(process.pid)
            group.identities.append(process_tree.identify(process.pid))
            child_conn.close()
            if on_status:
                on_status(rank, "started")
        death_r.close()
        self._await_ready(timeout, on_status)
        group.wake_r, group.wake_w = ctx.Pipe(duplex=False)
        group.monitor = threading.Thread(target=group.watch, name="hwlaunch-monitor", daemon=True)
        group.monitor.start()

    def _await_ready(self, timeout: float, on_status: StatusCallback | None) -> None:
        """Wait for every rank's ready message; the first failure raises WorkerStartupError."""
        group = self._group
        by_conn = {id(conn): rank for rank, conn in enumerate(group.conns)}
        by_sentinel = {p.sentinel: rank for rank, p in enumerate(group.processes)}
        pending = set(range(group.world_size))
        deadline = time.monotonic() + timeout
        while pending:
            waitables: list[Any] = [group.conns[r] for r in sorted(pending)]
            waitables += [s for s, r in by_sentinel.items() if r in pending]
            ready = connection.wait(waitables, timeout=max(deadline - time.monotonic(), 0))
            if not ready:
                raise WorkerStartupError(
                    min(pending),
                    f"not ready within {timeout:g}s (HWLAUNCH_STARTUP_TIMEOUT); "
                    f"ranks still starting: {sorted(pending)}",
                )
            for obj in ready:
                if isinstance(obj, int):
                    rank = by_sentinel[obj]
                    if rank in pending and not group.conns[rank].poll():
                        raise self._startup_death(rank)
                    continue  # its last message (or EOF) is read from its pipe
                rank = by_conn[id(obj)]
                if rank not in pending:
                    continue
                try:
                    kind, value = pickle.loads(group.conns[rank].recv_bytes())
                except (EOFError, OSError):
                    raise self._startup_death(rank) from None
                if kind == "startup_error":
                    failure: Failure = value
                    raise WorkerStartupError(
                        rank, f"{failure.exc_type}: {failure.message}", failure.traceback
                    )
                pending.discard(rank)
                if on_status:
                    on_status(rank, "ready")

    def _startup_death(self, rank: int) -> WorkerStartupError:
        process = self._group.processes[rank]
        process.join(EXIT_CODE_WAIT)
        return WorkerStartupError(
            rank,
            f"the process (pid {process.pid}) ended while starting, without a Python "
            f"exception: {describe_exitcode(process.exitcode)}",
        )

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
            self._await_cleanup()
            with group.lock:
                self._raise_if_unusable()
                group.rpc_thread = threading.get_ident()
            try:
                rpc_id = next(self._ids)
                return self._exchange(
                    rpc_id, pickle.dumps(("call", rpc_id, payload)), method, timeout
                )
            except BaseException as exc:
                if not isinstance(exc, Exception):
                    # KeyboardInterrupt (or SystemExit) mid-exchange: replies are half read, so
                    # the pipes are out of step; the workers cannot be reused.
                    why = f"collective_rpc {method_label(method)!r} was interrupted by {type(exc).__name__}"
                    group.shutdown(polite=False, reason=why)
                raise
            finally:
                group.leave_rpc()

    def _exchange(
        self,
        rpc_id: int,
        request: bytes,
        method: str | Callable[..., Any],
        timeout: float | None,
    ) -> list[Any]:
        group = self._group
        label = method_label(method)
        for rank, conn in enumerate(group.conns):
            try:
                conn.send_bytes(request)
            except OSError:
                raise self._lost(rank, label) from None
        results: list[Any] = [None] * group.world_size
        failures: dict[int, Failure] = {}
        pending = dict(enumerate(group.conns))
        by_conn = {id(conn): rank for rank, conn in pending.items()}
        sentinels = {p.sentinel: rank for rank, p in enumerate(group.processes)}
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
            ready = connection.wait([*pending.values(), *sentinels], timeout=remaining)
            if not ready:
                group.shutdown(polite=False, reason=f"collective_rpc {label!r} timed out")
                raise RpcTimeoutError(label, sorted(pending), timeout or 0.0)
            for obj in ready:
                if isinstance(obj, int):
                    continue
                rank = by_conn[id(obj)]
                try:
                    data = pending[rank].recv_bytes()
                except (EOFError, OSError):
                    raise self._lost(rank, label) from None
                try:
                    reply_id, ok, value = loads(data)
                except Exception as exc:  # e.g. a result whose class the parent cannot import
                    reply_id, ok, value = rpc_id, False, Failure.current(exc)
                if reply_id != rpc_id:
                    continue
                del pending[rank]
                if ok:
                    results[rank] = value
                else:
                    failures[rank] = value
            for obj in ready:
                if isinstance(obj, int):
                    raise self._lost(sentinels[obj], label)
        raise_first_failure(failures)
        return results

    def _lost(self, rank: int, label: str) -> Exception:
        """A worker's pipe or process ended during an RPC: its death, or our own shutdown."""
        died = self._group.record_death(rank)
        if died is not None:
            return died
        return RuntimeError(
            f"the executor was shut down ({self._group.closed_because}) while collective_rpc "
            f"{label!r} was running"
        )

    def _await_cleanup(self) -> None:
        """A shutdown in progress (after a death, from another thread) ends first, so that an
        error raised here describes a group whose processes, descendants too, are gone."""
        group = self._group
        if group.closing:
            group.finished.wait(SHUTDOWN_GRACE + 3 * SIGNAL_GRACE)

    def _raise_if_unusable(self) -> None:
        group = self._group
        if group.died is not None:
            raise group.died
        if group.closing:
            raise RuntimeError(
                f"this executor was shut down ({group.closed_because}); launch a new one"
            )

    def check_health(self) -> None:
        group = self._group
        self._await_cleanup()
        with group.lock:
            self._raise_if_unusable()
            ended = [r for r, p in enumerate(group.processes) if p.exitcode is not None]
        if ended:
            raise self._lost(ended[0], "check_health")
        self.collective_rpc("ping", timeout=30.0)

    def watch_deaths(self, callback: Callable[[WorkerDiedError], None]) -> None:
        self._group.on_death = callback

    def shutdown(self) -> None:
        self._finalizer()  # runs the group's shutdown once and unregisters it
        self._group.shutdown()  # returns at once, or waits for a shutdown in progress

    @property
    def pids(self) -> list[int | None]:
        """The workers' process ids, in rank order (kept after shutdown, for diagnostics)."""
        return list(self._group.pids)
