"""How the sides of the shared-memory channel wait: poll while the CPUs have room, else block.

A party polls (with ``sched_yield``) for its spin window, then sets its sleeping byte, checks
once more and blocks on its wake pipe; whoever publishes checks the sleeping bytes after
publishing and writes a byte to the wake pipe of each sleeper. The store of the flag and the
load of the other side's flag are separated by a full memory fence on both sides (a lock
round trip: an atomic read-modify-write), so a wake-up is never lost; a bounded block is a
second guard.

Polling pays only where it takes no CPU from anyone: the spinner measures contention two
ways and blocks at once while there is any (see :class:`Spinner`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import time
from collections.abc import Callable, Sequence

__all__ = ["BLOCK_STEP", "Spinner", "drain", "fence", "sleep_until", "wake", "wake_pipe"]

BLOCK_STEP = 0.1  # the longest a blocked party sleeps before it looks again (a second guard)
# A yield that gives the CPU away for longer than this means that another task needed it for a
# time slice (the scheduler's smallest is 0.75 ms; a woken worker's first round takes up to
# ~0.2 ms): polling would cost that task a slice per round, so the waiting side blocks
# instead, and polls again only after QUIET_AFTER_CONTENTION seconds.
CONTENDED_YIELD = 500e-6
QUIET_AFTER_CONTENTION = 0.25
LOAD_EVERY = 0.05  # seconds between two looks at the count of runnable tasks
LOADAVG = "/proc/loadavg"

_fence_lock = threading.Lock()
_sched_yield = getattr(os, "sched_yield", lambda: time.sleep(0))
_now = time.monotonic


def fence() -> None:
    """A full memory barrier: acquiring a lock is an atomic read-modify-write.

    Needed between storing one's own sleeping flag and loading the other side's message flag
    (and the reverse): every CPU, x86 included, may let that load pass that store.
    """
    with _fence_lock:
        pass


def wake_pipe() -> tuple[int, int]:
    """A pipe whose ends never block: a full pipe already wakes its reader."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    return r, w


def wake(fd: int) -> None:
    with contextlib.suppress(BlockingIOError, BrokenPipeError, OSError):
        os.write(fd, b"\0")


def drain(fd: int) -> None:
    """Empty a wake pipe: one read, unless it came back full."""
    with contextlib.suppress(BlockingIOError, OSError):
        while len(os.read(fd, 4096)) == 4096:
            pass


def sleep_until(
    ready: Callable[[], bool],
    mm: mmap.mmap,
    sleeping_at: int,
    block: Callable[[float], bool],
    deadline: float | None,
) -> bool:
    """Block (the sleeping byte set) until ``ready()``; False when ``deadline`` passed first.

    ``block(seconds)`` sleeps until woken (True means: stop waiting, something else happened).
    """
    mm[sleeping_at] = 1
    try:
        while True:
            fence()
            if ready():
                return True
            wait = BLOCK_STEP
            if deadline is not None:
                wait = min(wait, deadline - _now())
                if wait <= 0:
                    return False
            if block(wait):
                return True
    finally:
        mm[sleeping_at] = 0


def _cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # pragma: no cover - non-Linux


class _Load:
    """Whether more tasks are runnable on the machine than this process has CPUs, looked up
    at most every ``LOAD_EVERY`` seconds (the kernel's count in ``/proc/loadavg``)."""

    def __init__(self) -> None:
        self.cpus = _cpus()
        self.checked = -LOAD_EVERY
        self.contended = False

    def busy(self, now: float) -> bool:
        if now - self.checked >= LOAD_EVERY:
            self.checked = now
            try:
                with open(LOADAVG, "rb") as loadavg:
                    running = int(loadavg.read().split()[3].split(b"/")[0])
            except (OSError, ValueError, IndexError):  # pragma: no cover - no /proc
                running = 0
            # The count includes this task; a CPU each for it and the one it waits for.
            self.contended = running > self.cpus
        return self.contended


_load = _Load()


class Spinner:
    """One party's polling policy: poll while the CPU is free for it, block otherwise.

    Two measures of contention, either of which stops polling: more runnable tasks on the
    machine than this process has CPUs (the kernel's count, looked up every 50 ms), and a
    yield that comes back late (another task needed this CPU for a time slice: polling on
    would cost it a slice per round; no polling then for ``QUIET_AFTER_CONTENTION`` seconds).
    Polling yields the CPU on every round (``sched_yield``), so that a party that shares a CPU
    with the one it waits for lets it run.
    """

    def __init__(self, window: float) -> None:
        self.window = window
        self.quiet_until = 0.0  # no polling before this time (monotonic)

    def poll(self, mm: mmap.mmap, flags: Sequence[int], seq: int, deadline: float | None) -> bool:
        """Poll until every byte at ``flags`` is ``seq``, for the window (or until
        ``deadline``); False: block now."""
        now = _now()
        if self.window <= 0 or now < self.quiet_until:
            return False
        if all(mm[at] == seq for at in flags):
            return True
        if _load.busy(now):
            self.quiet_until = now + LOAD_EVERY  # no poll before the next look at the load
            return False
        end = now + self.window
        if deadline is not None and deadline < end:
            end = deadline
        while True:
            _sched_yield()
            for at in flags:
                if mm[at] != seq:
                    break
            else:
                return True
            last, now = now, _now()
            if now - last > CONTENDED_YIELD:
                self.quiet_until = now + QUIET_AFTER_CONTENTION
                return False
            if now >= end:
                return False
            if _load.busy(now):
                self.quiet_until = now + LOAD_EVERY
                return False
