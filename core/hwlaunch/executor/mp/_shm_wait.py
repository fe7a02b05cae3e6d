"""How the sides of the shared-memory channel wait: poll while the CPUs have room, else block.

A party polls (with ``sched_yield``) for its spin window, then sets its sleeping byte, checks
once more and blocks on its wake pipe; whoever publishes checks the sleeping bytes after
publishing and writes a byte to the wake pipe of each sleeper. The store of the flag and the
load of the other side's flag are separated by a full memory fence on both sides (a lock
round trip: an atomic read-modify-write), so a wake-up is never lost; a bounded block is a
second guard.

Polling pays only where it takes no CPU from anyone: the spinner measures contention (how
long a yield gave the CPU away, twice, with this thread waiting on its run queue meanwhile, so
that a hiccup of the host is not taken for it) and blocks while there is any (see
:class:`Spinner`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import time
from collections.abc import Callable, Sequence

__all__ = [
    "BLOCK_STEP",
    "Spinner",
    "drain",
    "fence",
    "run_queue_wait",
    "sleep_until",
    "wake",
    "wake_pipe",
]

BLOCK_STEP = 0.1  # the longest a blocked party sleeps before it looks again (a second guard)
# A yield that gives the CPU away for longer than this means that another task needed it for a
# time slice (the scheduler's smallest is 0.75 ms; a woken worker's first round is far shorter:
# docs/performance.md, "Waiting"): polling would cost that task a slice per round, so the
# waiting side blocks instead, and polls again only after QUIET_AFTER_CONTENTION seconds.
CONTENDED_YIELD = 500e-6
QUIET_AFTER_CONTENTION = 0.25
# One late yield alone is not taken for contention: on a virtual machine the host takes a CPU
# away now and then (steal time), from whoever runs on it, and blocking would then cost every
# call of the next QUIET_AFTER_CONTENTION seconds a wake-up for nothing. A task that needs the
# CPU takes a slice at every yield, so a second late yield this soon after confirms it, if this
# thread waited on its run queue meanwhile (a task of this machine ran in its place): where
# the host took the CPU, nothing of this machine ran, and a VM sees many such hiccups a second,
# often two within CONFIRM_WITHIN (docs/performance.md, "Waiting").
CONFIRM_WITHIN = 0.1
_SCHEDSTAT = "/proc/thread-self/schedstat"  # Linux: run time, run-queue wait (ns), slices
# Looks at the flags before the first yield: a short call's answer is often a few microseconds
# away, and a yield (a system call) would see it up to a microsecond late. Only where every
# party (the parent too) has a CPU of its own: where one shares its CPU with another that is
# about to answer, the looks keep that one waiting (the figures, 2 workers on 2 CPUs:
# docs/performance.md, "Waiting").
EAGER_LOOKS = 100

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


class Spinner:
    """One party's polling policy: poll while the CPU is free for it, block otherwise.

    Polling yields the CPU on every round (``sched_yield``), so that a party that shares a CPU
    with the one it waits for lets it run. When two late yields in a row, each within
    ``CONFIRM_WITHIN`` seconds of the one before, kept this thread waiting on its run queue for
    more than ``CONTENDED_YIELD`` (:func:`run_queue_wait`; the host's hiccups, which stop the
    whole virtual CPU, leave it unchanged), another task needs the CPU; polling then costs that
    task a time slice per round, so this party stops polling (the wait blocks) for
    ``QUIET_AFTER_CONTENTION`` seconds. The count of runnable tasks is no guide: on a machine
    that other programs keep loaded, polling still answers a no-op several times faster than
    blocking (the figures: docs/performance.md, "Waiting").
    """

    def __init__(self, window: float, eager_looks: int = EAGER_LOOKS) -> None:
        self.window = window
        self.eager_looks = eager_looks  # looks at the flags before the first yield
        self.quiet_until = 0.0  # no polling before this time (monotonic)
        self.late_at = -CONFIRM_WITHIN  # when a yield last came back late (monotonic)
        self.waited: int | None = None  # run_queue_wait() then
        self.late_waited = False  # whether this thread waited on its run queue in that yield

    def _resume(self, now: float) -> None:
        """The first poll after a quiet time: the contention that began it is likely still
        there, so the first late yield that keeps this thread waiting on its run queue (from
        here on) confirms it, as the yield before it did."""
        self.quiet_until = 0.0
        waited = run_queue_wait()
        if waited is not None:
            self.late_at, self.waited, self.late_waited = now, waited, True

    def _contended(self, now: float) -> bool:
        """After a late yield: whether it and the late yield before it both kept this thread
        waiting on its run queue for more than CONTENDED_YIELD (a task of this machine took
        the CPU, not the host). What a late yield waited is known from the reading at the one
        before it (or at the start of a poll after a quiet time), where that came within
        CONFIRM_WITHIN; else it is not known to have waited. Where the wait cannot be read:
        whether the late yield before came within CONFIRM_WITHIN."""
        waited = run_queue_wait()
        recent = now - self.late_at < CONFIRM_WITHIN
        if waited is None or self.waited is None:
            contended = recent
            late_waited = recent
        else:
            late_waited = recent and waited - self.waited > CONTENDED_YIELD * 1e9
            contended = late_waited and self.late_waited
        self.late_at, self.waited, self.late_waited = now, waited, late_waited
        return contended

    def poll(self, mm: mmap.mmap, flags: Sequence[int], seq: int, deadline: float | None) -> bool:
        """Poll until every byte at ``flags`` is ``seq``, for the window (or until
        ``deadline``); False: block now."""
        now = _now()
        if self.window <= 0 or now < self.quiet_until:
            return False
        if self.quiet_until:
            self._resume(now)
        for _ in range(self.eager_looks):
            for at in flags:
                if mm[at] != seq:
                    break
            else:
                return True
        end = now + self.window
        if deadline is not None and deadline < end:
            end = deadline
        while True:
            _sched_yield()
            last, now = now, _now()
            ready = True
            for at in flags:
                if mm[at] != seq:
                    ready = False
                    break
            # A late yield counts even where the answer came meanwhile: next to a busy task
            # every yield is late, and the answer has mostly come by the time it returns.
            if now - last > CONTENDED_YIELD and self._contended(now):
                self.quiet_until = now + QUIET_AFTER_CONTENTION
                return ready
            if ready:
                return True
            if now >= end:
                return False


def run_queue_wait() -> int | None:
    """How long this thread has waited, runnable, for a CPU (nanoseconds, Linux's schedstat);
    None where that cannot be read. Time the host took the CPU away is not in it."""
    try:
        fd = os.open(_SCHEDSTAT, os.O_RDONLY)
    except OSError:
        return None
    try:
        return int(os.read(fd, 128).split()[1])
    except (OSError, ValueError, IndexError):
        return None
    finally:
        os.close(fd)
