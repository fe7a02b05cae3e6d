"""A shared-memory broadcast channel: one writer (the parent), N readers (the workers).

Why: ``collective_rpc`` runs on every step of an engine. Through pipes, a request is written
once per worker and every message costs a system call on each side. Here the request is written
once into a ring that every worker reads, and each worker answers into a slot of its own; while
messages are frequent, both sides find them by polling memory, with no system call at all.

Layout of one anonymous memory file (``memfd``; nothing is ever named in ``/dev/shm``, so nothing
can be left behind, even when every process is SIGKILLed: the kernel frees the memory when the
last process that maps it ends):

- one cache line per party with its *sleeping* byte (the parent's, then each reader's);
- a ring of ``chunks`` chunks: a header (``written`` byte, one ``read`` byte per reader, the
  message length) and ``chunk_bytes`` of data;
- one reply slot per reader: a header (``full`` byte, the length) and
  ``slot_bytes`` of data.

A message that does not fit goes through the rank's pipe instead, with a marker in the ring or
slot; that is the pipe channel's cost, so large payloads are never slower than with pipes.

Waiting: a party polls (with ``sched_yield``) for ``spin`` seconds (none after it sent more than
``SPIN_MAX_BYTES``), then sets its sleeping byte, checks once more and blocks on its wake pipe; whoever publishes checks the sleeping bytes after
publishing and writes a byte to the wake pipe of each sleeper. The store of the flag and the load
of the other side's flag are separated by a full memory fence on both sides (a lock round trip:
an atomic read-modify-write), so a wake-up is never lost; a bounded block is a second guard.

Writer and readers never wait forever on each other: the parent's waits take a deadline and the
worker processes' sentinels; a worker whose parent dies is ended by its death pipe.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import platform
import select
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Sequence
from multiprocessing import connection, reduction
from multiprocessing.connection import Connection
from typing import Any, TypeVar

T = TypeVar("T")
Buffer = bytes | memoryview

CHUNK_BYTES = 4 * 1024 * 1024
CHUNKS = 4
SLOT_BYTES = 4 * 1024 * 1024
BLOCK_STEP = 0.1  # the longest a blocked party sleeps before it looks again (a second guard)
# Polling pays only when the answer comes within microseconds. A side that has just handed over
# a larger message knows the answer will take at least the time to decode it: it blocks at once
# (and leaves the CPU to whoever decodes).
SPIN_MAX_BYTES = 64 * 1024

LINE = 64  # one cache line, so that parties polling different flags do not share one
_LEN = struct.Struct("<Q")
OVERFLOW = (1 << 64) - 1  # length marker: the message travels through the rank's pipe

_fence_lock = threading.Lock()
# x86 keeps stores in order and loads in order: data written before a flag is seen before it.
_TOTAL_STORE_ORDER = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def _fence() -> None:
    """A full memory barrier: acquiring a lock is an atomic read-modify-write.

    Needed between storing one's own sleeping flag and loading the other side's message flag
    (and the reverse): every CPU, x86 included, may let that load pass that store.
    """
    with _fence_lock:
        pass


def _order() -> None:
    """Keep data and its flag in order, on CPUs that do not do so by themselves (ARM)."""
    if not _TOTAL_STORE_ORDER:
        _fence()


class ChannelLost(Exception):
    """The pipe to ``rank`` ended (its process is gone, or the channel was closed)."""

    def __init__(self, rank: int) -> None:
        super().__init__(f"rank {rank}'s channel ended")
        self.rank = rank


class SharedFd:
    """A file descriptor that reaches a child under every start method.

    Under fork the child inherits the number as it is; under spawn and forkserver pickling
    duplicates it into the child (multiprocessing's own mechanism for pipes).
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_fd, (reduction.DupFd(self.fd),))


def _rebuild_fd(dup: Any) -> SharedFd:
    return SharedFd(dup.detach())


