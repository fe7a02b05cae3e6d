"""Length-prefixed frames over a pipe: how the acme-sub executor talks to its rank processes.

Pipes, not sockets: they are private to the two processes (no port, no authentication), and a
rank sees end-of-file on its stdin when the parent dies, so it never outlives it.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

HEADER = struct.Struct("!Q")


def write_frame(out: BinaryIO, payload: bytes) -> None:
    out.write(HEADER.pack(len(payload)) + payload)
    out.flush()


def read_frame(stream: BinaryIO) -> bytes:
    """The next frame; ``b""`` at end of file or for the empty frame that means "stop"."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return b""
    (size,) = HEADER.unpack(header)
    return stream.read(size) if size else b""
