"""What the mp executor's requests look like on either channel: a fixed header, then the call.

The header is read with one ``struct`` call (no unpickling): the kind, the call id, the rank
whose result travels back, and the callable's digest with its pickled form when the workers
do not hold it yet (a callable they hold travels as its digest alone: see
``hwlaunch.executor.transport._callables``). The header is padded to 64 bytes, so that the call
itself (``hwlaunch.executor.transport._wire``, decoded by the worker inside the code that turns its
failures into the caller's WorkerError) starts on a cache line.
"""

from __future__ import annotations

import struct

from hwlaunch.executor.transport._wire import align

__all__ = ["CALL", "NO_CALLABLE", "REQUEST", "SHUTDOWN", "parse_request", "request_head"]

# kind, rpc id, the rank whose result travels back (-1: all), callable digest, pickled length
REQUEST = struct.Struct("<cQq16sI")
_PADDED = struct.Struct(f"<cQq16sI{align(REQUEST.size) - REQUEST.size}x")  # one cache line
CALL = b"c"
SHUTDOWN = b"s"
NO_CALLABLE = bytes(16)  # the digest field of a call by method name (or an uncached callable)


def request_head(
    kind: bytes,
    rpc_id: int,
    reply_rank: int | None,
    digest: bytes = NO_CALLABLE,
    pickled: bytes = b"",
) -> bytes:
    """The header, with ``pickled`` (the callable, the first time) after it, padded."""
    rank = -1 if reply_rank is None else reply_rank
    if not pickled:  # the usual call: one struct call
        return _PADDED.pack(kind, rpc_id, rank, digest, 0)
    size = REQUEST.size + len(pickled)
    fixed = REQUEST.pack(kind, rpc_id, rank, digest, len(pickled))
    return b"".join((fixed, pickled, bytes(align(size) - size)))


Body = memoryview | bytes


def parse_request(message: Body) -> tuple[bytes, int, int | None, bytes, Body | None, Body]:
    """``(kind, rpc_id, reply_rank, digest, pickled, call)``; the last two are views of the
    message where it is a view (a large one), else copies (``pickled`` is None unless the
    callable travels whole)."""
    kind, rpc_id, reply_rank, digest, length = REQUEST.unpack_from(message)
    rank = None if reply_rank < 0 else reply_rank
    if not length:
        return kind, rpc_id, rank, digest, None, message[_PADDED.size :]
    start = REQUEST.size
    pickled = message[start : start + length]
    return kind, rpc_id, rank, digest, pickled, message[align(start + length) :]