def _anonymous_file(size: int, name: str) -> int:
    """A memory file with no name anywhere (Linux ``memfd``), else a temp file unlinked at once."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
    else:  # pragma: no cover - non-Linux
        fd, path = tempfile.mkstemp(prefix=name)
        os.unlink(path)
    os.ftruncate(fd, size)
    return fd


def _wake_pipe() -> tuple[int, int]:
    """A pipe whose ends never block: a full pipe already wakes its reader."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    return r, w


def _wake(fd: int) -> None:
    with contextlib.suppress(BlockingIOError, BrokenPipeError, OSError):
        os.write(fd, b"\0")


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError, OSError):
        while os.read(fd, 4096):
            pass


class Geometry:
    """Where everything lives in the memory file; the same arithmetic on both sides."""

    def __init__(self, readers: int, chunk_bytes: int, chunks: int, slot_bytes: int) -> None:
        self.readers = readers
        self.chunk_bytes = chunk_bytes
        self.chunks = chunks
        self.slot_bytes = slot_bytes
        self.chunk_header = _round_up(1 + readers + _LEN.size)
        self.chunk_stride = _round_up(self.chunk_header + chunk_bytes)
        self.ring = LINE * (1 + readers)
        self.slot_header = _round_up(1 + _LEN.size)
        self.slot_stride = _round_up(self.slot_header + slot_bytes)
        self.slots = self.ring + chunks * self.chunk_stride
        self.size = self.slots + readers * self.slot_stride

    def sleeping(self, party: int) -> int:
        """Offset of a sleeping byte: party 0 is the parent, party ``1 + rank`` a reader."""
        return LINE * party

    def chunk(self, index: int) -> int:
        """Offset of chunk ``index``: written byte, read bytes, length, then data."""
        return self.ring + index * self.chunk_stride

    def slot(self, rank: int) -> int:
        """Offset of ``rank``'s reply slot: full byte, length, then data."""
        return self.slots + rank * self.slot_stride


def _round_up(n: int) -> int:
    return (n + LINE - 1) // LINE * LINE


def _spin_then_block(
    ready: Callable[[], bool],
    mm: mmap.mmap,
    sleeping_at: int,
    spin: float,
    block: Callable[[float], bool],
    deadline: float | None,
) -> bool:
    """Poll ``ready`` for ``spin`` seconds, then block; False when ``deadline`` passed first.

    ``block(seconds)`` sleeps until woken (True means: stop waiting, something else happened).
    """
    if ready():
        return True
    end_spin = time.monotonic() + spin
    while spin > 0:
        os.sched_yield()
        if ready():
            return True
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return False
        if now >= end_spin:
            break
    mm[sleeping_at] = 1
    try:
        while True:
            _fence()
            if ready():
                return True
            wait = BLOCK_STEP
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return False
            if block(wait):
                return True
    finally:
        mm[sleeping_at] = 0


