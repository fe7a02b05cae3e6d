"""A free TCP port, where a process group's ranks meet: asked by the driver (mp, uni) and by a
Ray actor on its own node alike, so it lives on neither side.
"""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host`` (for the process group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
