"""In a worker process: file descriptors 1 and 2 become the pipes the driver reads.

Why at the descriptor level: a worker's output is not only Python's ``print``. C and C++ code
(a device runtime, NCCL's warnings), and any child process the worker starts, write to fds 1
and 2 directly; replacing ``sys.stdout`` would miss them all. After ``dup2`` every writer in
this process and its future children lands in the driver's pipes.

Python's own ``sys.stdout`` keeps the buffering it had (line-buffered when the driver's stdout
is a terminal, as a program writing there directly would be). One that does not write to fd 1
(the driver's, inherited through fork, was a redirect or a notebook's stream) is replaced by a
stream on fd 1, so that the worker's prints take the same path as everything else.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from multiprocessing.connection import Connection

__all__ = ["capture_output"]


def capture_output(ends: tuple[Connection, Connection], line_buffered: bool) -> None:
    """Make ``ends`` (the driver's write ends for stdout, stderr) this process's fds 1 and 2."""
    for name in ("stdout", "stderr"):
        with contextlib.suppress(Exception):
            getattr(sys, name).flush()
    for fd, end in zip((1, 2), ends, strict=True):
        os.dup2(end.fileno(), fd)
        end.close()
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if not _writes_to(getattr(sys, name, None), fd):
            stream = io.TextIOWrapper(
                io.FileIO(fd, "w", closefd=False),
                encoding="utf-8",
                errors="backslashreplace",
                line_buffering=line_buffered or name == "stderr",
            )
            setattr(sys, name, stream)


def _writes_to(stream: object, fd: int) -> bool:
    try:
        return stream is not None and stream.fileno() == fd  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False
