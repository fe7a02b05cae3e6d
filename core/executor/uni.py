"""The uni executor: one worker in the caller's process, with the same interface and errors.

The worker lives on one dedicated thread, so that per-thread device state (the current CUDA
device) is the same for start-up and every call, and so that a call can time out. It does not
change this process's environment: the plan's env is for worker processes only.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
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
        self._lock = threading.Lock()
        self._broken: BaseException | None = None
        self._closed = False
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

        try:
            self._worker: Worker = self._submit(build).result(startup_timeout)
        except FutureTimeout:
            self._broken = WorkerStartupError(0, f"not ready within {startup_timeout:g}s")
            self.shutdown()
            raise self._broken from None
        except Exception as exc:
            self._jobs.put(None)
            failure = Failure.current(exc)
            raise WorkerStartupError(
                0, f"{failure.exc_type}: {failure.message}", failure.traceback
            ) from None
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
    ) -> list[Any]:
        encoded = encode_method(method)  # a callable goes through cloudpickle here too
        with self._lock:
            if self._broken is not None:
                raise self._broken
            if self._closed:
                raise RuntimeError("this executor was shut down; launch a new one")
            future = self._submit(
                lambda: call(self._worker, encoded, tuple(args), dict(kwargs or {}))
            )
            try:
                result = future.result(timeout)
            except FutureTimeout:
                self._broken = RpcTimeoutError(method_label(method), [0], timeout or 0.0)
                self._closed = True
                self._jobs.put(None)
                raise self._broken from None
            except Exception as exc:
                raise_first_failure({0: Failure.current(exc)})
            return [result]

    def check_health(self) -> None:
        self.collective_rpc("ping", timeout=30.0)

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        worker = getattr(self, "_worker", None)
        if worker is not None:
            done = self._submit(worker.shutdown)
            try:
                done.result(30.0)
            except Exception:
                pass
        self._jobs.put(None)
        self._thread.join(5.0)
