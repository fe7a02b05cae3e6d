"""What the mp executor's requests look like on either channel: a fixed header, then the call.

The header is read with one ``struct`` call (no unpickling) and the call itself, pickled once
by the parent, is unpickled once by the worker, inside the code that turns its failures into the
caller's WorkerError.
"""

from __future__ import annotations

import struct

__all__ = ["CALL", "REQUEST", "SHUTDOWN", "parse_request", "request_head"]

REQUEST = struct.Struct("<cQq")  # kind, rpc id, the rank whose result travels back (-1: all)
CALL = b"c"
SHUTDOWN = b"s"


def request_head(kind: bytes, rpc_id: int, reply_rank: int | None) -> bytes:
    return REQUEST.pack(kind, rpc_id, -1 if reply_rank is None else reply_rank)


def parse_request(message: bytes) -> tuple[bytes, int, int | None, memoryview]:
    """``(kind, rpc_id, reply_rank, payload)``; the payload is a view, not a copy."""
    kind, rpc_id, reply_rank = REQUEST.unpack_from(message)
    return kind, rpc_id, None if reply_rank < 0 else reply_rank, memoryview(message)[REQUEST.size :]
