"""Non-blocking collective RPCs: run one after another on a thread that lives only while they do.

Kept apart from the executor skeleton because it is about ordering calls in the caller's
process, not about workers: ``collective_rpc(non_block=True)`` queues here and returns a Future.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any

__all__ = ["BackgroundCalls"]


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

    @property
    def idle(self) -> bool:
        """No call queued or running here."""
        return not self._running

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
