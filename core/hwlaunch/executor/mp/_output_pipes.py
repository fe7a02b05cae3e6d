"""The mp executor's side of worker output: a pipe per rank and stream, read by one thread.

Each worker's file descriptors 1 and 2 become the write ends of its two pipes
(``hwlaunch.executor._capture``), so that everything written there arrives here: Python's
prints, C code's writes, and child processes that inherit them. The write ends travel as
``Connection`` objects, which every start method knows how to hand to a child (fork inherits
them; spawn and the fork server receive duplicates). One thread per group blocks in a selector
over the read ends and forwards each chunk the moment it arrives, so a ``print(...,
flush=True)`` is on the console a few microseconds later; no polling.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import select
import selectors
import socket
import termios
import threading
from multiprocessing.connection import Connection

from hwlaunch.executor._output import RankStream, WorkerOutput
from hwlaunch.plan import Plan

__all__ = ["OutputPipes"]

CHUNK = 64 * 1024  # bytes read at once: a full pipe buffer
DRAIN_WAIT = 2.0  # seconds to wait for EOF after the workers ended (a descendant may hold a pipe)
SYNC_WAIT = 1.0  # seconds an RPC's return waits at most for the output written before it


class OutputPipes:
    """Every rank's stdout and stderr pipes of one group, and the thread that reads them."""

    def __init__(self, plan: Plan) -> None:
        self.output = WorkerOutput(plan)
        self._node = socket.gethostname()
        self._selector = selectors.DefaultSelector()
        self._read_fds: dict[int, tuple[int, int]] = {}  # rank -> read ends, until registered
        self._parent_only: list[int] = []  # every read end, for forked children to close
        self._write_ends: dict[int, tuple[Connection, Connection]] = {}
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        # sync(): bytes the thread has read and has forwarded, per descriptor, and a poll of the
        # open ones; changed under _progress, so no descriptor is closed while sync() polls it
        # under it. A plain Lock, so that sync()'s first look can see whether the thread holds it.
        self._progress_lock = threading.Lock()
        self._progress = threading.Condition(self._progress_lock)
        self._read: dict[int, int] = {}
        self._forwarded: dict[int, int] = {}
        self._in_flight = 0  # bytes read and not yet forwarded
        self._pending = select.poll()

    def open(self, rank: int) -> tuple[Connection, Connection]:
        """New pipes for ``rank``: the write ends, for the child's fds 1 and 2."""
        ends = []
        reads = []
        for _ in range(2):
            read_fd, write_fd = os.pipe()
            reads.append(read_fd)
            self._parent_only.append(read_fd)
            ends.append(Connection(write_fd, readable=False))
        self._read_fds[rank] = (reads[0], reads[1])
        self._write_ends[rank] = (ends[0], ends[1])
        return ends[0], ends[1]

    def parent_fds(self) -> tuple[int, ...]:
        """Descriptors only this process may hold: a forked child closes them."""
        return (*self._parent_only, self._wake_r, self._wake_w)

    def started(self, rank: int, pid: int | None) -> None:
        """The rank's child holds its write ends now: close ours (so that its exit is EOF
        here) and register the read ends under its prefix."""
        for end in self._write_ends.pop(rank, ()):
            end.close()
        streams = self.output.add_rank(rank, rank, pid, self._node)
        for fd, stream in zip(self._read_fds.pop(rank), streams, strict=True):
            self._selector.register(fd, selectors.EVENT_READ, stream)
            self._read[fd] = self._forwarded[fd] = 0
            self._pending.register(fd, select.POLLIN)

    def start(self) -> None:
        """Begin forwarding (after every child started: a fork must not see this thread)."""
        thread = threading.Thread(target=self._run, name="hwlaunch-output", daemon=True)
        thread.start()  # "can't start new thread" leaves none to join
        self._thread = thread

    def _run(self) -> None:
        selector = self._selector
        while len(selector.get_map()) > 1:  # the wake pipe, and a rank's stream still open
            for key, _ in selector.select():
                stream: RankStream | None = key.data
                if stream is None:
                    return  # close() gave up waiting for EOF
                with self._progress:
                    try:
                        data = os.read(key.fd, CHUNK)
                    except OSError:
                        data = b""
                    self._read[key.fd] += len(data)
                    self._in_flight += len(data)
                if data:
                    stream.feed(data)
                    with self._progress:
                        self._forwarded[key.fd] += len(data)
                        self._in_flight -= len(data)
                        self._progress.notify_all()
                else:
                    with self._progress:
                        selector.unregister(key.fd)
                        self._pending.unregister(key.fd)
                        del self._read[key.fd], self._forwarded[key.fd]
                        os.close(key.fd)
                        self._progress.notify_all()
                    stream.end()

    def sync(self, drained: bool = False, wait: float = SYNC_WAIT) -> None:
        """Return once what the workers had written by now is on the console: a call's
        output comes before what the caller prints after it. Costs one poll and no lock when
        the pipes are empty (the common case, once per RPC); no poll either when ``drained``:
        every worker found its pipes empty after its answer (the shm channel's report).

        The first look takes no lock: the thread reads a chunk and counts it in flight under
        the lock, so with the pipes empty at the poll, a free lock and nothing in flight after
        it, everything read was forwarded. A descriptor the thread closed meanwhile (or a new
        file under its number) only sends this to the careful path below, which polls again.
        Only the RPC thread calls this (one poll at a time, as ``select.poll`` requires)."""
        if self._thread is None:
            return
        if (
            (drained or not self._pending.poll(0))
            and not self._progress_lock.locked()
            and not self._in_flight
        ):
            return
        with self._progress:
            if self._thread is None or self._closed:
                return
            ready = self._pending.poll(0)
            if not ready and not self._in_flight:
                return
            targets = {fd: n for fd, n in self._read.items() if self._forwarded[fd] < n}
            for fd, _ in ready:
                waiting = array.array("i", [0])
                with contextlib.suppress(OSError):
                    fcntl.ioctl(fd, termios.FIONREAD, waiting)
                targets[fd] = self._read[fd] + waiting[0]
            if targets:
                self._progress.wait_for(
                    lambda: all(self._forwarded.get(fd, n) >= n for fd, n in targets.items()),
                    timeout=wait,
                )

    def close(self, wait: float = DRAIN_WAIT) -> None:
        """Forward what is left, up to EOF on every pipe (or ``wait`` seconds), then release
        everything. Idempotent; called once the workers have ended."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for ends in self._write_ends.values():  # children that never started
            for end in ends:
                end.close()
        for fd in (fd for pair in self._read_fds.values() for fd in pair):
            os.close(fd)
        if self._thread is not None:
            self._thread.join(wait)
            if self._thread.is_alive():
                os.write(self._wake_w, b"x")
                self._thread.join(wait)
        if self._thread is None or not self._thread.is_alive():
            for key in list(self._selector.get_map().values()):
                with contextlib.suppress(OSError):
                    os.close(key.fd)
            self._selector.close()
            os.close(self._wake_w)
        self.output.end()