# -- the parent's side -----------------------------------------------------------------------
class ShmChannel:
    """The writer: broadcasts requests, gathers replies. Used by one RPC thread at a time."""

    def __init__(
        self,
        readers: int,
        *,
        spin: float,
        chunk_bytes: int = CHUNK_BYTES,
        chunks: int = CHUNKS,
        slot_bytes: int = SLOT_BYTES,
    ) -> None:
        self.geometry = g = Geometry(readers, chunk_bytes, chunks, slot_bytes)
        self.spin = spin
        self.conns: list[Connection] = []  # the ranks' pipes, for what does not fit
        self._fd = _anonymous_file(g.size, f"hwlaunch-{os.getpid()}-rpc")
        self.mm = mmap.mmap(self._fd, g.size)
        self._wake_r, self._wake_w = _wake_pipe()  # readers wake the parent
        self._reader_wakes = [_wake_pipe() for _ in range(readers)]
        self._next = 0  # ring index of the next message
        self._last_size = 0  # of the last message sent
        self._closed = False

    def endpoint(self, rank: int, conn: Connection | None = None) -> ShmEndpoint:
        """What worker ``rank`` needs (picklable); ``conn`` is its end of the rank's pipe."""
        g = self.geometry
        return ShmEndpoint(
            rank,
            SharedFd(self._fd),
            (g.readers, g.chunk_bytes, g.chunks, g.slot_bytes),
            SharedFd(self._reader_wakes[rank][0]),
            SharedFd(self._wake_w),
            self.spin,
            conn,
        )

    def child_fds(self, rank: int) -> tuple[int, ...]:
        """Descriptors a forked worker ``rank`` inherits but must not keep."""
        others = [r for i, (r, _) in enumerate(self._reader_wakes) if i != rank]
        return (self._wake_r, *others, *(w for _, w in self._reader_wakes))

    # writing
    def send(self, data: bytes, alive: Callable[[], None], deadline: float | None = None) -> None:
        """Write one message for every reader; ``alive()`` raises when a reader is gone.

        A message larger than a chunk is marked in the ring and written to each rank's pipe.
        """
        g, mm = self.geometry, self.mm
        self._last_size = len(data)
        at = g.chunk(self._next)
        reads = range(at + 1, at + 1 + g.readers)

        def free() -> bool:
            return mm[at] == 0 or all(mm[i] for i in reads)

        while not free():  # a reader has not taken the message before last in this chunk
            self._wait_free(free, alive, deadline)
        mm[at] = 0
        mm[at + 1 : at + 1 + g.readers] = bytes(g.readers)
        big = len(data) > g.chunk_bytes
        _LEN.pack_into(mm, at + 1 + g.readers, OVERFLOW if big else len(data))
        if not big:
            mm[at + g.chunk_header : at + g.chunk_header + len(data)] = data
        _order()  # the message is in memory before its flag says so
        mm[at] = 1
        self._next = (self._next + 1) % g.chunks
        _fence()
        for rank in range(g.readers):
            if mm[g.sleeping(1 + rank)]:
                _wake(self._reader_wakes[rank][1])
        if big:
            for rank, conn in enumerate(self.conns):
                try:
                    conn.send_bytes(data)
                except OSError:
                    raise ChannelLost(rank) from None

    def _wait_free(
        self, free: Callable[[], bool], alive: Callable[[], None], deadline: float | None
    ) -> None:
        step = 0.0001
        while not free():
            alive()
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError("a reader did not take an earlier message in time")
            time.sleep(step)
            step = min(step * 2, 0.01)

    # reading replies
    def receive(
        self,
        pending: Collection[int],
        timeout: float | None,
        sentinels: Sequence[int],
        decode: Callable[[Buffer], T],
    ) -> tuple[list[tuple[int, T]], list[int]]:
        """Replies ``(rank, decode(data))`` that have arrived from ``pending`` ranks, and the
        ``sentinels`` that became ready; both empty when ``timeout`` passed first.

        Polls for ``spin`` seconds, then blocks on the wake pipe and the sentinels. A reply in
        shared memory is decoded where it lies (no copy first); ``decode`` must not raise.
        """
        g, mm = self.geometry, self.mm
        deadline = None if timeout is None else time.monotonic() + timeout
        fulls = [(rank, g.slot(rank)) for rank in pending]
        ended: list[int] = []

        def ready() -> bool:
            return any(mm[at] for _, at in fulls)

        def block(seconds: float) -> bool:
            ready_ = connection.wait([self._wake_r, *sentinels], timeout=seconds)
            _drain(self._wake_r)
            ended.extend(s for s in ready_ if s != self._wake_r)  # type: ignore[misc]
            return bool(ended)

        _spin_then_block(ready, mm, g.sleeping(0), self._spin_after(), block, deadline)
        replies = []
        _order()  # nothing of a reply is read before its flag
        for rank, at in fulls:
            if not mm[at]:
                continue
            (length,) = _LEN.unpack_from(mm, at + 1)
            if length == OVERFLOW:
                try:
                    value = decode(self.conns[rank].recv_bytes())
                except (EOFError, OSError):
                    raise ChannelLost(rank) from None
            else:
                start = at + g.slot_header
                with memoryview(mm) as whole, whole[start : start + length] as view:
                    value = decode(view)
            mm[at] = 0
            replies.append((rank, value))
        if not replies and not ended and deadline is not None:
            ended += [s for s in connection.wait(list(sentinels), timeout=0)]  # type: ignore[misc]
        return replies, ended

    def _spin_after(self) -> float:
        return self.spin if self._last_size <= SPIN_MAX_BYTES else 0.0

    def close(self) -> None:
        """Unmap and close every descriptor; the memory is freed when the workers are gone."""
        if self._closed:
            return
        self._closed = True
        self.mm.close()
        for fd in (self._fd, self._wake_r, self._wake_w, *sum(self._reader_wakes, ())):
            with contextlib.suppress(OSError):
                os.close(fd)


