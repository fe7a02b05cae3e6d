"""The pipe RPC channel, the protocol both channels implement, and the choice between them.

Both channels offer the mp executor the same operations (:class:`Channel`: send one request to
every rank, receive the replies that have arrived, close), and their worker ends the same two
(``recv``, ``send``), so the executor's call logic and the worker's loop do not depend on which
one carries the bytes. Every wait takes one deadline, a ``time.monotonic()`` value (None: no
limit), turned into a relative timeout only at the system call that waits. The pipe channel writes the request into each rank's pipe; it is the
portable one, and the one to compare against. A frame (``hwlaunch.executor.transport._wire``) is
laid out once into one buffer for the pipes, which take whole messages.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from multiprocessing import connection
from multiprocessing.connection import Connection
from typing import Any, Protocol

from hwlaunch.channels import SPIN_WITH_FREE_CPUS
from hwlaunch.executor.mp._shm_channel import (
    COPY_MAX_BYTES,
    ChannelLost,
    Decode,
    Message,
    ShmChannel,
    ShmEndpoint,
    T,
)
from hwlaunch.executor.mp._shm_wait import EAGER_LOOKS
from hwlaunch.executor.transport._callables import SentCallables
from hwlaunch.executor.transport._wire import Frame
from hwlaunch.probes import usable_cpus


def _whole(head: bytes, data: Message) -> Any:
    if isinstance(data, Frame):
        out = data.to_bytes() if not head else bytearray(len(head) + data.size)
        if head:
            out[: len(head)] = head
            data.write_into(out, len(head))
        return out
    return head + data if head else data


class PipeChannel:
    """The parent's side: the request goes into each rank's pipe, replies come out of them."""

    def __init__(self) -> None:
        self.conns: list[Connection] = []
        self.callables = SentCallables()

    def endpoint(self, rank: int, conn: Connection) -> PipeEndpoint:
        return PipeEndpoint(conn)

    def child_fds(self, rank: int) -> tuple[int, ...]:
        return ()

    def send(
        self,
        data: Message,
        alive: Callable[[], None],
        deadline: float | None,
        head: bytes = b"",
    ) -> None:
        """Pipes take the whole message at once: nothing here waits for a reader."""
        message = _whole(head, data)
        for rank, conn in enumerate(self.conns):
            try:
                conn.send_bytes(message)
            except OSError:
                raise ChannelLost(rank) from None

    def receive(
        self,
        pending: Collection[int],
        deadline: float | None,
        sentinels: Sequence[int],
        decode: Decode[T],
    ) -> tuple[list[tuple[int, T]], list[int]]:
        by_conn = {id(self.conns[rank]): rank for rank in pending}
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        ready = connection.wait([self.conns[r] for r in pending] + list(sentinels), timeout)
        replies: list[tuple[int, T]] = []
        ended: list[int] = []
        for obj in ready:
            if isinstance(obj, int):
                ended.append(obj)
                continue
            rank = by_conn[id(obj)]
            try:
                data = self.conns[rank].recv_bytes()
            except (EOFError, OSError):
                raise ChannelLost(rank) from None
            replies.append((rank, decode(memoryview(data), None)))
        return replies, ended

    def output_drained(self) -> bool:
        """Never known here: the executor looks at the output pipes itself."""
        return False

    def close(self) -> None:
        """The pipes are the executor's; they are closed with its other descriptors."""


class PipeEndpoint:
    """A worker's end of the pipe channel, with the shared-memory endpoint's operations."""

    lending: list[memoryview] | None = None  # nothing is lent: a message is its own bytes

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def recv(self) -> memoryview | bytes:
        """The next message: a small one as it came, a larger one as a view of it (so that
        its parts are not copied again). EOFError when the parent is gone."""
        data = self.conn.recv_bytes()
        return data if len(data) <= COPY_MAX_BYTES else memoryview(data)

    def send(self, data: Message) -> None:
        self.conn.send_bytes(_whole(b"", data))

    def watch_output(self, fds: tuple[int, ...]) -> None:
        """Nothing to report on this channel (the parent always looks at the pipes)."""


Endpoint = PipeEndpoint | ShmEndpoint


class Channel(Protocol):
    """The parent's side of an RPC channel, as the mp executor drives it (shm or pipe).

    ``deadline`` is a ``time.monotonic()`` value, None for no limit: ``send`` raises
    TimeoutError when it passes before every reader made room (``ChannelLost`` when ``alive()``
    finds a reader gone), ``receive`` returns with nothing when it passes first.
    """

    conns: list[Connection]
    callables: SentCallables

    def endpoint(self, rank: int, conn: Connection) -> Endpoint: ...

    def child_fds(self, rank: int) -> tuple[int, ...]: ...

    def send(
        self, data: Message, alive: Callable[[], None], deadline: float | None, head: bytes = b""
    ) -> None: ...

    def receive(
        self,
        pending: Collection[int],
        deadline: float | None,
        sentinels: Sequence[int],
        decode: Decode[T],
    ) -> tuple[list[tuple[int, T]], list[int]]: ...

    def output_drained(self) -> bool: ...

    def close(self) -> None: ...


def open_channel(kind: str, world_size: int, spin: float | None) -> Channel:
    """``kind`` is ``shm`` or ``pipe`` (the plan's ``rpc_channel``); ``spin`` None: poll
    only where every worker has a CPU of its own (polling workers would otherwise take CPU from
    working ones). Looks before a waiting side's first yield only where the parent has one too
    (``EAGER_LOOKS``)."""
    if kind == "shm":
        cpus = usable_cpus()
        if spin is None:
            spin = SPIN_WITH_FREE_CPUS if cpus >= world_size else 0.0
        eager_looks = EAGER_LOOKS if cpus > world_size else 0
        return ShmChannel(world_size, spin=spin, eager_looks=eager_looks)
    if kind == "pipe":
        return PipeChannel()
    raise ValueError(f"unknown rpc_channel {kind!r} (allowed: shm, pipe)")
