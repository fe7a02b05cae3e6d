"""A worker's Python stacks, read while it runs: what the stall watchdog and ``dump_stacks`` show.

The stacks are read with ``sys._current_frames()`` from a thread of hwlaunch's own in the
worker (``STACKS_THREAD``; the Ray actor's control concurrency group), never from a signal
handler: a handler runs on the main thread between bytecodes, so it cannot run while that
thread is stuck in native code (a collective waiting in NCCL or gloo), which is exactly when
the stack matters. Reading another thread's frames stops nothing; the stack of a thread in
native code ends at the Python call that entered it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import threading
import traceback
from collections.abc import Iterable
from multiprocessing.connection import Connection

__all__ = ["STACKS_THREAD", "serve_stacks", "start_stack_thread", "thread_stacks"]

STACKS_THREAD = "hwlaunch-stacks"  # listed in planning.threads.OWN_THREADS
_EXECUTOR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_RUNTIME = os.path.join(_EXECUTOR, "_runtime.py")


def thread_stacks(only: Iterable[int] | None = None) -> str:
    """Every thread's stack in this process (or those of the ``only`` idents), innermost call
    last, each under a line naming the thread; hwlaunch's own stack thread is left out."""
    frames = sys._current_frames()
    threads = {t.ident: t for t in threading.enumerate()}
    main = threading.main_thread().ident
    candidates = frames if only is None else set(only) & set(frames)
    shown = sorted(
        (i for i in candidates if getattr(threads.get(i), "name", None) != STACKS_THREAD),
        key=lambda i: (i != main, i),
    )
    lines = [f"pid {os.getpid()}, {len(shown)} thread(s):"]
    for ident in shown:
        thread = threads.get(ident)
        name = thread.name if thread is not None else f"thread {ident}"
        lines.append(f'Thread "{name}" (most recent call last):')
        lines.extend(_shown_part(traceback.extract_stack(frames[ident])))
    return "\n".join(lines)


def _shown_part(stack: traceback.StackSummary) -> list[str]:
    """The frames from where hwlaunch hands over to the program (the call it runs), or from
    hwlaunch's first frame in a thread of its own: what led there (a forked parent's launch,
    multiprocessing's bootstrap) says nothing about where a rank is stuck."""
    calls = [i for i, f in enumerate(stack) if f.filename == _RUNTIME and f.name == "call"]
    own = [i for i, f in enumerate(stack) if f.filename.startswith(_EXECUTOR)]
    start = calls[-1] if calls else own[0] if own else 0
    shown = traceback.StackSummary.from_list(stack[start:]).format()
    hidden = [f"  ({start} outer frame{'s' if start > 1 else ''} not shown)"] if start else []
    return hidden + [line.rstrip("\n") for line in shown]


def serve_stacks(conn: Connection) -> None:
    """Answer each request ``rid`` on ``conn`` with ``(rid, stacks)`` until the parent's end
    closes. The request id lets the parent drop a reply that came after it stopped waiting."""
    with contextlib.suppress(EOFError, OSError):
        while True:
            rid = pickle.loads(conn.recv_bytes())
            conn.send_bytes(pickle.dumps((rid, thread_stacks())))


def start_stack_thread(conn: Connection) -> None:
    threading.Thread(target=serve_stacks, args=(conn,), name=STACKS_THREAD, daemon=True).start()
