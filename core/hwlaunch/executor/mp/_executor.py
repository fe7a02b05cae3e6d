"""The mp executor: local worker processes that never hang, never orphan, never go daemonic.

Workers are started through the plan's start method object (``plan.start_kind``: its
multiprocessing context, or hwlaunch's fork server where it has one): the global start
method and the parent's ``os.environ`` stay untouched. Workers are not daemonic (so they may
start children of their own); the death pipe and PR_SET_PDEATHSIG tie them to the parent
instead. A monitor thread watches the process sentinels, so a worker that dies fails every
RPC at once and the others are shut down.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from multiprocessing.util import Finalize
from typing import TYPE_CHECKING, Any

from hwlaunch.errors import WorkerDiedError
from hwlaunch.executor._runtime import Failure, Request
from hwlaunch.executor.base import (
    Executor,
    ExecutorOptions,
)
from hwlaunch.executor.mp._group import WorkerGroup
from hwlaunch.executor.mp._output_pipes import OutputPipes
from hwlaunch.executor.mp._pipe_channel import Channel
from hwlaunch.executor.mp._room import out_of_room
from hwlaunch.executor.mp._shm_channel import ChannelLost, ShmChannel
from hwlaunch.executor.mp._stack_requests import request_stacks
from hwlaunch.executor.mp._start import GroupStart
from hwlaunch.executor.transport._callables import CachedPickle
from hwlaunch.executor.transport._messages import CALL, request_head
from hwlaunch.executor.transport.codec import FRAMES
from hwlaunch.plan import Plan

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["MultiprocExecutor"]

_decode_reply = FRAMES.decode_reply  # bound once: the hot path passes it on every call


class MultiprocExecutor(Executor):
    """Workers as local processes, one per rank, on one node, with the plan's start method."""

    def __init__(
        self,
        plan: Plan,
        worker_extension: type | str | None = None,
        **options: Unpack[ExecutorOptions],
    ) -> None:
        if plan.start_method is None:
            raise ValueError("the mp executor needs a plan with a start method")
        super().__init__(plan, worker_extension, **options)
        self._rpc_id = 0
        self._sentinels: list[int] = []  # the workers' process sentinels, in rank order
        self._group = WorkerGroup(plan.world_size, plan.shutdown_timeout)
        # exitpriority >= 0: runs in multiprocessing's atexit hook *before* it joins every
        # non-daemonic child, so that join finds the workers already gone instead of hanging.
        self._finalizer = Finalize(self, self._group.shutdown, exitpriority=50)
        self._output = OutputPipes(self.plan)  # self.plan: with its log run directory
        # After the shutdown above (lower priority runs later): the workers' last lines.
        self._output_finalizer = Finalize(self, self._output.close, exitpriority=49)

    @property
    def pids(self) -> list[int | None]:
        """The workers' process ids, in rank order (kept after shutdown, for diagnostics)."""
        return list(self._group.pids)

    @property
    def rpc_spin(self) -> float | None:
        """Seconds a waiting side of the shm channel polls before it blocks (None: pipes)."""
        channel = self._group.channel
        return channel.spin if isinstance(channel, ShmChannel) else None

    # -- start-up ------------------------------------------------------------------------
    def start_ranks(self, extension: bytes | str | None, init_distributed: bool) -> None:
        """Start every worker, then the output and monitor threads. A process, pipe or thread
        that cannot be made for lack of room is the WorkerStartupError of the rank being
        started, naming the limit (``_room``)."""
        start = GroupStart(self.plan, self._group, self._output, self.report_status)
        try:
            start.processes(extension, init_distributed)
            self._output.start()
            start.await_ready(self.startup_timeout, self.startup_timed_out)
            self._start_monitor()
        except (OSError, RuntimeError, EOFError) as exc:
            room = out_of_room(start.starting, exc)
            if room is None:
                raise
            raise room from exc

    def _start_monitor(self) -> None:
        group = self._group
        self._sentinels = [process.sentinel for process in group.processes]
        group.wake_r, group.wake_w = multiprocessing.Pipe(duplex=False)
        monitor = threading.Thread(target=group.watch, name="hwlaunch-monitor", daemon=True)
        monitor.start()
        group.monitor = monitor

    # -- RPC -----------------------------------------------------------------------------
    def exchange(
        self, request: Request, label: str, timeout: float | None, reply_rank: int | None
    ) -> tuple[list[Any], dict[int, Failure]]:
        deadline = None if timeout is None else time.monotonic() + timeout
        channel = self._enter_rpc(label)
        try:
            rpc_id = self._send(channel, request, label, timeout, deadline, reply_rank)
            return self._collect(channel, rpc_id, label, timeout, deadline)
        finally:
            self._group.leave_rpc()

    def send_request(
        self, request: Request, label: str, timeout: float | None, reply_rank: int | None
    ) -> Callable[[], tuple[list[Any], dict[int, Failure]]]:
        deadline = None if timeout is None else time.monotonic() + timeout
        channel = self._enter_rpc(label)
        try:
            rpc_id = self._send(channel, request, label, timeout, deadline, reply_rank)
        finally:
            self._group.leave_rpc()

        def collect() -> tuple[list[Any], dict[int, Failure]]:
            channel = self._enter_rpc(label)  # the group may have closed since the send
            try:
                return self._collect(channel, rpc_id, label, timeout, deadline)
            finally:
                self._group.leave_rpc()

        return collect

    def _send(
        self,
        channel: Channel,
        request: Request,
        label: str,
        timeout: float | None,
        deadline: float | None,
        reply_rank: int | None,
    ) -> int:
        """Send the call to every rank; returns its id, which its replies carry."""
        group = self._group
        method = request[0]
        # A cached callable travels apart, in the header (by digest once the workers hold it).
        cached = type(method) is CachedPickle
        payload = FRAMES.encode_request((None, *request[1:]) if cached else request)
        self._rpc_id = rpc_id = self._rpc_id + 1
        if cached:  # its digest (and its form, the first time); by name: nothing to look up
            head = request_head(CALL, rpc_id, reply_rank, *channel.callables.reference(method))
        else:
            head = request_head(CALL, rpc_id, reply_rank)
        try:
            channel.send(payload, group.check_alive, deadline, head=head)
        except ChannelLost as lost:
            raise self._lost(lost.rank, label) from None
        except TimeoutError:
            raise self.timed_out(label, list(range(group.world_size)), timeout) from None
        return rpc_id

    def _enter_rpc(self, label: str) -> Channel:
        """This thread uses the channel now (a shutdown elsewhere leaves closing it to us);
        returns the channel. Raises the first death, or the shutdown, that closed the group."""
        group = self._group
        if group.state.closed:
            group.await_cleanup()
        with group.lock:
            if group.state.closed:
                raise group.state.died or self.closed_during(label)
            group.rpc_thread = threading.get_ident()
        assert group.channel is not None
        return group.channel

    def _collect(
        self,
        channel: Channel,
        rpc_id: int,
        label: str,
        timeout: float | None,
        deadline: float | None,
    ) -> tuple[list[Any], dict[int, Failure]]:
        """Take call ``rpc_id``'s replies, in whatever order they come, then what it printed.

        The hot path of every call: no helper objects per call, one channel receive when every
        rank answers within the channel's polling window.
        """
        group, sentinels = self._group, self._sentinels
        results: list[Any] = [None] * group.world_size
        failures: dict[int, Failure] = {}
        pending = list(range(group.world_size))
        self.waiting_on = pending  # what the stall watchdog names
        while pending:
            if deadline is not None and time.monotonic() >= deadline:
                raise self.timed_out(label, pending, timeout)
            try:
                replies, ended = channel.receive(pending, deadline, sentinels, _decode_reply)
            except ChannelLost as lost:
                raise self._lost(lost.rank, label) from None
            for rank, (reply_id, ok, value) in replies:  # replies first: one may answer, then end
                if reply_id not in (None, rpc_id):
                    continue  # a late reply to an earlier call
                pending.remove(rank)  # None: undecodable, which can only be this call's reply
                if ok:
                    results[rank] = value
                else:
                    failures[rank] = value
            if ended:
                raise self._lost(min(sentinels.index(s) for s in ended), label)
        self._output.sync(channel.output_drained())  # what it printed, before the next line
        return results, failures

    def _lost(self, rank: int, label: str) -> Exception:
        """A worker's pipe or process ended during an RPC: its death, or our own shutdown."""
        died = self._group.record_death(rank)
        self._output_finalizer()  # the workers are gone: their last lines before the error
        if died is None:
            return self.closed_during(label)
        self.state.record_death(died)
        self.state.close(f"worker rank {died.rank} died")
        return died

    # -- state and stop ------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Closed by a call, or by the monitor thread that saw a worker die between calls."""
        return self.state.closed or self._group.state.closed

    def raise_if_closed(self) -> None:
        group = self._group
        if not group.state.closed and not self.state.closed and self.state.died is None:
            return  # the common case, read without the lock; exchange checks again under it
        group.await_cleanup()
        with group.lock:
            died, because = group.state.died, group.state.reason
        if died is not None:
            self.state.record_death(died)
        if because is not None:
            self.state.close(because)
        super().raise_if_closed()

    def check_health(self) -> None:
        self.raise_if_closed()
        ended = [r for r, p in enumerate(self._group.processes) if p.exitcode is not None]
        if ended:
            raise self._lost(ended[0], "check_health")
        super().check_health()

    def rank_stacks(self, ranks: list[int], timeout: float) -> dict[int, str]:
        """py-spy's read of each rank, else its stack thread's answer (``_stack_requests``).
        While another request holds the stack pipes (the watchdog's, a ``dump_stacks`` from
        another thread), py-spy alone: no wait for the other to finish."""
        group = self._group
        pids = {rank: group.pids[rank] for rank in ranks}
        if not group.stack_lock.acquire(blocking=False):
            return request_stacks(None, pids, timeout)
        try:
            if group.released:
                return {}
            conns = {rank: group.stack_conns[rank] for rank in ranks}
            return request_stacks(conns, pids, timeout)
        finally:
            group.stack_lock.release()

    def signal_ranks(self, signum: int) -> None:
        for process in self._group.processes:
            if process.exitcode is None and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signum)

    def watch_deaths(self, callback: Callable[[WorkerDiedError], None]) -> None:
        # On the group, not self: the group's finalizer must not keep the executor alive.
        self._group.on_death = callback

    def stop_ranks(self, polite: bool = True) -> None:
        self._finalizer.cancel()
        # returns at once, or waits for a shutdown in progress elsewhere
        self._group.shutdown(polite=polite, reason=self.state.reason)
        self._output_finalizer()
