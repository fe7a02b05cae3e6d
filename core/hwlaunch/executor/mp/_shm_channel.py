"""A shared-memory broadcast channel: one writer (the parent), N readers (the workers).

Why: ``collective_rpc`` runs on every step of an engine. Through pipes, a request is written
once per worker and every message costs system calls on each side. Here the request is written
once into a ring that every worker reads, and each worker answers into a slot of its own; while
messages are frequent, both sides find them by polling memory, with no system call at all.

One anonymous memory file (``memfd``: nothing is named in ``/dev/shm``, so nothing is left
behind even when every process is SIGKILLed), R readers, C chunks; each part starts on a
64-byte line of its own (``Geometry`` does the arithmetic for both sides)::

    line(0)          | sleeping |                                          parent's line
    line(1+r)        | sleeping | consumed | drained | .. | held[0..C-1] |  reader r's line
    lend_at[r]       | lent[0] | lent[1] |                                  reader r's areas
    chunk_at[c]      | seq | .. | length : area << 48 : SPILLED |          chunk c's header
                     | small message (<= COPY_MAX_BYTES) | data ...     |   chunk_bytes
    slot_at[r]       | seq | .. | length : SECOND : SPILLED |             reader r's reply slot
                     | reply area 0 ...                                |   slot_bytes
    area_at[r][1]    | reply area 1 ...                                |   slot_bytes
    spill files      | a request larger than a chunk; per rank, a reply larger than a slot

Its flags (``n`` is the message number, counted from 1; a sequence byte is ``n & 0xFF``; no
flag is ever cleared to announce anything, so a message costs one store on each side):

=================  =============  ====================================================
flag (written by)  value          meaning
=================  =============  ====================================================
chunk ``seq``      ``n & 0xFF``   message ``n`` lies in chunk ``n % C``'s header, its
(parent)                          data in the area the length's top bits name; written
                                  after the data
slot ``seq``       ``n & 0xFF``   reader ``r``'s reply to message ``n`` lies in the
(reader r)                        area ``SECOND`` names (or its spill file:
                                  ``SPILLED``); written after the data
consumed           ``n & 0xFF``   reader ``r`` took message ``n``: the parent may reuse
(reader r)                        its chunk's header, data area and the spill file
drained            ``n & 0xFF``   reader ``r``'s output pipes were empty after it
(reader r)                        answered ``n`` (``n ^ 0x80``: not known, the parent
                                  looks itself; see *output*)
held[c]            1 / 0          the only reader lends chunk ``c``'s data to the call's
(reader 0)                        tensors: the parent writes no message there
lent[a]            1 / 0          the parent lends reader ``r``'s reply area ``a`` to a
(parent)                          result: the reader answers into the other one
sleeping           1 / 0          the party blocks on its wake pipe: whoever publishes
(its party)                       a flag it waits for writes that pipe
=================  =============  ====================================================

Where a message goes: into the data area of the first chunk that every reader is done with,
that no reader holds and that did not take the last large message; a small message beside its
header where that chunk is free; a message larger than a chunk (a reply larger than a slot)
into a spill file, grown to the largest message it carried and kept mapped, so a large payload
is copied once into shared memory, never through a pipe. A reader decodes a message where it
lies and marks it consumed with its answer.

*Alternate areas*: a large message goes into a free area other than the last large message's,
on both sides (requests into two chunks in turn, each reader's large replies into its two reply
areas in turn): a CPU that read a megabyte keeps it in its cache, and the other side writing
the same memory right after must take every line from it first (the figures:
docs/performance.md, "Alternate areas").

*Lent replies*: the parent decodes a reply in place, and the CPU tensors in it view the reply
area instead of a copy of it, where the reader's other area is free (a numpy array holds its
memory through a view of its own, which the parent cannot follow: it is copied). The area is
the caller's while anything views it: before each later request the parent looks at the
references to the views it gave out and clears ``lent`` once nothing but itself holds them. A
result the caller keeps merely makes that reader's later replies copies.

*Lent requests*: with one reader, a request's CPU tensors view the chunk they arrived in while
the worker uses them. After the call the reader looks at the references to the views it lent:
while something holds one, it sets ``held`` before it marks the message consumed, and clears it
before a later message once nothing does; messages then go to the other chunks, and to the
spill file once every chunk is held. With several readers a tensor one of them wrote in place
would change the others' arguments: they get copies.

*Output*: an RPC returns once what the workers wrote before their replies is on the console
(``OutputPipes.sync``). A worker that polls (a CPU of its own) looks at its own stdout and
stderr pipes right after it answered and stores ``drained`` when both were empty; the parent
skips its own look when every reader's ``drained`` is the last request's.

Waiting (``hwlaunch.executor.mp._shm_wait``): a party polls while the CPUs have room, then
blocks on a wake pipe. Writer and readers never wait forever on each other: the parent's waits
take a deadline and the worker processes' sentinels; a worker whose parent dies is ended by its
death pipe.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import mmap
import os
import platform
import select
import struct
import tempfile
import termios
import time
from collections.abc import Callable, Collection, Sequence
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from hwlaunch.channels import SHM_REPLY_BYTES
from hwlaunch.executor.mp._shm_wait import (
    EAGER_LOOKS,
    Spinner,
    drain,
    fence,
    sleep_until,
    wake,
    wake_pipe,
)
from hwlaunch.executor.transport._callables import SentCallables
from hwlaunch.executor.transport._loans import Loans
from hwlaunch.executor.transport._wire import Frame

__all__ = ["CHUNK_BYTES", "COPY_MAX_BYTES", "ChannelLost", "ShmChannel", "ShmEndpoint", "Spinner"]

T = TypeVar("T")
_now = time.monotonic
Buffer = bytes | bytearray | memoryview
Message = Buffer | Frame
Decode = Callable[[memoryview | bytes, "list[memoryview] | None"], T]

CHUNK_BYTES = 4 * 1024 * 1024
CHUNKS = 4
SLOT_BYTES = SHM_REPLY_BYTES
COPY_MAX_BYTES = (
    4096  # a reply up to this size is copied out at once; a larger one decoded in place
)

LINE = 64  # one cache line, so that parties polling different flags do not share one
_LEN = struct.Struct("<Q")
LENGTH_AT = 8  # in a chunk or slot header: the sequence byte at 0, the length here
CONSUMED, DRAINED = 1, 2  # in a reader's line, after its sleeping byte
HELD = 8  # in a reader's line, from here: one byte per chunk, set while the reader holds it
SPILLED = 1 << 63  # length flag: the message lies in the spill file, from its start
SECOND = 1 << 62  # reply length flag: the reply lies in the reader's second area
_FLAGS = SPILLED | SECOND
AREA_SHIFT = 48  # request length: from this bit, the chunk whose data area holds the message
_SIZE = (1 << AREA_SHIFT) - 1

# x86 keeps stores in order and loads in order: data written before a flag is seen before it.
_TOTAL_STORE_ORDER = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


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


def _size(message: Message) -> int:
    return message.size if isinstance(message, Frame) else len(message)


def _put(memory: Any, at: int, head: bytes, message: Message) -> None:
    """``head``, then the message, at ``memory[at:]``."""
    start = at + len(head)
    if head:
        memory[at:start] = head
    if isinstance(message, Frame):
        message.write_into(memory, start)
    else:
        memory[start : start + len(message)] = message


class Spill:
    """A memory file for messages larger than a chunk: grown (never shrunk) to the largest
    message, and kept mapped, so that its pages stay in place from one message to the next."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.mm: mmap.mmap | None = None

    def memory(self, size: int, *, grow: bool) -> mmap.mmap:
        """A mapping of at least ``size`` bytes; ``grow``: the writer's, which extends the
        file (by doubling, so that a growing payload is remapped a few times only)."""
        if self.mm is not None and len(self.mm) >= size:
            return self.mm
        length = os.fstat(self.fd).st_size
        if grow and length < size:
            length = max(size, 2 * length)
            length = (length + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
            os.ftruncate(self.fd, length)
        self.close_map()
        self.mm = mmap.mmap(self.fd, length)
        return self.mm

    def close_map(self) -> None:
        if self.mm is not None:
            with contextlib.suppress(BufferError):  # a view still out: the mapping goes with it
                self.mm.close()
            self.mm = None


class Geometry:
    """Where everything lives in the memory file; the same arithmetic on both sides."""

    def __init__(self, readers: int, chunk_bytes: int, chunks: int, slot_bytes: int) -> None:
        if not 1 <= chunks < 256:
            raise ValueError(f"chunks={chunks}: a ring has 1 to 255 chunks (sequence bytes)")
        self.readers = readers
        self.chunk_bytes = chunk_bytes
        self.chunks = chunks
        self.slot_bytes = slot_bytes
        # Requests are lent to the only reader (see *lent requests*), where its line has room
        # for a held byte per chunk.
        self.lends_requests = readers == 1 and HELD + chunks <= LINE
        chunk_stride = _round_up(LINE + chunk_bytes)
        slot_stride = _round_up(LINE + slot_bytes)
        lends = LINE * (1 + readers)
        ring = lends + LINE * readers
        slots = ring + chunks * chunk_stride
        seconds = slots + readers * slot_stride
        self.lend_at = [lends + LINE * rank for rank in range(readers)]
        self.chunk_at = [ring + index * chunk_stride for index in range(chunks)]
        self.slot_at = [slots + rank * slot_stride for rank in range(readers)]
        # where each reader's two reply areas start (the first right after its header line)
        self.area_at = [
            (at + LINE, seconds + rank * _round_up(slot_bytes))
            for rank, at in enumerate(self.slot_at)
        ]
        self.size = seconds + readers * _round_up(slot_bytes)

    @staticmethod
    def line(party: int) -> int:
        """Offset of a party's line: 0 is the parent, ``1 + rank`` a reader."""
        return LINE * party


def _round_up(n: int) -> int:
    return (n + LINE - 1) // LINE * LINE


_CLOSED_MAP = mmap.mmap(-1, 1)  # what a closed channel holds instead of a mapping still lent
_CLOSED_MAP.close()


# -- the parent's side -----------------------------------------------------------------------
class ShmChannel:
    """The writer: broadcasts requests, gathers replies. Used by one RPC thread at a time."""

    def __init__(
        self,
        readers: int,
        *,
        spin: float,
        eager_looks: int = EAGER_LOOKS,
        chunk_bytes: int = CHUNK_BYTES,
        chunks: int = CHUNKS,
        slot_bytes: int = SLOT_BYTES,
    ) -> None:
        self.geometry = g = Geometry(readers, chunk_bytes, chunks, slot_bytes)
        self.spin = spin
        self.eager_looks = eager_looks  # for the parent's and the readers' spinners
        self._spinner = Spinner(spin, eager_looks)
        self.conns: list[Connection] = []  # the ranks' pipes (kept for the executor's watch)
        self.callables = SentCallables()  # the callables every worker holds
        name = f"hwlaunch-{os.getpid()}-rpc"
        self._fd = _anonymous_file(g.size, name)
        self.mm = mmap.mmap(self._fd, g.size)
        self._spill = Spill(_anonymous_file(0, f"{name}-spill"))
        self._reply_spills = [Spill(_anonymous_file(0, f"{name}-spill")) for _ in range(readers)]
        self._wake_r, self._wake_w = wake_pipe()  # readers wake the parent
        self._reader_wakes = [wake_pipe() for _ in range(readers)]
        self._sleeping = [(g.line(1 + r), w) for r, (_, w) in enumerate(self._reader_wakes)]
        self._consumed = [g.line(1 + r) + CONSUMED for r in range(readers)]
        self._drained = [g.line(1 + r) + DRAINED for r in range(readers)]
        # Where the only reader's held bytes start (see *lent requests*), else 0: none.
        self._held_at = g.line(1) + HELD if g.lends_requests else 0
        self._sent = 0  # messages sent so far; the last one's sequence byte is its low byte
        self._last_in = [0] * chunks  # per chunk: the last message written into its data area
        self._last_area = -1  # the chunk that took the last message not beside its header
        self._poller: tuple[tuple[int, ...], Any] | None = None
        self._lent = Loans()  # the reply areas lent to results, by their lend bytes
        self._closed = False

    def endpoint(self, rank: int, conn: Connection | None = None) -> ShmEndpoint:
        """What worker ``rank`` needs (picklable); ``conn`` is its end of the rank's pipe."""
        g = self.geometry
        return ShmEndpoint(
            rank,
            (SharedFd(self._fd), SharedFd(self._spill.fd), SharedFd(self._reply_spills[rank].fd)),
            (g.readers, g.chunk_bytes, g.chunks, g.slot_bytes),
            SharedFd(self._reader_wakes[rank][0]),
            SharedFd(self._wake_w),
            self.spin,
            self.eager_looks,
        )

    def child_fds(self, rank: int) -> tuple[int, ...]:
        """Descriptors a forked worker ``rank`` inherits but must not keep."""
        others = [r for i, (r, _) in enumerate(self._reader_wakes) if i != rank]
        spills = [s.fd for i, s in enumerate(self._reply_spills) if i != rank]
        return (self._wake_r, *others, *(w for _, w in self._reader_wakes), *spills)

    # writing
    def send(
        self,
        data: Message,
        alive: Callable[[], None],
        deadline: float | None,
        head: bytes = b"",
    ) -> None:
        """Write one message, ``head + data``, for every reader; ``alive()`` raises when a
        reader is gone. A message larger than a chunk, or one whose chunk a reader holds (see
        *lent requests*), goes into the spill file."""
        g, mm = self.geometry, self.mm
        if self._lent:  # before the request: the readers look at the areas after it
            self._lent.take_back(mm)
        n = self._sent + 1
        self._wait_free(n, alive, deadline)
        index = n % g.chunks
        at = g.chunk_at[index]
        size = len(head) + _size(data)
        held = self._held_at
        if held and not _TOTAL_STORE_ORDER:
            fence()  # a held byte is read after the consumed byte stored after it
        if size > g.chunk_bytes:
            area = -1
        elif (  # a small message: beside its header, where nothing else is left to read
            size <= COPY_MAX_BYTES
            and self._last_in[index] <= n - g.chunks
            and not (held and mm[held + index])
        ):
            area = index
        else:
            area = self._free_area(n)
            if area >= 0:
                self._last_area = area
        if area >= 0:
            _put(mm, g.chunk_at[area] + LINE, head, data)
            _LEN.pack_into(mm, at + LENGTH_AT, size | area << AREA_SHIFT)
            self._last_in[area] = n
        else:
            self._wait_taken(n - 1, alive, deadline)  # nobody still reads the spill file
            _put(self._spill.memory(size, grow=True), 0, head, data)
            _LEN.pack_into(mm, at + LENGTH_AT, size | SPILLED)
        if not _TOTAL_STORE_ORDER:
            fence()  # the message is in memory before its sequence byte says so
        mm[at] = n & 0xFF
        self._sent = n
        fence()
        for line, wake_w in self._sleeping:
            if mm[line]:
                wake(wake_w)

    def _free_area(self, n: int) -> int:
        """The chunk whose data area takes message ``n``: the first one that every reader is
        done with (it took the last message written there), that no reader holds (see *lent
        requests*) and that did not take the last large message, else that one; -1 where
        there is none (the spill file). Calls one after another so alternate between two
        chunks rather than going round the ring (see *alternate areas*)."""
        mm, held, consumed = self.mm, self._held_at, self._consumed
        oldest = n - self.geometry.chunks  # every reader took this one (_wait_free)
        last_area, fallback = self._last_area, -1
        for area, last in enumerate(self._last_in):
            if last > oldest:
                for at in consumed:  # a reader is at most a ring behind: the distance tells
                    if (mm[at] - last) & 0xFF >= 128:
                        break
                else:
                    last = 0
                if last:
                    continue
            if not (held and mm[held + area]):
                if area != last_area:
                    return area
                fallback = area
        return fallback

    def _wait_free(self, n: int, alive: Callable[[], None], deadline: float | None) -> None:
        """Return once every reader took the message before ``n`` in its chunk."""
        mm, chunks = self.mm, self.geometry.chunks
        for at in self._consumed:  # the usual case, looked at without a helper
            if (n - mm[at]) & 0xFF > chunks:
                self._wait(lambda at: (n - mm[at]) & 0xFF > chunks, alive, deadline)
                return

    def _wait_taken(self, n: int, alive: Callable[[], None], deadline: float | None) -> None:
        """Return once every reader took message ``n`` (and so every one before it)."""
        self._wait(lambda at: self.mm[at] != n & 0xFF, alive, deadline)

    def _wait(
        self, behind: Callable[[int], bool], alive: Callable[[], None], deadline: float | None
    ) -> None:
        step = 0.0001
        while any(behind(at) for at in self._consumed):
            alive()
            if deadline is not None and _now() >= deadline:
                raise TimeoutError("a reader did not take an earlier message in time")
            time.sleep(step)
            step = min(step * 2, 0.01)

    def output_drained(self) -> bool:
        """Whether every reader found its output pipes empty after answering the last
        request (see *output*): then nothing it wrote before its answer is still in them."""
        mm, seq = self.mm, self._sent & 0xFF
        for at in self._drained:  # noqa: SIM110 (a loop: no generator on every call)
            if mm[at] != seq:
                return False
        return True

    # reading replies
    def receive(
        self,
        pending: Collection[int],
        deadline: float | None,
        sentinels: Sequence[int],
        decode: Decode[T],
    ) -> tuple[list[tuple[int, T]], list[int]]:
        """Replies ``(rank, decode(view))`` to the last message that have arrived from
        ``pending`` ranks, and the ``sentinels`` that became ready; both empty when ``deadline``
        (``time.monotonic()``; None: none) passed first.

        Polls while the CPUs have room until every pending rank answered, then blocks on the
        wake pipe and the sentinels until one more does. ``decode(view, lent)`` must not
        raise; the view it gets (bytes for a small reply) is valid only during the call,
        unless ``lent`` is a list: then it may lend the view's memory to what it returns (see
        *lent replies*), and puts every view it gave out into ``lent``.
        """
        mm, slot_at, seq = self.mm, self.geometry.slot_at, self._sent & 0xFF
        ended: list[int] = []
        for rank in pending:
            if mm[slot_at[rank]] != seq:
                self._await(pending, seq, deadline, sentinels, ended)
                break
        replies = []
        if not _TOTAL_STORE_ORDER:
            fence()  # nothing of a reply is read before its sequence byte
        for rank in pending:
            at = slot_at[rank]
            if mm[at] == seq:
                replies.append((rank, self._decode(rank, at, decode)))
        if not replies and not ended and deadline is not None:
            ended += self._ready_sentinels(sentinels, 0)
        return replies, ended

    def _decode(self, rank: int, at: int, decode: Decode[T]) -> T:
        (length,) = _LEN.unpack_from(self.mm, at + LENGTH_AT)
        area = 1 if length & SECOND else 0
        size = length & ~_FLAGS
        lent: list[memoryview] | None = None
        if length & SPILLED:
            memory, start = self._reply_spills[rank].memory(size, grow=False), 0
        else:
            memory, start = self.mm, self.geometry.area_at[rank][area]
            if size <= COPY_MAX_BYTES:  # one small allocation is cheaper than two views
                return decode(memory[start : start + size], None)
            lend_at = self.geometry.lend_at[rank]
            if lend_at + 1 - area not in self._lent:  # the reader always keeps one free area
                lent = []
        with memoryview(memory) as whole, whole[start : start + size] as view:
            value = decode(view, lent)
        if lent:
            self._lent.settle(self.mm, lend_at + area, lent)
        return value

    def _await(
        self,
        pending: Collection[int],
        seq: int,
        deadline: float | None,
        sentinels: Sequence[int],
        ended: list[int],
    ) -> None:
        """Poll, then block, until a pending rank answers, a sentinel fires or ``deadline``."""
        mm, slot_at = self.mm, self.geometry.slot_at
        flags = [slot_at[rank] for rank in pending]
        if self._spinner.poll(mm, flags, seq, deadline):
            return
        if any(mm[slot_at[rank]] == seq for rank in pending):
            return

        def ready() -> bool:
            return any(mm[slot_at[rank]] == seq for rank in pending)

        def block(seconds: float) -> bool:
            fired = self._ready_sentinels(sentinels, seconds, wake=True)
            ended.extend(fired)
            return bool(fired)

        sleep_until(ready, mm, self.geometry.line(0), block, deadline)

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
            drain(self._wake_r)
        return [fd for fd, _ in events if fd != self._wake_r]

    def close(self) -> None:
        """Unmap and close every descriptor; the memory is freed when the workers are gone
        (and a lent area's when the last result that views it is)."""
        if self._closed:
            return
        self._closed = True
        self._poller = None
        self._lent.forget()
        try:
            self.mm.close()
        except BufferError:  # a lent result still views it: unmapped when the last one goes
            self.mm = _CLOSED_MAP
        spills = [self._spill, *self._reply_spills]
        for spill in spills:
            spill.close_map()
        fds = [self._fd, self._wake_r, self._wake_w, *sum(self._reader_wakes, ())]
        for fd in fds + [spill.fd for spill in spills]:
            with contextlib.suppress(OSError):
                os.close(fd)


# -- a worker's side -------------------------------------------------------------------------
class ShmEndpoint:
    """A reader: takes each broadcast message in turn and answers into its own slot.

    ``recv()`` gives a message where it lies (a memoryview; a small one as bytes), ``send()``
    writes a reply; the pipe channel's endpoint offers the same, so the worker's loop is the
    same for both.
    ``recv_bytes``/``send_bytes`` move whole byte strings, as a pipe's ends do.
    """

    def __init__(
        self,
        rank: int,
        memory: tuple[SharedFd, SharedFd, SharedFd],
        geometry: tuple[int, int, int, int],
        wake_r: SharedFd,
        parent_wake_w: SharedFd,
        spin: float,
        eager_looks: int = EAGER_LOOKS,
    ) -> None:
        self.rank = rank
        self.memory = memory  # the ring, the request spill file, this rank's reply spill file
        self.geometry_args = geometry
        self.wake_r = wake_r
        self.parent_wake_w = parent_wake_w
        self.spin = spin
        self.eager_looks = eager_looks
        self._mm: mmap.mmap | None = None
        self._poller: Any = None
        self._taken = 0  # messages taken so far
        self._watched: tuple[int, ...] = ()  # private duplicates of the output pipes' ends
        self._unread = array.array("i", [0])
        # The views of the ring that decoding the last message may lend (see *lent requests*):
        # a list while that message lies in a chunk this reader may hold, else None.
        self.lending: list[memoryview] | None = None
        self._lending_at = 0  # the held byte of the chunk the lent views are in
        self._held = Loans()  # the chunks still lent to arguments, by their held bytes
        self._last_area = 1  # the reply area of the last large reply (the first one's: 0)

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {"_mm": None, "_poller": None, "_watched": ()}

    def watch_output(self, fds: tuple[int, ...]) -> None:
        """Report after each answer whether the pipes behind ``fds`` (this worker's stdout
        and stderr, which the parent reads) were empty (see *output*); only where this
        worker polls, since the look costs a system call per pipe. Duplicates are kept, so
        that the pipes are looked at even after the program points ``fds`` elsewhere."""
        if self.spin > 0 and not self._watched:
            self._watched = tuple(os.dup(fd) for fd in fds)

    def _map(self) -> mmap.mmap:
        if self._mm is None:
            g = Geometry(*self.geometry_args)
            ring, spill, reply_spill = self.memory
            self._mm = mmap.mmap(ring.fd, g.size)
            os.close(ring.fd)  # the mapping keeps the memory
            self._spill, self._reply_spill = Spill(spill.fd), Spill(reply_spill.fd)
            self._chunk_at, self._chunks, self._slot_bytes = g.chunk_at, g.chunks, g.slot_bytes
            self._small = min(COPY_MAX_BYTES, g.slot_bytes)  # a reply that needs no choice
            self._lends = g.lends_requests
            self._line = g.line(1 + self.rank)
            self._slot = g.slot_at[self.rank]
            self._lend_at = g.lend_at[self.rank]
            self._areas = g.area_at[self.rank]
            self._poller = select.poll()
            self._poller.register(self.wake_r.fd, select.POLLIN)
            self._spinner = Spinner(self.spin, self.eager_looks)
        return self._mm

    def recv(self) -> memoryview | bytes:
        """The next message (blocking): a view until released, or a small one's copy;
        answering it (``send``) lets the writer reuse its memory. Where the message lies in a
        chunk this reader may hold, :attr:`lending` is a list for the views that decoding it
        lends (``hwlaunch.executor.transport._wire.decode``), settled by ``send``."""
        mm = self._mm or self._map()
        if self._held:
            self._held.take_back(mm)
        n = self._taken + 1
        index = n % self._chunks
        seq, at = n & 0xFF, self._chunk_at[index]
        if mm[at] != seq:
            self._wait(at, seq)
        if not _TOTAL_STORE_ORDER:
            fence()
        (length,) = _LEN.unpack_from(mm, at + LENGTH_AT)
        self._taken = n
        if length & SPILLED:
            length &= ~SPILLED
            memory, start = self._spill.memory(length, grow=False), 0
        else:
            area = length >> AREA_SHIFT
            length &= _SIZE
            start = self._chunk_at[area] + LINE
            if length <= COPY_MAX_BYTES:  # the usual small call: one allocation, no views
                return mm[start : start + length]
            memory = mm
            if self._lends:
                self.lending, self._lending_at = [], self._line + HELD + area
        with memoryview(memory) as whole:
            return whole[start : start + length]

    def recv_bytes(self) -> bytes:
        message = self.recv()
        if isinstance(message, bytes):
            data = message
        else:
            with message:
                data = bytes(message)
        self._mark_taken()
        return data

    def _mark_taken(self) -> None:
        """The writer may reuse the last message's chunk (and the spill file)."""
        assert self._mm is not None
        if self.lending is not None:
            self._settle(self._mm)
        self._mm[self._line + CONSUMED] = self._taken & 0xFF

    def _settle(self, mm: mmap.mmap) -> None:
        """Hold the last message's chunk while anything references a view lent from it."""
        views, self.lending = self.lending, None
        if views is not None:
            self._held.settle(mm, self._lending_at, views)

    def _wait(self, at: int, seq: int) -> None:
        mm = self._mm
        assert mm is not None
        if self._spinner.poll(mm, (at,), seq, None):
            return
        poller = self._poller

        def block(seconds: float) -> bool:
            poller.poll(seconds * 1000)
            drain(self.wake_r.fd)
            return False

        sleep_until(lambda: mm[at] == seq, mm, self._line, block, None)

    def send(self, data: Message) -> None:
        """Answer the last message taken, once its views are released (the parent reads each
        answer before it sends again, so the slot and the reply spill file are free). The
        message counts as taken from here (the parent sees that before the answer), and its
        chunk as held if a view lent from it is still referenced (the caller drops its own
        references to the call's arguments and result first)."""
        mm = self._mm or self._map()
        seq = self._taken & 0xFF
        line, at = self._line, self._slot
        # The first area, unless the parent lent it (it never holds both: see lent replies).
        second = mm[self._lend_at]
        if type(data) is bytes and (length := len(data)) <= self._small:  # the usual reply
            start = self._areas[second]
            mm[start : start + length] = data
            where = SECOND if second else 0  # the length's flags: which area, or spilled
        elif (length := _size(data)) <= self._slot_bytes:
            if length > COPY_MAX_BYTES:  # the other area than the last large reply's
                second = self._last_area ^ 1  # (see *alternate areas*)
                if mm[self._lend_at + second]:
                    second ^= 1
                self._last_area = second
            _put(mm, self._areas[second], b"", data)
            where = SECOND if second else 0
        else:
            _put(self._reply_spill.memory(length, grow=True), 0, b"", data)
            where = SPILLED
        if self.lending is not None:  # the reply is written: a lent view it held is not
            if isinstance(data, Frame):  # referenced from it any more
                data.drop()
            self._settle(mm)  # (held before the writer can see the message taken)
            if not _TOTAL_STORE_ORDER:
                fence()
        _LEN.pack_into(mm, at + LENGTH_AT, length | where)
        mm[line + CONSUMED] = seq
        mm[line + DRAINED] = seq ^ 0x80  # stale until the look after this answer
        if not _TOTAL_STORE_ORDER:
            fence()
        mm[at] = seq
        fence()
        if mm[0]:  # the parent's sleeping byte
            wake(self.parent_wake_w.fd)
        if self._watched:
            self._report_drained(mm, line + DRAINED, seq)

    def _report_drained(self, mm: mmap.mmap, at: int, seq: int) -> None:
        unread = self._unread
        for fd in self._watched:
            try:
                fcntl.ioctl(fd, termios.FIONREAD, unread)
            except OSError:  # not a pipe after all: the parent looks itself
                return
            if unread[0]:
                return
        mm[at] = seq

    send_bytes = send
