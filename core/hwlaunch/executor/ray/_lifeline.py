"""The driver's lifeline to its Ray actors: how an actor learns that the driver is gone.

Ray ends the actors of a driver that dies, at once and without their ``shutdown()``; so the
ray executor's actors and placement group are detached from the driver (``lifetime=
"detached"``), and each actor watches this lifeline instead: a TCP connection to a socket
the driver listens on, at the address its Ray node has. The driver never accepts them: the
kernel completes each connection into the listening socket's queue, and closes them all
when the driver's process ends, however it ends (SIGKILL included), on any node. An actor
that reads the end of its connection runs the driver-death path (``_actor``): its worker's
``shutdown()`` within the grace, then its process ends, and rank 0 removes the placement
group once every rank is done. A driver that ends the actors itself kills them, then
accepts the waiting connections and writes ``END`` on each, so that an actor its kill has not
reached yet leaves the ending to it.

A driver that started its own local Ray instance takes that instance with it: the raylet and
the GCS end a moment after the driver. Ray's own checks would end each actor at once then;
``actor_ray_config`` makes them wait out the grace, and ``watch_raylet`` begins the same
orderly end when the actor's raylet is gone (on a cluster too: a raylet that crashed).

Worker-side code (``watch``) beside the driver's (``Lifeline``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable

__all__ = ["END", "Lifeline", "actor_ray_config", "watch", "watch_raylet"]

END = b"E"  # the driver ends the actors itself
CONNECT_TIMEOUT = 10.0
RAYLET_POLL = 0.1  # seconds between an actor's checks that its raylet still runs
RAY_MARGIN = 30.0  # seconds Ray's own checks wait beyond the grace


def actor_ray_config(grace: float) -> dict[str, str]:
    """Ray's settings for an actor process: its own checks that end it at once when its
    raylet or the GCS is gone (so when a driver that started its local instance dies) wait
    for the grace and a margin, while ``watch_raylet`` begins the orderly end instead."""
    wait = grace + RAY_MARGIN
    return {
        "RAY_raylet_death_check_interval_milliseconds": str(int(wait * 1000)),
        "RAY_gcs_rpc_server_reconnect_timeout_s": str(int(max(60.0, wait))),
    }


class Lifeline:
    """The listening socket of one group of actors (a restart makes a new one)."""

    def __init__(self, host: str) -> None:
        self._listener = socket.create_server((host, 0), backlog=4096)
        self.address: tuple[str, int] = (host, self._listener.getsockname()[1])
        self._lock = threading.Lock()

    def release(self) -> None:
        """Tell every connected actor that the driver ends it; close the lifeline. Idempotent."""
        with self._lock:
            if self._listener.fileno() < 0:
                return
            self._listener.setblocking(False)
            with contextlib.suppress(OSError):
                while True:
                    conn, _ = self._listener.accept()
                    with conn, contextlib.suppress(OSError):
                        conn.setblocking(True)
                        conn.sendall(END)
            self._listener.close()

    def abandon(self) -> None:
        """Close the lifeline without a word: each actor ends itself as after the driver's
        death (for a driver that can no longer reach Ray to kill them). Idempotent."""
        with self._lock:
            self._listener.close()


def watch(address: tuple[str, int], on_driver_death: Callable[[], None]) -> None:
    """Connect to the driver's lifeline (raise OSError when it is not there: the driver is
    already gone) and call ``on_driver_death`` from a thread of its own when it ends without
    ``END``."""
    conn = socket.create_connection(address, timeout=CONNECT_TIMEOUT)
    conn.settimeout(None)

    def wait() -> None:
        told = b""
        with contextlib.suppress(OSError):
            told = conn.recv(1)
        conn.close()
        if told != END:
            on_driver_death()

    threading.Thread(target=wait, name="hwlaunch-lifeline", daemon=True).start()


def watch_raylet(on_raylet_death: Callable[[], None]) -> None:
    """Call ``on_raylet_death`` from a thread of its own once this actor's raylet, the
    process that started it, has ended (this process is then reparented)."""
    raylet = os.getppid()

    def poll() -> None:
        while os.getppid() == raylet:
            time.sleep(RAYLET_POLL)
        on_raylet_death()

    threading.Thread(target=poll, name="hwlaunch-raylet-watch", daemon=True).start()
