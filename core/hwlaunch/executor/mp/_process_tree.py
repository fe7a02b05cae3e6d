"""A worker's descendants go with it: process groups, a child subreaper, and sweeps.

A worker may start processes of its own (DataLoader workers, torch.compile's pool, a
``subprocess.Popen``, a ``multiprocessing.Pool``). They must not outlive it, however it ends:

- Worker side (``arm``): the worker leads a process group of its own, so every descendant that
  does not leave the group on purpose can be signalled at once, and is a *child subreaper*
  (PR_SET_CHILD_SUBREAPER), so a descendant orphaned inside its tree (a double fork, even after
  ``setsid``) is reparented to the worker and stays findable as its descendant. Children it
  forks from its main thread get PR_SET_PDEATHSIG=SIGKILL, which covers a worker that is
  SIGKILLed while they run. On every exit path the worker calls ``end_descendants`` (kill what
  is found, again until nothing is left: a Pool's handler thread starts replacements while
  its processes are being killed), and when its parent is gone it ends with ``SIGKILL`` to its
  own group, which the kernel delivers to a child forked at that very moment too.
- Parent side (``sweep``): after a worker has ended, the parent kills what is left of the
  worker's process group and the descendants it saw before stopping the worker. It kills only
  processes it can show to be the worker's descendants: members of the group whose id is the
  worker's pid (the kernel does not reuse that id while the group has members), and processes
  it listed as the worker's descendants itself (psutil checks that a pid was not reused).

Not covered: a descendant that leaves the worker's group (``setsid``/``setpgid``) is found
only while the worker lives; once the worker is SIGKILLed it is reparented above the worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
END_LIMIT = 2.0  # seconds a worker spends killing its descendants before it exits anyway
SWEEP_WAIT = 2.0  # seconds the parent waits for what it SIGKILLed to be gone

_forked_from_main = False  # set before each fork in a worker, read in the child


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(option, value, 0, 0, 0)


def _before_fork() -> None:
    global _forked_from_main
    _forked_from_main = threading.current_thread() is threading.main_thread()


def _after_fork_in_child() -> None:
    # PR_SET_PDEATHSIG fires when the *thread* that forked us ends: only a fork from the main
    # thread (which lives as long as the process) may have it.
    if _forked_from_main:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def arm() -> None:
    """Make this worker a process-group leader and subreaper; tie its forked children to it.

    Called first thing in a worker process (mp executor). Linux only; elsewhere a no-op.
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError):  # already a session leader: it leads its group
        if os.getpgid(0) != os.getpid():
            os.setpgid(0, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def leads_group() -> bool:
    return os.getpgid(0) == os.getpid()


def end_descendants(limit: float = END_LIMIT) -> None:
    """Kill every descendant of this process, again until none is left (or ``limit`` ends).

    Direct children, and orphans reparented here (we are a subreaper), are reaped as they die.
    No lock is taken (psutil reads /proc): this runs from signal handlers and dying threads.
    """
    deadline = time.monotonic() + limit
    me = psutil.Process()
    while time.monotonic() < deadline:
        try:
            found = me.children(recursive=True)
        except psutil.Error:
            return
        living = [p for p in found if _killable(p)]
        if not living:
            return
        for proc in living:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(living, timeout=max(0.0, min(0.2, deadline - time.monotonic())))


def end_group_and_self() -> None:
    """SIGKILL to this process's own group: every member still in it, this process included.

    Only for a group this process leads; a forked child being created right now gets the
    signal too (the kernel holds a group signal against a concurrent fork).
    """
    if leads_group():
        os.killpg(os.getpid(), signal.SIGKILL)


def _killable(proc: psutil.Process) -> bool:
    try:
        status: str = proc.status()
    except psutil.Error:
        return False
    return bool(status != psutil.STATUS_ZOMBIE)


# -- the parent's side ----------------------------------------------------------------------
def identify(pid: int | None) -> psutil.Process | None:
    """The worker's identity (pid and start time), taken when it starts."""
    if pid is None:
        return None
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def descendants(worker: psutil.Process | None) -> list[psutil.Process]:
    """The live descendants of a worker now (empty when it is gone)."""
    if worker is None:
        return []
    try:
        found: list[psutil.Process] = worker.children(recursive=True)  # checks the start time
    except psutil.Error:
        return []
    return found


def sweep(worker: psutil.Process | None, seen: Iterable[psutil.Process] = ()) -> list[int]:
    """After a worker ended: kill what is left of its process group and of ``seen``.

    ``seen`` are descendants listed while the worker lived. Returns the pids killed.
    """
    killed: list[psutil.Process] = []
    for proc in [*_group_members(worker), *seen]:
        if proc in killed or not _killable(proc):
            continue
        with contextlib.suppress(psutil.Error):
            proc.kill()
            killed.append(proc)
    # SIGKILL takes effect asynchronously: return once each is gone (or a zombie, for its new
    # parent to reap), so that the caller's next step sees them gone.
    deadline = time.monotonic() + SWEEP_WAIT
    while any(_killable(p) for p in killed) and time.monotonic() < deadline:
        time.sleep(0.005)
    return [p.pid for p in killed]


def _group_members(worker: psutil.Process | None) -> list[psutil.Process]:
    """The other members of the process group that the worker led.

    While the group has a member, its id (the worker's pid) is not given to a new process, so
    a process with that pid is the worker itself (alive, dying or a zombie) or, after the group
    emptied, an unrelated one: members are taken only when no process with that pid runs, or
    when it is the worker (same start time).
    """
    if worker is None or not sys.platform.startswith("linux"):
        return []
    pgid = worker.pid
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []  # the group is empty: the common case, no scan
    except PermissionError:
        return []
    if psutil.pid_exists(pgid) and not worker.is_running():  # is_running compares start times
        return []  # a new process has the worker's pid: the group is not the worker's
    members = []
    # Fresh Process objects: psutil.process_iter() hands out cached ones, which refuse to
    # signal a pid that was reused since the cache saw it.
    for pid in psutil.pids():
        with contextlib.suppress(psutil.Error, OSError):
            if pid != pgid and os.getpgid(pid) == pgid:
                members.append(psutil.Process(pid))
    return members
