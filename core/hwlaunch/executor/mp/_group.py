"""The processes and pipes of one mp executor, and how they are shut down.

Kept apart from the executor object so that the executor's finalizer holds no reference to it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing import connection
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import psutil

from hwlaunch.errors import WorkerDiedError
from hwlaunch.executor.mp import _process_tree as process_tree
from hwlaunch.executor.mp._pipe_channel import Channel
from hwlaunch.executor.mp._shm_channel import ChannelLost
from hwlaunch.executor.state import ClosedState
from hwlaunch.executor.transport._messages import SHUTDOWN, request_head
from hwlaunch.plan import SIGKILL_AFTER

__all__ = ["END_NOW", "EXIT_CODE_WAIT", "WorkerGroup"]

SIGNAL_GRACE = SIGKILL_AFTER  # after SIGTERM before SIGKILL, and after SIGKILL before giving up
# After a fault (a timeout, a death, an interrupt: a stop that is not polite), SIGKILL follows
# SIGTERM this much later: a worker whose Python runs has ended on END_NOW by then, and one that
# holds the GIL in a C call, or is stopped, never acts on SIGTERM (base.TIMEOUT_BOUND).
FAULT_KILL_AFTER = 0.1
EXIT_CODE_WAIT = 1.0  # a worker whose pipe hit EOF is exiting: time to collect its exit code
# Written once per worker on the death pipe before the parent closes it on purpose: "end now".
# EOF without it means the parent died, and a worker runs its own shutdown() first.
END_NOW = b"x"
log = logging.getLogger("hwlaunch")


class WorkerGroup:
    """The processes and pipes of one executor; shut down by the executor or its finalizer.

    Kept apart from the executor object so that the finalizer holds no reference to it.

    Threads that touch a group: the caller's RPC thread (one at a time), the monitor thread,
    and whoever calls ``shutdown()`` (a user thread, the finalizer at exit). ``lock`` guards the
    state they share. The pipes and process sentinels are closed only when no RPC is waiting
    on them: closing a descriptor another thread is polling would let its number be reused
    under that thread, so a shutdown during an RPC leaves the closing to the RPC's thread.
    """

    def __init__(self, world_size: int, shutdown_timeout: float) -> None:
        self.world_size = world_size
        self.shutdown_timeout = shutdown_timeout  # the workers' own shutdown() before SIGTERM
        self.processes: list[BaseProcess] = []
        self.pids: list[int | None] = []
        self.identities: list[psutil.Process | None] = []  # pid + start time, for sweeps
        self.conns: list[Connection] = []
        self.stack_conns: list[Connection] = []  # each worker's stack thread (_stacks)
        self.stack_lock = threading.Lock()  # one stack request at a time on those pipes
        self.channel: Channel | None = None  # carries requests and replies once started
        self.death_w: Connection | None = None
        self.wake_r: Connection | None = None
        self.wake_w: Connection | None = None
        self.monitor: threading.Thread | None = None
        self.lock = threading.Lock()
        self.state = ClosedState()  # closed once shutdown has begun; the first unexpected death
        self.on_death: Callable[[WorkerDiedError], None] | None = None  # the restart controller
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
            if self.state.died is None and not self.state.closed:
                process = self.processes[rank]
                process.join(EXIT_CODE_WAIT)  # it has ended or is ending: collect its exit code
                self.state.record_death(WorkerDiedError(rank, self.pids[rank], process.exitcode))
            died = self.state.died
        self.shutdown(polite=False, wait=wait)
        return died

    def watch(self) -> None:
        """Monitor thread: the first unexpected death shuts the whole group down."""
        assert self.wake_r is not None
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.processes)}
        ready = connection.wait([*sentinels, self.wake_r])
        if self.wake_r in ready or self.state.closed:
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
            first = self.state.close(reason or "shutdown() was called")
            in_rpc = self.rpc_thread is not None
        if not first:
            if wait:
                self.finished.wait(self.shutdown_timeout + 3 * SIGNAL_GRACE)
            return
        try:
            self._stop_workers(polite and not in_rpc and self.state.died is None)
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
        if polite and self.channel is not None:
            deadline = time.monotonic() + self.shutdown_timeout
            with contextlib.suppress(ChannelLost, OSError, TimeoutError):
                self.channel.send(
                    b"", self.check_alive, deadline, head=request_head(SHUTDOWN, 0, None)
                )
            for process in self.processes:
                process.join(max(0.0, deadline - time.monotonic()))
            self._log_escalation(
                f"did not finish its shutdown() within the {self.shutdown_timeout:g}s "
                "shutdown_timeout: SIGTERM"
            )
        if self.death_w is not None:
            # EOF on the death pipe ends a worker even while its main thread is stuck in native
            # code (a rendezvous, a collective) where its Python SIGTERM handler cannot run.
            # END_NOW first: the parent lives, so the worker must not run its shutdown().
            with contextlib.suppress(OSError):
                os.write(self.death_w.fileno(), END_NOW * len(self.processes))
            self.death_w.close()
        self._escalate(SIGNAL_GRACE if polite else FAULT_KILL_AFTER)

    def _escalate(self, grace: float) -> None:
        """SIGTERM, then SIGKILL ``grace`` seconds later to whatever still runs. A stopped
        worker (SIGSTOP) is resumed after its SIGTERM, so that it acts on it (ends its
        descendants, then itself) instead of waiting for the SIGKILL."""
        for step, after in (("terminate", None), ("kill", f"{grace:g}s after SIGTERM")):
            alive = [p for p in self.processes if p.exitcode is None]
            if not alive:
                break
            if after is not None:
                self._log_escalation(f"still running {after}: SIGKILL")
            for process in alive:
                getattr(process, step)()
                if after is None and process.pid is not None:
                    with contextlib.suppress(OSError):
                        os.kill(process.pid, signal.SIGCONT)
            deadline = time.monotonic() + (grace if after is None else SIGNAL_GRACE)
            for process in alive:
                process.join(max(0.0, deadline - time.monotonic()))

    def _log_escalation(self, what: str) -> None:
        """One warning per worker still running: a step of the shutdown schedule."""
        for rank, process in enumerate(self.processes):
            if process.exitcode is None:
                log.warning("hwlaunch: worker rank %d (pid %s) %s", rank, process.pid, what)

    def release(self) -> None:
        """Close the pipes and the process handles (their sentinels). Call under ``lock``."""
        if self.released:
            return
        self.released = True
        pipes: list[Connection | None] = [
            *self.conns,
            *self.stack_conns,
            self.death_w,
            self.wake_r,
            self.wake_w,
        ]
        for pipe in pipes:
            if pipe is not None:
                pipe.close()
        if self.channel is not None:
            self.channel.close()
        for process in self.processes:
            if process.exitcode is not None:  # one that survived SIGKILL keeps its handle
                process.close()

    def check_alive(self) -> None:
        """Raise ChannelLost for the first worker that has ended (a writer's wait stops)."""
        for rank, process in enumerate(self.processes):
            if process.exitcode is not None:
                raise ChannelLost(rank)

    def await_cleanup(self) -> None:
        """A shutdown in progress (after a death, from another thread) ends first, so that an
        error raised after it describes a group whose processes, descendants too, are gone."""
        if self.state.closed:
            self.finished.wait(self.shutdown_timeout + 3 * SIGNAL_GRACE)

    def leave_rpc(self) -> None:
        """The RPC thread is done with the pipes; close them if a shutdown left that to it."""
        with self.lock:
            self.rpc_thread = None
            if self.release_pending:
                self.release()
