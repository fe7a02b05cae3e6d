"""Fork workers without Python 3.12's "multi-threaded" warning when the only other threads are
ones a fork cannot hurt: hwlaunch's own, and those of libraries known to be fork-safe.

Why: from 3.12 ``os.fork()`` warns (DeprecationWarning) whenever the process has more than one
thread, since a child inherits locks held by threads that do not exist in it. hwlaunch's own
threads (an earlier executor's monitor, the thread running non-blocking calls, a restart, the
death-pipe watcher) only block in poll/recv and hold no lock a worker needs, yet CPython cannot
tell them apart and warns at hwlaunch's line. The same holds for a library's threads that the
fork rule judges safe (``planning.fork_safety``: an idle OpenBLAS server, which numpy starts at
import). Any other thread (the program's, a native one such as GNU OpenMP's pool, the uni
executor's worker thread running user code) makes the warning true: it is then left alone (and
the resolver's thread rule picks forkserver unless fork was asked for).

``warnings.catch_warnings()`` swaps the process-wide filter list and restores it on exit, so a
filter another thread added meanwhile would be lost and that thread's warnings would meet ours.
It is used only when every other thread is one of ours, none of which touches warnings.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator

from hwlaunch._start_methods import StartMethodKind

_PROBES, _PROBE_GAP = 3, 0.002  # an ending thread is gone from /proc within microseconds
_SETTLE = 0.05  # seconds a running native thread is looked at again: the resolve waited already
_MESSAGE = r"This process \(pid=\d+\) is multi-threaded, use of fork\(\) may lead to deadlocks"


def only_fork_safe_threads() -> bool:
    """Every thread but this one is hwlaunch's own or one the fork rule judges safe, in the
    resolver's own threads fact (``probe_threads``), native ones included. Without /proc native
    threads cannot be counted, and the warning is left to CPython."""
    # Imported here, in the parent only: a worker importing any hwlaunch.executor.mp module
    # loads this package's __init__, and worker-side code must not load the planning layer.
    from hwlaunch.planning.fork_safety import judge_threads
    from hwlaunch.planning.threads import probe_threads

    for attempt in range(_PROBES):
        if attempt:
            time.sleep(_PROBE_GAP)  # a thread of ours that is ending has left threading's list
        threads = probe_threads(_SETTLE)  # but not yet /proc: it reads as foreign for a moment
        if threads.source != "/proc/self/task":
            return False
        verdicts = judge_threads(threads)
        if not (verdicts.risk or verdicts.fatal):
            return True
    return False


@contextlib.contextmanager
def quiet_safe_fork(kind: StartMethodKind) -> Iterator[None]:
    """Around the ``Process.start()`` of a launch's workers: no fork warning caused by
    threads a fork cannot hurt (looked at once, before the first worker starts)."""
    if not kind.copies_parent or not only_fork_safe_threads():
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_MESSAGE, category=DeprecationWarning)
        yield
