"""When the driver dies, each worker still runs its own ``shutdown()``, then its tree goes.

A driver ended by SIGTERM's default action or by SIGKILL runs none of its own code: nobody
asks the workers to shut down. Each worker learns of it by itself (EOF on the death pipe
without the parent's "end now", EOF on its call channel, or PR_SET_PDEATHSIG with its parent
gone; a Ray actor: the end of its lifeline, ``ray._lifeline``) and calls ``begin``: the
worker's ``shutdown()`` (destroy the process group, release the device) runs on a thread of
its own for at most the plan's ``shutdown_timeout``, then the executor's ``end`` ends the
process (an mp worker its descendants and itself, as on every other exit path; a Ray actor
its process, rank 0 the placement group once every rank is done). ``begin`` never blocks, so
a signal handler may call it; the first call wins. Worker-side code: one worker per process.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["begin", "register", "wait"]

TEARDOWN_THREAD = "hwlaunch-teardown"

_once = threading.Lock()  # taken by the first begin(), never released
_worker: Any = None
_rank = -1
_grace = 5.0


def register(worker: Any, rank: int, grace: float) -> None:
    """The started worker and its grace: what ``begin`` shuts down, and for how long.

    The worker's ``shutdown`` becomes one that runs once: a driver that dies while the worker
    runs the shutdown it was asked for waits for that one instead of starting another.
    """
    global _worker, _rank, _grace
    _worker, _rank, _grace = worker, rank, grace
    worker.shutdown = _Once(worker.shutdown)


class _Once:
    """A callable that runs its function on the first call; later calls wait for it."""

    def __init__(self, function: Callable[[], Any]) -> None:
        self._function = function
        self._lock = threading.Lock()
        self._done = False

    def __call__(self) -> None:
        with self._lock:
            if not self._done:
                self._done = True
                self._function()


def begin(end: Callable[[int], None]) -> None:
    """Start the orderly end (once): ``shutdown()`` within the grace, then ``end(1)``."""
    if not _once.acquire(blocking=False):
        return
    threading.Thread(target=_teardown, args=(end,), name=TEARDOWN_THREAD, daemon=True).start()


def wait() -> None:
    """Block the calling thread while a teardown ends the process (it never returns then)."""
    if _once.locked():
        threading.Event().wait()


def _teardown(end: Callable[[int], None]) -> None:
    worker = _worker
    if worker is not None:
        started = time.monotonic()
        runner = threading.Thread(target=_shutdown, args=(worker,), daemon=True)
        runner.start()
        runner.join(_grace)
        if runner.is_alive():
            _say(
                f"the driver is gone, and shutdown() did not finish within the "
                f"{_grace:g}s shutdown_timeout ({time.monotonic() - started:.1f}s): ending now"
            )
    end(1)


def _shutdown(worker: Any) -> None:
    try:
        worker.shutdown()
    except BaseException as exc:
        _say(f"the driver is gone; shutdown() raised {type(exc).__name__}: {exc}")


def _say(text: str) -> None:
    with contextlib.suppress(Exception):  # stderr may be gone with the driver's terminal
        print(f"hwlaunch: worker rank {_rank}: {text}", file=sys.stderr, flush=True)
