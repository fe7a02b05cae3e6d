"""The interface every executor shares (uni, mp, ray), and what they compute alike."""

from __future__ import annotations

import os
import socket
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, wait
from types import TracebackType
from typing import Any

from hwlaunch.errors import WorkerError
from hwlaunch.plan import Plan
from hwlaunch.worker_runtime import Failure

StatusCallback = Callable[[int, str], None]


class Executor(ABC):
    """Starts ``plan.world_size`` workers and runs collective RPCs on them.

    Every executor is a context manager; ``shutdown()`` is idempotent and also runs at
    interpreter exit, so no worker outlives the program.
    """

    plan: Plan

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
        *,
        non_block: bool = False,
        unique_reply_rank: int | None = None,
    ) -> Any:
        """Run ``method`` on every rank; results come back in rank order.

        ``method`` is a worker method name, or a callable called as ``fn(worker, *args,
        **kwargs)`` that travels by value (cloudpickle). An exception on a rank raises
        WorkerError (the executor stays usable); a dead worker raises WorkerDiedError; no
        answer within ``timeout`` seconds raises RpcTimeoutError and shuts the executor down,
        since a collective that hung leaves the process group unusable.

        ``unique_reply_rank=R`` returns rank R's result alone: every rank still runs the call
        (and a failure on any rank still raises), but only R's result travels back.
        ``non_block=True`` returns at once a ``concurrent.futures.Future`` of what the call
        would have returned (or raised), so the caller can overlap its own work; calls run
        one after another in the order they were made, blocking or not.
        """
        if unique_reply_rank is not None and (
            isinstance(unique_reply_rank, bool)
            or not isinstance(unique_reply_rank, int)
            or not 0 <= unique_reply_rank < self.world_size
        ):
            raise ValueError(
                f"unique_reply_rank={unique_reply_rank!r} is not a rank of this executor "
                f"(ranks 0 to {self.world_size - 1}), or None for every rank's result"
            )

        def run() -> Any:
            results = self._collective_rpc(method, args, kwargs, timeout, unique_reply_rank)
            return results if unique_reply_rank is None else results[unique_reply_rank]

        calls = self._background_calls()
        if non_block:
            return calls.submit(run)
        calls.wait_for_last()
        return run()

    @abstractmethod
    def _collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        timeout: float | None,
        reply_rank: int | None,
    ) -> list[Any]:
        """Every rank's result in rank order; with ``reply_rank``, the other ranks' results
        may be None (they need not travel)."""

    def _background_calls(self) -> BackgroundCalls:
        with _BACKGROUND_LOCK:
            calls: BackgroundCalls | None = self.__dict__.get("_background")
            if calls is None:
                calls = self.__dict__["_background"] = BackgroundCalls()
            return calls

    @abstractmethod
    def check_health(self) -> None:
        """Raise WorkerDiedError (or RpcTimeoutError) unless every worker answers."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop every worker; never hangs; safe to call more than once."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()


_BACKGROUND_LOCK = threading.Lock()


class BackgroundCalls:
    """Runs non-blocking calls one after another on a thread that exists only while they do.

    No thread outlives its work, so an executor needs no extra step to stop one; the thread is
    a daemon so that a call still waiting at interpreter exit does not hold the exit up (the
    executor's own finalizer ends the workers, and with them the call).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._running = False
        self._last: Future[Any] | None = None

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            self._jobs.append((fn, future))
            self._last = future
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="hwlaunch-rpc", daemon=True).start()
        return future

    def wait_for_last(self) -> None:
        """A blocking call waits for the non-blocking ones made before it."""
        last = self._last
        if last is not None and not last.done():
            wait([last])

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    self._running = False
                    return
                fn, future = self._jobs.popleft()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:
                    future.set_exception(exc)


def raise_first_failure(failures: Mapping[int, Failure]) -> None:
    """Raise the lowest failing rank's exception as WorkerError, naming the other ranks."""
    if not failures:
        return
    rank = min(failures)
    failure = failures[rank]
    others = sorted(set(failures) - {rank})
    message = failure.message + (f" (ranks {others} failed too)" if others else "")
    raise WorkerError(rank, failure.exc_type, message, failure.traceback)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host`` (for the process group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def visible_devices(plan: Plan, environ: Mapping[str, str] | None = None) -> str | None:
    """The device-visibility value for this job's workers on one node, or None (CPU).

    Workers see the first ``world_size`` devices of what the parent sees (its own setting of
    the variable, else every device), and bind to ``local_rank`` among them.
    """
    var = plan.device_control_env_var
    if var is None:
        return None
    env = os.environ if environ is None else environ
    if env.get(var):
        entries = [e.strip() for e in env[var].split(",") if e.strip()]
    else:
        count = plan.facts.devices[plan.backend].device_count if plan.facts else plan.world_size
        entries = [str(i) for i in range(max(count, plan.world_size))]
    return ",".join(entries[: plan.world_size])


def worker_environment(
    plan: Plan, rank: int, local_rank: int, master_addr: str, master_port: int
) -> dict[str, str]:
    """The variables a worker process gets on top of the parent's environment."""
    env = dict(plan.env)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(plan.world_size),
        LOCAL_WORLD_SIZE=str(plan.world_size // max(plan.nnodes, 1)),
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
    )
    visible = visible_devices(plan)
    if visible is not None and plan.device_control_env_var:
        env[plan.device_control_env_var] = visible
    return env
