"""The uni executor: one worker in the caller's process, with the same interface and errors.

The worker lives on one dedicated thread, so that per-thread device state (the current CUDA
device) is the same for start-up and every call, and so that start-up and a call can time out.
It does not change this process's environment: the plan's env is for worker processes only.

A thread cannot be stopped: a start-up or a call that times out goes on running on the worker
thread, the executor closes (as the mp executor does after a timeout), and the worker's
``shutdown()`` runs once that call returns.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import TYPE_CHECKING, Any

from hwlaunch.executor._runtime import Failure, Request, call, start_worker
from hwlaunch.executor._stacks import thread_stacks
from hwlaunch.executor.base import Executor, ExecutorOptions, free_port, startup_failure
from hwlaunch.plan import Plan
from hwlaunch.worker import Worker

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["UniExecutor"]

log = logging.getLogger("hwlaunch")

_Job = tuple[Callable[[], Any], "Future[Any]"]


class UniExecutor(Executor):
    """World size 1, in this process: no process start-up cost, the same RPC semantics."""

    def __init__(
        self,
        plan: Plan,
        worker_extension: type | str | None = None,
        **options: Unpack[ExecutorOptions],
    ) -> None:
        super().__init__(plan, worker_extension, **options)
        self._check_plan(plan)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._stop_lock = threading.Lock()
        self._stopped = False
        self._worker: Worker | None = None
        self._thread = threading.Thread(target=self._run, name=self._thread_name(), daemon=True)

    rank = 0  # the one rank this process hosts

    def _check_plan(self, plan: Plan) -> None:
        if plan.world_size != 1:
            raise ValueError(f"the uni executor runs world size 1, not {plan.world_size}")

    def _thread_name(self) -> str:
        return "hwlaunch-uni-worker"

    def _build_worker(self, extension: bytes | str | None, init_distributed: bool) -> Worker:
        """Construct the worker and run its start-up; runs on the worker thread."""
        return start_worker(
            self.plan,
            extension,
            rank=0,
            local_rank=0,
            master_addr="127.0.0.1",
            master_port=free_port(),
            init_distributed=init_distributed,
        )

    def start_ranks(self, extension: bytes | str | None, init_distributed: bool) -> None:
        self._thread.start()
        self.report_status(self.rank, "started")
        future = self._submit(lambda: self._build_worker(extension, init_distributed))
        if not wait([future], self.startup_timeout).done:
            # Should start-up finish after all, its worker shuts down on the worker thread.
            future.add_done_callback(lambda f: f.exception() or f.result().shutdown())
            raise self.startup_timed_out([self.rank])
        error = future.exception()
        if error is not None:
            raise startup_failure(self.rank, Failure.current(error))
        self._worker = future.result()
        self.report_status(self.rank, "ready")

    def exchange(
        self, request: Request, label: str, timeout: float | None, reply_rank: int | None
    ) -> tuple[list[Any], dict[int, Failure]]:
        worker = self._worker
        assert worker is not None
        method, args, kwargs = request
        future = self._submit(lambda: call(worker, method, args, kwargs))
        if not wait([future], timeout).done:
            raise self.timed_out(label, [self.rank], timeout)
        error = future.exception()
        if error is not None:
            return [None], {self.rank: Failure.current(error)}
        return [future.result()], {}

    def stop_ranks(self, polite: bool = True) -> None:
        """Queue the worker's shutdown behind whatever runs now, then end the thread. Waits for
        it only when nothing is stuck on the thread (a polite stop)."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        worker = self._worker
        done = self._submit(worker.shutdown) if worker is not None else None
        self._jobs.put(None)
        grace = self.plan.shutdown_timeout  # a thread cannot be signalled: waiting is all
        if not (polite and done is not None):
            return
        if wait([done], grace).done:
            self._thread.join(grace)
        else:
            log.warning(
                "hwlaunch: worker rank %d (in this process, pid %d) did not finish its "
                "shutdown() within the %gs shutdown_timeout; its thread is left to end alone",
                self.rank,
                os.getpid(),
                grace,
            )

    def rank_stacks(self, ranks: list[int], timeout: float) -> dict[int, str]:
        """The worker thread's stack: the worker is that thread of this process."""
        del timeout
        ident = self._thread.ident
        if self.rank not in ranks or ident is None:
            return {}
        return {self.rank: thread_stacks(only=[ident])}

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

    def _submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._jobs.put((fn, future))
        return future
