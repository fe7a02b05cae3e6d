"""A shared-memory broadcast channel: one writer (the parent), N readers (the workers).

Why: ``collective_rpc`` runs on every step of an engine. Through pipes, a request is written
once per worker and every message costs system calls on each side. Here the request is written
once into a ring that every worker reads, and each worker answers into a slot of its own; while
messages are frequent, both sides find them by polling memory, with no system call at all.

Layout of one anonymous memory file (``memfd``; nothing is ever named in ``/dev/shm``, so nothing
can be left behind, even when every process is SIGKILLed: the kernel frees the memory when the
last process that maps it ends), every part starting on a cache line of its own:

- the parent's line: its *sleeping* byte;
- one line per reader: its *sleeping* byte, then its *consumed* byte (the sequence byte of the
  last message it took);
- a ring of ``chunks`` chunks: a header line (the *sequence* byte, the message length) and
  ``chunk_bytes`` of data;
- one reply slot per reader: a header line (the sequence byte of the message it answers, the
  length) and ``slot_bytes`` of data.

Message ``n`` (counted from 1) goes into chunk ``n % chunks`` with sequence byte ``n & 0xFF``,
written after the data; a reader waits for that byte, and its reply carries the same byte. The
writer reuses a chunk once every reader's consumed byte shows that it took the message before.
Nothing is ever cleared, so a message costs one flag store on each side.

A message that does not fit goes through the rank's pipe instead, with a length marker in the
ring or slot; that is the pipe channel's cost, so large payloads are never slower than with pipes.

Waiting: a party polls (with ``sched_yield``) for ``spin`` seconds (none after it sent more than
``SPIN_MAX_BYTES``, and none for a while after a yield showed that another task needed the CPU:
see ``Spinner``), then sets its sleeping byte, checks once more and blocks on its wake pipe;
whoever publishes checks the sleeping bytes after publishing and writes a byte to the wake pipe
of each sleeper. The store of the flag and the load of the other side's flag are separated by a
full memory fence on both sides (a lock round trip: an atomic read-modify-write), so a wake-up is
never lost; a bounded block is a second guard.

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
from multiprocessing import reduction
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
# A yield that gives the CPU away for longer than this means that another task needed it for a
# time slice (the scheduler's smallest is 0.75 ms; a woken worker's first round takes up to
# ~0.2 ms here): polling would cost that task a slice per round, so the waiting side blocks
# instead, and polls again only after QUIET_AFTER_CONTENTION seconds.
CONTENDED_YIELD = 500e-6
QUIET_AFTER_CONTENTION = 0.25
COPY_MAX_BYTES = 64 * 1024  # a reply up to this size is copied out; a larger one decoded in place

LINE = 64  # one cache line, so that parties polling different flags do not share one
_LEN = struct.Struct("<Q")
LENGTH_AT = 8  # in a chunk or slot header: the sequence byte at 0, the length here
OVERFLOW = (1 << 64) - 1  # length marker: the message travels through the rank's pipe

_fence_lock = threading.Lock()
# x86 keeps stores in order and loads in order: data written before a flag is seen before it.
_TOTAL_STORE_ORDER = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
_sched_yield = getattr(os, "sched_yield", lambda: time.sleep(0))
_now = time.monotonic


def _fence() -> None:
    """A full memory barrier: acquiring a lock is an atomic read-modify-write.

    Needed between storing one's own sleeping flag and loading the other side's message flag
    (and the reverse): every CPU, x86 included, may let that load pass that store.
    """
    with _fence_lock:
        pass


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
    """Empty a wake pipe: one read, unless it came back full."""
    with contextlib.suppress(BlockingIOError, OSError):
        while len(os.read(fd, 4096)) == 4096:
            pass


class Geometry:
    """Where everything lives in the memory file; the same arithmetic on both sides."""

    def __init__(self, readers: int, chunk_bytes: int, chunks: int, slot_bytes: int) -> None:
        if not 1 <= chunks < 256:
            raise ValueError(f"chunks={chunks}: a ring has 1 to 255 chunks (sequence bytes)")
        self.readers = readers
        self.chunk_bytes = chunk_bytes
        self.chunks = chunks
        self.slot_bytes = slot_bytes
        chunk_stride = _round_up(LINE + chunk_bytes)
        slot_stride = _round_up(LINE + slot_bytes)
        ring = LINE * (1 + readers)
        slots = ring + chunks * chunk_stride
        self.chunk_at = [ring + index * chunk_stride for index in range(chunks)]
        self.slot_at = [slots + rank * slot_stride for rank in range(readers)]
        self.size = slots + readers * slot_stride

    @staticmethod
    def line(party: int) -> int:
        """Offset of a party's line: 0 is the parent, ``1 + rank`` a reader."""
        return LINE * party


