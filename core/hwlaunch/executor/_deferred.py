"""Non-blocking calls sent from the caller's thread, their replies read by whoever needs them.

Why: handing a call to another thread costs two thread wake-ups (a new thread per call, more),
tens of microseconds on a busy CPU, and an engine like vLLM makes one non-blocking call per
model step (``benchmarks/nonblocking_calls.py`` measures it; figures in docs/performance.md).
An executor that can send a call apart from reading its replies (``Executor.send_request``)
sends a non-blocking call at once, in the caller's thread, and returns a ``DeferredCall``.
Its replies are read, under the executor's RPC lock, by the first of:

- the Future's own ``result()`` or ``exception()`` (without a timeout), in the caller's thread;
- the executor's next call, blocking or not, which must find the workers idle;
- the ``Collector`` thread, for a caller that only waits (``concurrent.futures.wait``, done
  callbacks) or asks with a timeout: it reads a reply nobody read within ``COLLECT_AFTER``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["COLLECTOR_THREAD", "COLLECT_AFTER", "Collector", "DeferredCall"]

COLLECT_AFTER = 0.005  # seconds a reply waits for its caller before the collector reads it
LINGER = 1.0  # seconds the collector thread stays with no call outstanding, then ends
COLLECTOR_THREAD = "hwlaunch-collect"  # listed in planning.threads.OWN_THREADS


class DeferredCall(Future[Any]):
    """A call that every rank has been sent and whose replies are not read yet.

    ``read(call)`` (the executor's) reads them under the executor's RPC lock and completes the
    Future, or does nothing where someone else already did; ``hurry(call)`` asks the collector
    to read them now. A DeferredCall is running from the start: it cannot be cancelled.
    """

    def __init__(
        self,
        label: str,
        collect: Callable[[], Any],
        read: Callable[[DeferredCall], None],
        hurry: Callable[[], None],
    ) -> None:
        super().__init__()
        self.set_running_or_notify_cancel()
        self.label = label
        self.collect = collect  # reads the replies and returns the call's value; called once
        self.sent_at = time.monotonic()
        self._read = read
        self._hurry = hurry

    def result(self, timeout: float | None = None) -> Any:
        self._settle(timeout)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._settle(timeout)
        return super().exception(timeout)

    def _settle(self, timeout: float | None) -> None:
        """Read the replies here, or (with a timeout, which a read cannot keep) have the
        collector read them while ``Future`` waits for at most ``timeout``."""
        if self.done():
            return
        if timeout is None:
            self._read(self)
        else:
            self._hurry()


class Collector:
    """One thread that reads the replies of a deferred call nobody read within
    ``COLLECT_AFTER``; it lives while calls keep coming and ends ``LINGER`` after the last.

    It is never woken per call: it sleeps until the outstanding call is due (one wake-up per
    ``COLLECT_AFTER`` at most while calls are outstanding); ``hurry()`` wakes it at once.
    """

    def __init__(self, read: Callable[[DeferredCall], None]) -> None:
        self._read = read
        self._cond = threading.Condition()
        self._call: DeferredCall | None = None
        self._hurried = False
        self._running = False

    def watch(self, call: DeferredCall) -> None:
        """``call`` is outstanding: read it after ``COLLECT_AFTER`` unless someone did."""
        with self._cond:
            self._call = call
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name=COLLECTOR_THREAD, daemon=True).start()

    def hurry(self) -> None:
        """Read the outstanding call now (a caller waits for it with a timeout, or shutdown)."""
        with self._cond:
            self._hurried = True
            self._cond.notify()

    def _run(self) -> None:
        idle_since: float | None = None
        while True:
            with self._cond:
                call, now = self._call, time.monotonic()
                if call is None or call.done():
                    self._call, self._hurried = None, False
                    idle_since = now if idle_since is None else idle_since
                    if now - idle_since >= LINGER:
                        self._running = False
                        return
                    self._cond.wait(COLLECT_AFTER)
                    continue
                idle_since = None
                due = call.sent_at + COLLECT_AFTER
                if not self._hurried and now < due:
                    self._cond.wait(due - now)
                    continue
                self._hurried = False
            self._read(call)  # outside the condition: it takes the executor's RPC lock
            with self._cond:  # read, by this thread or by whoever held the lock first
                if self._call is call:
                    self._call = None
