"""The way of a call to the workers: one at a time, in the order they were made, watched.

Why apart from the executor skeleton: every executor gets the same ordering, locking and stall
watching, whatever its workers are, and the skeleton keeps only the user API and the error
vocabulary. ``Calls`` owns the RPC lock, the queue of non-blocking calls (``_background``), the
one non-blocking call whose replies are not read yet (``_deferred``) and the stall watchdog;
it drives the executor's ``exchange`` (or ``send_request``, where the executor can split one).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from hwlaunch.executor._background import BackgroundCalls
from hwlaunch.executor._deferred import Collector, DeferredCall
from hwlaunch.executor._failures import raise_first_failure
from hwlaunch.executor._runtime import Failure, Request
from hwlaunch.executor._watchdog import Watchdog

if TYPE_CHECKING:
    from hwlaunch.executor.base import Executor
    from hwlaunch.plan import Plan

__all__ = ["Calls", "decision_source"]

Outcome = tuple[list[Any], dict[int, Failure]]  # what an exchange returns


class Calls:
    """One executor's calls: ``run`` a blocking one, ``submit`` a non-blocking one."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor
        self.lock = threading.Lock()  # one call at a time, as on a worker process
        self._background = BackgroundCalls()  # where queued non_block calls run, in order
        # A non_block call sent whose replies nobody read yet: read, under the lock, before
        # anything else goes to the workers.
        self._outstanding: DeferredCall | None = None
        self._collector = Collector(self._read_deferred)
        self._watchdog: Watchdog | None = None  # started by the first call (rpc_warn_after)

    def run(self, request: Request, label: str, timeout: float | None, reply: int | None) -> Any:
        """A blocking call: after every call made before it; its result (or reply's)."""
        self._background.wait_for_last()
        return self._run(request, label, timeout, reply)

    def submit(
        self, request: Request, label: str, timeout: float | None, reply: int | None
    ) -> Future[Any]:
        """A non-blocking call: sent now from this thread where it can be (``_deferred``),
        else queued behind the calls before it."""
        deferred = self._send_deferred(request, label, timeout, reply)
        if deferred is not None:
            return deferred
        return self._background.submit(functools.partial(self._run, request, label, timeout, reply))

    def stop(self) -> None:
        """At shutdown: the watchdog ends, and a call still unread gets the shutdown's error."""
        if self._watchdog is not None:
            self._watchdog.stop()
        if self._outstanding is not None:
            self._collector.hurry()

    # -- blocking --------------------------------------------------------------------------
    def _run(self, request: Request, label: str, timeout: float | None, reply: int | None) -> Any:
        while True:
            with self.lock:
                if self._outstanding is None:
                    results, failures = self._exchange_now(request, label, timeout, reply)
                    break
                finish = self._read_outstanding()  # a non-blocking call's replies come first
            finish()
        if failures:
            raise_first_failure(failures, label)
        return results if reply is None else self._executor._reply_of(results, reply)

    def _exchange_now(
        self, request: Request, label: str, timeout: float | None, reply: int | None
    ) -> Outcome:
        """Under the lock, nothing outstanding: one exchange, watched."""
        executor = self._executor
        executor.raise_if_closed()
        watchdog = self._begin_watch(label)
        try:
            return executor.exchange(request, label, timeout, reply)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                self._interrupted(label, exc)
            raise
        finally:
            if watchdog is not None:
                watchdog.end()

    def _begin_watch(self, label: str) -> Watchdog | None:
        """Under the lock: the stall watchdog (started by the first call) watches ``label``."""
        executor = self._executor
        watchdog = self._watchdog
        if watchdog is None and executor.plan.rpc_warn_after > 0:
            source = decision_source(executor.plan, "rpc_warn_after")
            watchdog = self._watchdog = Watchdog(
                executor.plan.rpc_warn_after, executor._silent_ranks, executor.rank_stacks, source
            )
        executor.waiting_on = None
        if watchdog is not None:
            watchdog.begin(label)
        return watchdog

    def _interrupted(self, label: str, exc: BaseException) -> None:
        """KeyboardInterrupt (or SystemExit) mid-exchange: replies are half read, so the
        channels are out of step; the workers cannot be reused."""
        executor = self._executor
        executor.state.close(f"collective_rpc {label!r} was interrupted by {type(exc).__name__}")
        executor.stop_ranks(polite=False)

    # -- sent now, read later ----------------------------------------------------------------
    def _send_deferred(
        self, request: Request, label: str, timeout: float | None, reply: int | None
    ) -> Future[Any] | None:
        """A non-blocking call sent now, from this thread, where the workers are idle and the
        executor can split an exchange; else None: the call waits its turn on the background
        thread, which keeps the order of calls."""
        if not self._background.idle or not self.lock.acquire(blocking=False):
            return None
        try:
            if self._outstanding is not None:
                return None
            return self._send_now(request, label, timeout, reply)
        finally:
            self.lock.release()

    def _send_now(
        self, request: Request, label: str, timeout: float | None, reply: int | None
    ) -> Future[Any] | None:
        """Under the lock, nothing outstanding: send, and return the call's Future."""
        executor = self._executor
        try:
            executor.raise_if_closed()
        except Exception as exc:
            return _failed(exc)
        watchdog = self._begin_watch(label)
        try:
            collect = executor.send_request(request, label, timeout, reply)
        except BaseException as exc:
            if watchdog is not None:
                watchdog.end()
            if not isinstance(exc, Exception):
                self._interrupted(label, exc)
                raise
            return _failed(exc)
        if collect is None:
            if watchdog is not None:
                watchdog.end()
            return None
        call = DeferredCall(
            label, _replies(executor, collect, watchdog, label, reply), self._read_deferred,
            self._collector.hurry,
        )  # fmt: skip
        self._outstanding = call
        self._collector.watch(call)
        return call

    def _read_deferred(self, call: DeferredCall) -> None:
        """Read ``call``'s replies, unless someone did (``DeferredCall``'s reader)."""
        with self.lock:
            if self._outstanding is not call:
                return
            finish = self._read_outstanding()
        finish()  # outside the lock: a done callback may call the executor

    def _read_outstanding(self) -> Callable[[], None]:
        """Under the lock: read the outstanding call's replies; returns what completes its
        Future (to be called once the lock is released)."""
        call, self._outstanding = self._outstanding, None
        if call is None:
            return _nothing
        try:
            value = call.collect()
        except BaseException as exc:
            if not isinstance(exc, Exception):
                self._interrupted(call.label, exc)
                call.set_exception(self._executor.closed_during(call.label))
                raise
            return functools.partial(call.set_exception, exc)
        return functools.partial(call.set_result, value)


def _replies(
    executor: Executor,
    collect: Callable[[], Outcome],
    watchdog: Watchdog | None,
    label: str,
    reply: int | None,
) -> Callable[[], Any]:
    """What reads a deferred call's replies: its result, or the error of a failed rank."""

    def replies() -> Any:
        try:
            results, failures = collect()
        finally:
            if watchdog is not None:
                watchdog.end()
        if failures:
            raise_first_failure(failures, label)
        return results if reply is None else executor._reply_of(results, reply)

    return replies


def decision_source(plan: Plan, setting: str) -> str:
    """Where the plan's ``setting`` came from (``default`` where it decides no such setting),
    for an error's or a warning's text."""
    for decision in plan.decisions:
        if decision.setting == setting:
            return decision.source
    return "default"


def _nothing() -> None:
    return None


def _failed(exc: Exception) -> Future[Any]:
    """The Future of a non-blocking call that failed before it was sent."""
    failed: Future[Any] = Future()
    failed.set_exception(exc)
    return failed
