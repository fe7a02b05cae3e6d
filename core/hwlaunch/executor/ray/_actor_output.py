"""In a Ray actor: its fds 1 and 2 captured, for the driver to collect (``ray._output``).

Why apart from the driver's collector: this half runs in the actor, which imports nothing of
the driver's side (import-linter holds the wall); the way lines are assembled and shown is
the driver's (``hwlaunch.executor._output``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

__all__ = ["OUTPUT_GROUP", "ActorOutput"]

OUTPUT_GROUP = "hwlaunch_output"  # the actors' concurrency group for collect()
CHUNK = 64 * 1024


class ActorOutput:
    """In the actor: fds 1 and 2 as pipes, read into a buffer that ``collect`` empties."""

    def __init__(self) -> None:
        self._chunks: list[tuple[int, bytes]] = []
        self._ready = threading.Condition()
        for index, fd in enumerate((1, 2)):
            with contextlib.suppress(Exception):
                (sys.stdout, sys.stderr)[index].flush()
            read_fd, write_fd = os.pipe()
            os.dup2(write_fd, fd)
            os.close(write_fd)
            threading.Thread(
                target=self._read, args=(index, read_fd), name=f"hwlaunch-fd{fd}", daemon=True
            ).start()

    def _read(self, index: int, read_fd: int) -> None:
        while chunk := os.read(read_fd, CHUNK):
            with self._ready:
                self._chunks.append((index, chunk))
                self._ready.notify_all()

    def collect(self, wait: float) -> list[tuple[int, bytes]]:
        """What was written since the last call, as (0 stdout | 1 stderr, bytes) in order;
        waits up to ``wait`` seconds for something."""
        with self._ready:
            self._ready.wait_for(lambda: bool(self._chunks), timeout=wait)
            chunks, self._chunks = self._chunks, []
        return chunks
