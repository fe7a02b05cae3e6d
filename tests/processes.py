"""Process helpers shared by the tests that watch real worker processes and their children."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable

import psutil


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``predicate`` until true; return the seconds it took, fail after ``timeout``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.005)
    return time.monotonic() - start


def running(proc: psutil.Process) -> bool:
    """Alive and not a zombie (a reparented zombie may wait for a reaper that never comes)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def processes(pids: Iterable[int | None]) -> list[psutil.Process]:
    """The live processes among ``pids`` (None and vanished pids skipped)."""
    found = []
    for pid in pids:
        if pid is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                found.append(psutil.Process(pid))
    return found


def alive(procs: Iterable[psutil.Process]) -> list[int]:
    """The pids among ``procs`` still running."""
    return [p.pid for p in procs if running(p)]


def kill_all(procs: Iterable[psutil.Process]) -> list[int]:
    """Kill whatever is still running (a failed test's leftovers); return their pids."""
    left = alive(procs)
    for proc in procs:
        if running(proc):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
    return left
