"""The raw shared-memory floor of a round trip: what copying the bytes costs, and nothing else.

A parent and one forked child share an anonymous ``mmap``. The parent copies the payload into
it and stores a sequence byte after it; the child, polling that byte with ``sched_yield``
between looks (as the shm channel polls), copies the payload out into a byte string of its
own, copies that into its reply area and stores the same sequence byte there; the parent,
polling likewise, copies the reply out. Four copies, as an echo through the channel makes
(in, out, in, out), with no pickling, no framing and no call. Between two batches the child
blocks on a pipe, so that it takes no CPU while other contenders run.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

REQUEST_SEQ, REPLY_SEQ, LENGTH, STOP = 0, 64, 128, 192  # byte offsets of the flags
DATA = 4096  # the request area starts here; the reply area right after it
_yield = os.sched_yield


def _child(mm: mmap.mmap, area: int, batches: Connection) -> None:
    seq = 0
    while batches.recv_bytes():  # b"": the parent is done
        while True:
            while mm[REQUEST_SEQ] == seq and not mm[STOP]:
                _yield()
            if mm[REQUEST_SEQ] == seq:  # the batch is over
                break
            seq = mm[REQUEST_SEQ]
            n = int.from_bytes(mm[LENGTH : LENGTH + 8], "little")
            data = mm[DATA : DATA + n]
            mm[DATA + area : DATA + area + n] = data
            mm[REPLY_SEQ] = seq


class Floor:
    """The parent's side: ``batch(data)`` is a round-trip function for one batch of calls."""

    def __init__(self, largest: int) -> None:
        self.area = largest
        self.mm = mmap.mmap(-1, DATA + 2 * largest)
        ctx = multiprocessing.get_context("fork")
        self._batches, child_end = ctx.Pipe()
        self._process = ctx.Process(target=_child, args=(self.mm, largest, child_end))
        self._process.start()
        child_end.close()
        self._seq = 0

    def begin(self, data: bytes) -> Callable[[], Any]:
        """Start a batch of round trips of ``data``; call ``end()`` after the last one."""
        mm, n, area = self.mm, len(data), self.area
        mm[LENGTH : LENGTH + 8] = n.to_bytes(8, "little")
        mm[STOP] = 0
        self._batches.send_bytes(b"go")

        def round_trip() -> bytes:
            self._seq = seq = self._seq % 255 + 1
            mm[DATA : DATA + n] = data
            mm[REQUEST_SEQ] = seq
            while mm[REPLY_SEQ] != seq:
                _yield()
            return mm[DATA + area : DATA + area + n]

        return round_trip

    @property
    def pid(self) -> int:
        """The child's process id."""
        assert self._process.pid is not None
        return self._process.pid

    def end(self) -> None:
        self.mm[STOP] = 1

    def close(self) -> None:
        self._batches.send_bytes(b"")
        self._process.join(10)
        self._batches.close()
