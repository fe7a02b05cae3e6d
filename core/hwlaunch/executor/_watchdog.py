"""The stall watchdog: a collective_rpc that waits too long is reported, with where ranks are.

A collective with no timeout that one rank never joins waits for ever, and says nothing. The
watchdog is one thread per executor (``WATCHDOG_THREAD``, started with the first call) that
sleeps until the call in progress has waited ``rpc_warn_after`` seconds, then logs one
warning naming the ranks that have not answered, each with its Python stack, and warns again
each time the wait doubles (60 s, 120 s, 240 s...). The call itself goes on.

The caller's thread only writes one tuple per call (``begin``/``end``); the watchdog reads it.
When no call runs, the thread wakes once per ``rpc_warn_after``: a call that began meanwhile
has waited less than that, so no stall is reported late.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable

from hwlaunch.errors import format_stacks

__all__ = ["WATCHDOG_THREAD", "Watchdog", "stall_text"]

WATCHDOG_THREAD = "hwlaunch-watchdog"  # listed in planning.threads.OWN_THREADS
log = logging.getLogger("hwlaunch")

_IDLE: tuple[str | None, float, int] = (None, 0.0, 0)


class Watchdog:
    """Watches the calls of one executor.

    ``stalled(label, waited, next_after)`` returns the warning text for a call that has waited
    ``waited`` seconds (it asks the executor which ranks are silent, and for their stacks). It
    is held weakly: an executor dropped without ``shutdown()`` is still collected (its
    finalizer stops its workers), and the thread then ends.
    """

    def __init__(self, warn_after: float, stalled: Callable[[str, float, float], str]) -> None:
        self.warn_after = warn_after
        self._stalled = weakref.WeakMethod(stalled)
        self._current = _IDLE  # (label, started, call number) of the call in progress
        self._calls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=WATCHDOG_THREAD, daemon=True)
        self._thread.start()

    def begin(self, label: str) -> None:
        self._calls += 1
        self._current = (label, time.monotonic(), self._calls)

    def end(self) -> None:
        self._current = _IDLE

    def stop(self) -> None:
        """End the thread, and wait for it: a thread still exiting would make the next fork
        of this process look unsafe (planning.threads counts it as a foreign one)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(1.0)

    def _run(self) -> None:
        seen, threshold = 0, self.warn_after
        while self._stalled() is not None:
            label, started, number = self._current
            wait = self.warn_after
            if label is not None:
                if number != seen:
                    seen, threshold = number, self.warn_after
                waited = time.monotonic() - started
                if waited >= threshold:
                    self._warn(label, waited, threshold * 2)
                    threshold *= 2
                    continue
                wait = threshold - waited
            if self._stop.wait(wait):
                return

    def _warn(self, label: str, waited: float, next_after: float) -> None:
        stalled = self._stalled()
        if stalled is None:
            self._stop.set()
            return
        try:
            text = stalled(label, waited, next_after)
        except Exception as exc:  # the executor is closing: its stacks cannot be read
            log.debug("no stall report for %r: %s", label, exc)
        else:
            log.warning(text)


def stall_text(
    label: str,
    waited: float,
    next_after: float,
    ranks: list[int],
    stacks: dict[int, str],
    source: str,
) -> str:
    """The warning: which call, how long, which ranks, where each one is."""
    return (
        f"hwlaunch: collective_rpc {label!r} has waited {waited:.0f}s for ranks {ranks} "
        f"(rpc_warn_after from {source}); it goes on waiting, the next warning comes at "
        f"{next_after:g}s" + format_stacks(stacks)
    )
