"""A worker's Python stacks, as the stall watchdog, ``dump_stacks`` and RpcTimeoutError show them.

Two readers, one text. The driver reads a worker's stacks from outside its process with py-spy
(``hwlaunch.executor._outside_stacks``), which needs nothing of the worker: it reads a process
that holds the GIL in a C call, or that is stopped. The worker answers too, from a thread of
hwlaunch's own (``STACKS_THREAD``; the Ray actor's control concurrency group) that reads
``sys._current_frames()``: the fallback where py-spy is absent or may not read the process,
and the only reader for an actor on another node. Never a signal handler: a handler runs on the
main thread between bytecodes, so it cannot run while that thread is stuck in native code (a
collective waiting in NCCL or gloo), which is exactly when the stack matters. Reading another
thread's frames stops nothing; the stack of a thread in native code ends at the Python call
that entered it.

Both texts show each thread from where hwlaunch hands over to the program (the call it runs),
or, in a worker between calls, from the worker's own entry point: what led there (a forked
driver's own ``launch``, multiprocessing's bootstrap) is counted, not shown.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import sys
import threading
import traceback
from collections.abc import Iterable, Sequence
from multiprocessing.connection import Connection

__all__ = [
    "STACKS_THREAD",
    "Frame",
    "Thread",
    "render_stacks",
    "serve_stacks",
    "shown_frames",
    "start_stack_thread",
    "thread_stacks",
]

STACKS_THREAD = "hwlaunch-stacks"  # listed in planning.threads.OWN_THREADS
_EXECUTOR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_RUNTIME = os.path.join(_EXECUTOR, "_runtime.py")
_CHILD = os.path.join(_EXECUTOR, "mp", "_child.py")
_PR_SET_PTRACER = 0x59616D61  # prctl: which process may ptrace (read) this one, under Yama
Frame = tuple[str, int, str]  # file, line, function; outermost first
# A rendered thread: its name, what its state is where known ("" else), its frames.
Thread = tuple[str, str, Sequence[Frame]]


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
    rendered: list[Thread] = []
    for ident in shown:
        thread = threads.get(ident)
        name = thread.name if thread is not None else f"thread {ident}"
        stack = [
            (f.filename, f.lineno or 0, f.name) for f in traceback.extract_stack(frames[ident])
        ]
        rendered.append((name, "", stack))
    return render_stacks(os.getpid(), rendered)


def render_stacks(pid: int, threads: Sequence[Thread], note: str = "") -> str:
    """The text of one process's stacks: a line naming the process (and ``note``), then each
    thread's title and the frames ``shown_frames`` keeps, with their source lines."""
    lines = [f"pid {pid}, {len(threads)} thread(s){note}:"]
    for name, state, stack in threads:
        lines.append(f'Thread "{name}"{f" ({state})" if state else ""} (most recent call last):')
        lines.extend(shown_frames(stack))
    return "\n".join(lines)


def shown_frames(stack: Sequence[Frame]) -> list[str]:
    """The frames from where hwlaunch hands over to the program (the call it runs), else from
    the mp worker's entry point (``worker_main``), else from hwlaunch's first frame in a thread
    of its own: what led there (a forked driver's launch, multiprocessing's bootstrap) says
    nothing about where a rank is stuck, and is counted instead."""
    calls = [i for i, f in enumerate(stack) if f[0] == _RUNTIME and _named(f, "call")]
    entries = [i for i, f in enumerate(stack) if f[0] == _CHILD and _named(f, "worker_main")]
    own = [i for i, f in enumerate(stack) if f[0].startswith(_EXECUTOR)]
    start = calls[-1] if calls else entries[-1] if entries else own[0] if own else 0
    summary = traceback.StackSummary.from_list([(f, n, name, None) for f, n, name in stack[start:]])
    hidden = [f"  ({start} outer frame{'s' if start > 1 else ''} not shown)"] if start else []
    return hidden + [line.rstrip("\n") for line in summary.format()]


def _named(frame: Frame, name: str) -> bool:
    """Whether the frame's function is ``name``; py-spy gives qualified names (``Cls.meth``)."""
    return frame[2] == name or frame[2].endswith(f".{name}")


def serve_stacks(conn: Connection) -> None:
    """Answer each request ``rid`` on ``conn`` with ``(rid, stacks)`` until the parent's end
    closes. The request id lets the parent drop a reply that came after it stopped waiting."""
    with contextlib.suppress(EOFError, OSError):
        while True:
            rid = pickle.loads(conn.recv_bytes())
            conn.send_bytes(pickle.dumps((rid, thread_stacks())))


def start_stack_thread(conn: Connection, reader: int) -> None:
    """Answer stack requests on ``conn``, and let process ``reader`` (the driver) and its
    children (its py-spy) read this process from outside, where the kernel's Yama module
    allows that only to a process's ancestors (``kernel.yama.ptrace_scope`` 1, the default of
    many distributions: the driver is a worker's parent, but py-spy is the driver's child)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            # PR_SET_PTRACER; an error where Yama is absent is harmless: nothing to allow
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PTRACER, reader, 0, 0, 0)
    threading.Thread(target=serve_stacks, args=(conn,), name=STACKS_THREAD, daemon=True).start()
