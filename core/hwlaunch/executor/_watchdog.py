"""The stall watchdog: a collective_rpc that waits too long is reported, with where ranks are.

A collective with no timeout that one rank never joins waits for ever, and says nothing. The
watchdog is one thread per executor (``WATCHDOG_THREAD``, started with the first call) that
sleeps until the call in progress has waited ``rpc_warn_after`` seconds, then logs one
warning naming the ranks that have not answered, each with its Python stack, and warns again
each time the wait doubles (60 s, 120 s, 240 s...). The call itself goes on.

Each warning is on time and tells the truth:

- its stacks take at most ``FAULT_STACKS`` (py-spy reads a rank that holds the GIL or is
  stopped; no wait for a rank that cannot answer), so it comes at most that late;
- its "next warning" is when the next one comes: the next doubling still ahead once this one is
  written (``rpc_warn_after`` has a lower bound, ``RPC_WARN_AFTER_MIN``, that leaves room);
- it is written only while the call it names still runs, and names only ranks that have still
  not answered: the check and the write hold the lock that ``end`` takes, so no warning comes
  after the call returned, and none names no rank.

The caller's thread takes that lock once as a call begins and once as it ends (``begin``,
``end``), and never wakes the watchdog: the thread sleeps at most ``rpc_warn_after`` at a time
(between calls, and during a call whose next warning is further off), so a call that began
meanwhile has waited less than that when the thread looks, and its first warning is on time.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable

from hwlaunch.errors import format_stacks

__all__ = ["FAULT_STACKS", "WATCHDOG_THREAD", "Watchdog", "stall_text"]

WATCHDOG_THREAD = "hwlaunch-watchdog"  # listed in planning.threads.OWN_THREADS
# Seconds the stacks of a stall warning (or of an RpcTimeoutError) may take: py-spy reads a
# process in tens of milliseconds, a rank's own stack thread answers in a few, or never.
FAULT_STACKS = 0.3
log = logging.getLogger("hwlaunch")

_IDLE: tuple[str | None, float, int] = (None, 0.0, 0)


class Watchdog:
    """Watches the calls of one executor.

    ``silent()`` says which ranks the call in progress still waits for, ``stacks(ranks,
    timeout)`` reads their stacks: the executor's methods, held weakly, so that an executor
    dropped without ``shutdown()`` is still collected (its finalizer stops its workers), and
    the thread then ends. ``source``: where ``warn_after`` came from, for the warning's text.
    """

    def __init__(
        self,
        warn_after: float,
        silent: Callable[[], list[int]],
        stacks: Callable[[list[int], float], dict[int, str]],
        source: str,
    ) -> None:
        self.warn_after = warn_after
        self._silent = weakref.WeakMethod(silent)
        self._stacks = weakref.WeakMethod(stacks)
        self._source = source
        self._lock = threading.Lock()  # begin/end, and a warning's last check and write
        self._current = _IDLE  # (label, started, call number) of the call in progress
        self._calls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=WATCHDOG_THREAD, daemon=True)
        self._thread.start()

    def begin(self, label: str) -> None:
        with self._lock:
            self._calls += 1
            self._current = (label, time.monotonic(), self._calls)

    def end(self) -> None:
        with self._lock:
            self._current = _IDLE

    def stop(self) -> None:
        """End the thread, and wait for it: a thread still exiting would make the next fork
        of this process look unsafe (planning.threads counts it as a foreign one)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(1.0)

    def _run(self) -> None:
        seen, threshold = 0, self.warn_after
        while self._silent() is not None:
            label, started, number = self._current
            wait = self.warn_after
            if label is not None:
                if number != seen:
                    seen, threshold = number, self.warn_after
                waited = time.monotonic() - started
                if waited >= threshold:
                    threshold = self._warn(label, number, started, threshold)
                    continue
                # Never longer than warn_after: a call that begins while this one's next
                # warning is far off is seen while its own first one is still ahead.
                wait = min(threshold - waited, self.warn_after)
            if self._stop.wait(wait):
                return

    def _warn(self, label: str, number: int, started: float, threshold: float) -> float:
        """Warn about call ``number``, which has waited past ``threshold``, if it still runs;
        return the threshold of the next warning: the next doubling still ahead once this one
        is written (a warning that came late skips the ones it passed, so its "next" holds)."""
        following = threshold * 2
        while following <= time.monotonic() - started + FAULT_STACKS:
            following *= 2
        silent, read = self._silent(), self._stacks()
        if silent is None or read is None:
            self._stop.set()
            return following
        try:
            ranks = silent()
            stacks = read(ranks, FAULT_STACKS) if ranks else {}
        except Exception as exc:  # the executor is closing: its stacks cannot be read
            log.debug("no stall report for %r: %s", label, exc)
            return following
        with self._lock:
            if self._current[2] != number or self._current[0] is None:
                return following  # the call ended while its stacks were read
            still = [rank for rank in silent() if rank in ranks]
            if still:
                waited = time.monotonic() - started
                shown = {rank: stacks[rank] for rank in still if rank in stacks}
                log.warning(stall_text(label, waited, following, still, shown, self._source))
        return following


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
        f"hwlaunch: collective_rpc {label!r} has waited {waited:.1f}s for ranks {ranks} "
        f"(rpc_warn_after from {source}); it goes on waiting, the next warning comes at "
        f"{next_after:g}s" + format_stacks(stacks)
    )