def _round_up(n: int) -> int:
    return (n + LINE - 1) // LINE * LINE


def _sleep_until(
    ready: Callable[[], bool],
    mm: mmap.mmap,
    sleeping_at: int,
    block: Callable[[float], bool],
    deadline: float | None,
) -> bool:
    """Block (the sleeping byte set) until ``ready()``; False when ``deadline`` passed first.

    ``block(seconds)`` sleeps until woken (True means: stop waiting, something else happened).
    """
    mm[sleeping_at] = 1
    try:
        while True:
            _fence()
            if ready():
                return True
            wait = BLOCK_STEP
            if deadline is not None:
                wait = min(wait, deadline - _now())
                if wait <= 0:
                    return False
            if block(wait):
                return True
    finally:
        mm[sleeping_at] = 0


class Spinner:
    """One party's polling policy: poll while the CPU is free for it, block otherwise.

    Polling yields the CPU on every round (``sched_yield``), so that a party that shares a CPU
    with the one it waits for lets it run. When a yield comes back late, another task needed
    the CPU; polling then costs that task a time slice per round, so this party stops polling
    (the wait blocks) for ``QUIET_AFTER_CONTENTION`` seconds.
    """

    def __init__(self, window: float) -> None:
        self.window = window
        self.quiet_until = 0.0  # no polling before this time (monotonic)

    def poll(self, mm: mmap.mmap, flags: Sequence[int], seq: int, deadline: float | None) -> bool:
        """Poll until every byte at ``flags`` is ``seq``, for the window (or until
        ``deadline``); False: block now."""
        now = _now()
        if self.window <= 0 or now < self.quiet_until:
            return False
        end = now + self.window
        if deadline is not None and deadline < end:
            end = deadline
        while True:
            _sched_yield()
            for at in flags:
                if mm[at] != seq:
                    break
            else:
                return True
            last, now = now, _now()
            if now - last > CONTENDED_YIELD:
                self.quiet_until = now + QUIET_AFTER_CONTENTION
                return False
            if now >= end:
                return False


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
        self._spinner = Spinner(spin)
        self.conns: list[Connection] = []  # the ranks' pipes, for what does not fit
        self._fd = _anonymous_file(g.size, f"hwlaunch-{os.getpid()}-rpc")
        self.mm = mmap.mmap(self._fd, g.size)
        self._wake_r, self._wake_w = _wake_pipe()  # readers wake the parent
        self._reader_wakes = [_wake_pipe() for _ in range(readers)]
        self._sleeping = [(g.line(1 + r), w) for r, (_, w) in enumerate(self._reader_wakes)]
        self._consumed = [g.line(1 + r) + 1 for r in range(readers)]
        self._sent = 0  # messages sent so far; the last one's sequence byte is its low byte
        self._last_size = 0  # of the last message sent
        self._poller: tuple[tuple[int, ...], Any] | None = None
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
    def send(
        self,
        data: Buffer,
        alive: Callable[[], None],
        deadline: float | None = None,
        head: bytes = b"",
    ) -> None:
        """Write one message, ``head + data``, for every reader; ``alive()`` raises when a
        reader is gone. A message larger than a chunk is marked in the ring and written to each
        rank's pipe.
        """
        g, mm = self.geometry, self.mm
        n = self._sent + 1
        self._wait_free(n, alive, deadline)
        at = g.chunk_at[n % g.chunks]
        size = len(head) + len(data)
        big = size > g.chunk_bytes
        _LEN.pack_into(mm, at + LENGTH_AT, OVERFLOW if big else size)
        if not big:
            start = at + LINE + len(head)
            mm[at + LINE : start] = head
            mm[start : start + len(data)] = data
        if not _TOTAL_STORE_ORDER:
            _fence()  # the message is in memory before its sequence byte says so
        mm[at] = n & 0xFF
        self._sent, self._last_size = n, size
        with _fence_lock:  # a full fence (see _fence)
            pass
        for line, wake_w in self._sleeping:
            if mm[line]:
                _wake(wake_w)
        if big:
            message = head + data
            for rank, conn in enumerate(self.conns):
                try:
                    conn.send_bytes(message)
                except OSError:
                    raise ChannelLost(rank) from None

    def _wait_free(self, n: int, alive: Callable[[], None], deadline: float | None) -> None:
        """Return once every reader took the message before ``n`` in its chunk."""
        mm, chunks, step = self.mm, self.geometry.chunks, 0.0001
        while any((n - mm[at]) & 0xFF > chunks for at in self._consumed):
            alive()
            if deadline is not None and _now() >= deadline:
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
        """Replies ``(rank, decode(data))`` to the last message that have arrived from
        ``pending`` ranks, and the ``sentinels`` that became ready; both empty when ``timeout``
        passed first.

        Polls for ``spin`` seconds until every pending rank answered, then blocks on the wake
        pipe and the sentinels until one more does. ``decode`` must not raise.
        """
        mm, slot_at, seq = self.mm, self.geometry.slot_at, self._sent & 0xFF
        ended: list[int] = []
        for rank in pending:
            if mm[slot_at[rank]] != seq:
                self._await(pending, seq, timeout, sentinels, ended)
                break
        replies = []
        if not _TOTAL_STORE_ORDER:
            _fence()  # nothing of a reply is read before its sequence byte
        for rank in pending:
            at = slot_at[rank]
            if mm[at] != seq:
                continue
            (length,) = _LEN.unpack_from(mm, at + LENGTH_AT)
            if length <= COPY_MAX_BYTES:  # one allocation is cheaper than a view
                value = decode(mm[at + LINE : at + LINE + length])
            elif length == OVERFLOW:
                try:
                    value = decode(self.conns[rank].recv_bytes())
                except (EOFError, OSError):
                    raise ChannelLost(rank) from None
            else:  # decoded where it lies, not copied first
                with memoryview(mm) as whole, whole[at + LINE : at + LINE + length] as view:
                    value = decode(view)
            replies.append((rank, value))
        if not replies and not ended and timeout is not None:
            ended += self._ready_sentinels(sentinels, 0)
        return replies, ended

    def _await(
        self,
        pending: Collection[int],
        seq: int,
        timeout: float | None,
        sentinels: Sequence[int],
        ended: list[int],
    ) -> None:
        """Poll, then block, until a pending rank answers, a sentinel fires or time is up."""
        deadline = None if timeout is None else _now() + timeout
        mm, slot_at = self.mm, self.geometry.slot_at
        flags = [slot_at[rank] for rank in pending]
        if self._last_size <= SPIN_MAX_BYTES and self._spinner.poll(mm, flags, seq, deadline):
            return
        if not any(mm[slot_at[rank]] == seq for rank in pending):
            self._block(pending, seq, sentinels, deadline, ended)

    def _block(
        self,
        pending: Collection[int],
        seq: int,
        sentinels: Sequence[int],
        deadline: float | None,
        ended: list[int],
    ) -> None:
        mm, slot_at = self.mm, self.geometry.slot_at

        def ready() -> bool:
            return any(mm[slot_at[rank]] == seq for rank in pending)

        def block(seconds: float) -> bool:
            fired = self._ready_sentinels(sentinels, seconds, wake=True)
            ended.extend(fired)
            return bool(fired)

        _sleep_until(ready, mm, self.geometry.line(0), block, deadline)

    def _ready_sentinels(
        self, sentinels: Sequence[int], seconds: float, *, wake: bool = False
    ) -> list[int]:
        """The sentinels that are ready within ``seconds`` (or, with ``wake``, at the first
        wake-up); one poll object, kept while the sentinels stay the same."""
        fds = (*sentinels, self._wake_r) if wake else tuple(sentinels)
        if self._poller is None or self._poller[0] != fds:
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            self._poller = (fds, poller)
        events = self._poller[1].poll(seconds * 1000)
        if wake:
            _drain(self._wake_r)
        return [fd for fd, _ in events if fd != self._wake_r]

    def close(self) -> None:
        """Unmap and close every descriptor; the memory is freed when the workers are gone."""
        if self._closed:
            return
        self._closed = True
        self._poller = None
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
        self._taken = 0  # messages taken so far
        self._last_size = 0  # of the last reply sent

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {"_mm": None, "_poller": None}

    def _map(self) -> mmap.mmap:
        if self._mm is None:
            g = Geometry(*self.geometry_args)
            self._mm = mmap.mmap(self.memory.fd, g.size)
            os.close(self.memory.fd)  # the mapping keeps the memory
            self._chunk_at, self._chunks, self._slot_bytes = g.chunk_at, g.chunks, g.slot_bytes
            self._line = g.line(1 + self.rank)
            self._slot = g.slot_at[self.rank]
            self._poller = select.poll()
            self._poller.register(self.wake_r.fd, select.POLLIN)
            self._spinner = Spinner(self.spin)
        return self._mm

    def recv_bytes(self) -> bytes:
        """The next message (blocking). EOFError when the pipe it had to come through ended."""
        mm = self._mm or self._map()
        n = self._taken + 1
        seq, at = n & 0xFF, self._chunk_at[n % self._chunks]
        if mm[at] != seq:
            self._wait(at, seq)
        if not _TOTAL_STORE_ORDER:
            _fence()
        (length,) = _LEN.unpack_from(mm, at + LENGTH_AT)
        data = None if length == OVERFLOW else mm[at + LINE : at + LINE + length]
        mm[self._line + 1] = seq  # consumed: the writer may reuse the chunk
        self._taken = n
        if data is None:
            assert self.conn is not None
            data = self.conn.recv_bytes()  # EOFError / OSError when the parent is gone
        return data

    def _wait(self, at: int, seq: int) -> None:
        mm = self._mm
        assert mm is not None
        if self._last_size <= SPIN_MAX_BYTES and self._spinner.poll(mm, (at,), seq, None):
            return
        poller = self._poller

        def block(seconds: float) -> bool:
            poller.poll(seconds * 1000)
            _drain(self.wake_r.fd)
            return False

        _sleep_until(lambda: mm[at] == seq, mm, self._line, block, None)

    def send_bytes(self, data: Buffer) -> None:
        """Answer the last message taken (the parent reads each answer before it sends again,
        so the slot is free)."""
        mm = self._mm or self._map()
        at, size = self._slot, len(data)
        big = size > self._slot_bytes
        self._last_size = size
        _LEN.pack_into(mm, at + LENGTH_AT, OVERFLOW if big else size)
        if not big:
            mm[at + LINE : at + LINE + size] = data
        if not _TOTAL_STORE_ORDER:
            _fence()
        mm[at] = self._taken & 0xFF
        with _fence_lock:  # a full fence (see _fence)
            pass
        if mm[0]:  # the parent's sleeping byte
            _wake(self.parent_wake_w.fd)
        if big:
            assert self.conn is not None
            self.conn.send_bytes(data)
