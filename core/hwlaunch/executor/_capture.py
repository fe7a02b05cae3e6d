"""In a worker process: file descriptors 1 and 2 become the pipes the driver reads.

Why at the descriptor level: a worker's output is not only Python's ``print``. C and C++ code
(a device runtime, NCCL's warnings), and any child process the worker starts, write to fds 1
and 2 directly; replacing ``sys.stdout`` would miss them all. After ``dup2`` every writer in
this process and its future children lands in the driver's pipes.

Python's own ``sys.stdout`` keeps the buffering it had (line-buffered when the driver's stdout
is a terminal, as a program writing there directly would be). One that does not write to fd 1
(the driver's, inherited through fork, was a redirect or a notebook's stream) is replaced by a
stream on fd 1, so that the worker's prints take the same path as everything else. A forked
worker always gets new streams: the ones it inherited may have been locked, at the instant of
the fork, by a thread of the driver writing to them (its output thread, the program's own), and
a lock held then stays held in the child.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from multiprocessing.connection import Connection

__all__ = ["capture_output"]


def capture_output(
    ends: tuple[Connection, Connection], line_buffered: bool, *, forked: bool
) -> None:
    """Make ``ends`` (the driver's write ends for stdout, stderr) this process's fds 1 and 2."""
    if not forked:
        for name in ("stdout", "stderr"):
            with contextlib.suppress(Exception):
                getattr(sys, name).flush()
    for fd, end in zip((1, 2), ends, strict=True):
        os.dup2(end.fileno(), fd)
        end.close()
    for fd, name in ((1, "stdout"), (2, "stderr")):
        old = getattr(sys, name, None)
        if forked or not _writes_to(old, fd):
            stream = io.TextIOWrapper(
                io.FileIO(fd, "w", closefd=False),
                encoding=getattr(old, "encoding", None) or "utf-8",
                errors="backslashreplace",
                line_buffering=line_buffered or name == "stderr",
            )
            setattr(sys, name, stream)


def _writes_to(stream: object, fd: int) -> bool:
    try:
        return stream is not None and stream.fileno() == fd  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False
