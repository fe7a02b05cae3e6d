"""The worker's side of ``forward_signals``: a forwarded signal calls ``handle_signal(signum)``.

Worker-side code. Python runs signal handlers on a process's main thread, and installs them
from there only: a Ray actor runs its calls on other threads, so a worker there could never
install one itself. So every worker process installs, from its main thread and before the
worker is built, a dispatcher for each forwarded signal: it calls the worker's
``handle_signal(signum)`` when the worker defines one, and otherwise does what the process did
before (the default action, ignoring it, or the handler that was there). A handler that the
worker installs itself (``signal.signal`` on an mp worker's main thread, in ``init_device``
or a call) replaces the dispatcher, as the program asked.

The handler runs on the main thread while a call may be running on another (Ray) or between
the calls' messages (mp); an exception it raises is printed to the worker's stderr, and the
worker goes on.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["install_dispatch"]


def install_dispatch(
    names: tuple[str, ...], worker: Callable[[], Any], skip: tuple[int, ...] = ()
) -> None:
    """On the main thread: the dispatchers of the signals ``names``, but for those in ``skip``
    (the executor's own: SIGTERM ends an mp worker). ``worker()`` is the worker, or None
    while it is being built."""
    for name in names:
        signum = signal.Signals[name]
        if signum not in skip:
            previous = signal.getsignal(signum)
            signal.signal(signum, _dispatcher(worker, previous))


def _dispatcher(
    worker: Callable[[], Any], previous: Any
) -> Callable[[int, FrameType | None], None]:
    def dispatch(signum: int, frame: FrameType | None) -> None:
        handle = getattr(worker(), "handle_signal", None)
        if callable(handle):
            try:
                handle(signum)
            except Exception:
                print(
                    f"hwlaunch: the worker's handle_signal({signal.Signals(signum).name}) "
                    f"raised:\n{traceback.format_exc()}",
                    file=sys.stderr,
                    flush=True,
                )
        elif callable(previous):
            previous(signum, frame)
        elif previous in (signal.SIG_DFL, None):
            signal.signal(signum, signal.SIG_DFL)  # the default action, as before
            os.kill(os.getpid(), signum)
            signal.signal(signum, dispatch)  # still here: the default was to go on

    return dispatch
