"""The uni executor: one worker in the caller's process, with the same interface and errors.

The worker lives on one dedicated thread, so that per-thread device state (the current CUDA
device) is the same for start-up and every call, and so that a call can time out. It does not
change this process's environment: the plan's env is for worker processes only.

A thread cannot be stopped: a call that times out goes on running on the worker thread, the
executor closes (as the mp executor does after a timeout), and the worker's ``shutdown()`` runs
once that call returns.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any

from hwlaunch.errors import RpcTimeoutError, WorkerStartupError
from hwlaunch.executor.base import Executor, StatusCallback, free_port, raise_first_failure
from hwlaunch.plan import Plan
from hwlaunch.worker import Worker
from hwlaunch.worker_runtime import (
    Failure,
    call,
    encode_extension,
    encode_method,
    method_label,
    start_worker,
)

SHUTDOWN_WAIT = 5.0  # seconds shutdown() waits for the worker's own shutdown()

_Job = tuple[Callable[[], Any], "Future[Any]"]


class UniExecutor(Executor):
    def __init__(
        self,
        plan: Plan,
        worker_extension: type | str | None = None,
        *,
        init_distributed: bool = True,
        startup_timeout: float | None = None,
        on_status: StatusCallback | None = None,
    ) -> None:
        if plan.world_size != 1:
            raise ValueError(f"the uni executor runs world size 1, not {plan.world_size}")
        self.plan = plan
        self.warnings: list[str] = []
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._rpc_lock = threading.Lock()  # one call at a time, as on a worker process
        self._state_lock = threading.Lock()
        self._closed_because: str | None = None
        self._worker: Worker | None = None
        self._thread = threading.Thread(target=self._run, name="hwlaunch-uni-worker", daemon=True)
        self._thread.start()
        if on_status:
            on_status(0, "started")
        extension = encode_extension(worker_extension)
        port = free_port()

        def build() -> Worker:
            return start_worker(
                plan,
                extension,
                rank=0,
                local_rank=0,
                master_addr="127.0.0.1",
                master_port=port,
                init_distributed=init_distributed,
            )

        future = self._submit(build)
        if not wait([future], startup_timeout).done:
            # Should start-up finish after all, its worker shuts down on the worker thread.
            future.add_done_callback(lambda f: f.exception() or f.result().shutdown())
            self._close(f"the worker was not ready within {startup_timeout:g}s")
            raise WorkerStartupError(0, f"not ready within {startup_timeout:g}s")
        error = future.exception()
        if error is not None:
            self._close("the worker failed to start")
            failure = Failure.current(error)
            raise WorkerStartupError(0, f"{failure.exc_type}: {failure.message}", failure.traceback)
        self._worker = future.result()
        if on_status:
            on_status(0, "ready")

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

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
        *,
        setup: bool = False,
    ) -> list[Any]:
        encoded = encode_method(method)  # a callable goes through cloudpickle here too
        with self._rpc_lock:
            with self._state_lock:
                if self._closed_because is not None:
                    raise RuntimeError(
                        f"this executor was shut down ({self._closed_because}); launch a new one"
                    )
                worker = self._worker
                assert worker is not None
                future = self._submit(
                    lambda: call(worker, encoded, tuple(args), dict(kwargs or {}))
                )
            if not wait([future], timeout).done:
                label = method_label(method)
                self._close(f"collective_rpc {label!r} timed out", wait_for_worker=False)
                raise RpcTimeoutError(label, [0], timeout or 0.0)
            error = future.exception()
            if error is not None:
                raise_first_failure({0: Failure.current(error)})
            return [future.result()]

    def check_health(self) -> None:
        self.collective_rpc("ping", timeout=30.0)

    def shutdown(self) -> None:
        self._close("shutdown() was called")

    def _close(self, reason: str, *, wait_for_worker: bool = True) -> None:
        """Queue the worker's shutdown behind whatever runs now, then end the thread."""
        with self._state_lock:
            if self._closed_because is not None:
                return
            self._closed_because = reason
            worker = self._worker
        done = self._submit(worker.shutdown) if worker is not None else None
        self._jobs.put(None)
        if wait_for_worker and done is not None and wait([done], SHUTDOWN_WAIT).done:
            self._thread.join(SHUTDOWN_WAIT)