# -- a worker's side -------------------------------------------------------------------------
class ShmEndpoint:
    """A reader: takes each broadcast message in turn and answers into its own slot.

    It reads and writes like the worker's end of a pipe (``recv_bytes``, ``send_bytes``), so
    the worker's loop is the same for both channels.
    """

    def __init__(
        self,
        rank: int,
        memory: SharedFd,
        geometry: tuple[int, int, int, int],
        wake_r: SharedFd,
        parent_wake_w: SharedFd,
        spin: float,
        conn: Connection | None,
    ) -> None:
        self.rank = rank
        self.memory = memory
        self.geometry_args = geometry
        self.wake_r = wake_r
        self.parent_wake_w = parent_wake_w
        self.spin = spin
        self.conn = conn
        self._mm: mmap.mmap | None = None
        self._poller: Any = None
        self._next = 0
        self._last_size = 0  # of the last reply sent

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {"_mm": None, "_poller": None}

    def _map(self) -> tuple[Geometry, mmap.mmap]:
        if self._mm is None:
            self._g = Geometry(*self.geometry_args)
            self._mm = mmap.mmap(self.memory.fd, self._g.size)
            os.close(self.memory.fd)  # the mapping keeps the memory
            self._poller = select.poll()
            self._poller.register(self.wake_r.fd, select.POLLIN)
        return self._g, self._mm

    def recv_bytes(self) -> bytes:
        """The next message (blocking). EOFError when the pipe it had to come through ended."""
        g, mm = self._map()
        at = g.chunk(self._next)
        flag = at + 1 + self.rank
        poller = self._poller

        def ready() -> bool:
            return mm[at] == 1 and mm[flag] == 0

        def block(seconds: float) -> bool:
            poller.poll(seconds * 1000)
            _drain(self.wake_r.fd)
            return False

        spin = self.spin if self._last_size <= SPIN_MAX_BYTES else 0.0
        _spin_then_block(ready, mm, g.sleeping(1 + self.rank), spin, block, None)
        _order()
        (length,) = _LEN.unpack_from(mm, at + 1 + g.readers)
        if length == OVERFLOW:
            data = None
        else:
            start = at + g.chunk_header
            data = mm[start : start + length]
        mm[flag] = 1
        self._next = (self._next + 1) % g.chunks
        if data is None:
            assert self.conn is not None
            data = self.conn.recv_bytes()  # EOFError / OSError when the parent is gone
        return data

    def send_bytes(self, data: bytes) -> None:
        """Answer the last message (the parent takes each answer before it sends again)."""
        g, mm = self._map()
        self._last_size = len(data)
        at = g.slot(self.rank)
        while mm[at]:  # never the case while the parent keeps the protocol; never overwrite
            time.sleep(0.0001)
        big = len(data) > g.slot_bytes
        _LEN.pack_into(mm, at + 1, OVERFLOW if big else len(data))
        if not big:
            mm[at + g.slot_header : at + g.slot_header + len(data)] = data
        _order()
        mm[at] = 1
        _fence()
        if mm[g.sleeping(0)]:
            _wake(self.parent_wake_w.fd)
        if big:
            assert self.conn is not None
            self.conn.send_bytes(data)
