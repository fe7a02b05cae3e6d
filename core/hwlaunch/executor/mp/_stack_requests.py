"""The parent's side of the workers' stack threads (``hwlaunch.executor._stacks``).

Each worker has a pipe of its own to its stack thread, apart from the call channel, so a
request is answered while the worker's main thread is busy or stuck in a call.
"""

from __future__ import annotations

import itertools
import pickle
import time
from multiprocessing import connection
from multiprocessing.connection import Connection

__all__ = ["request_stacks"]

_request_ids = itertools.count(1)


def request_stacks(
    conns: dict[int, Connection], pids: list[int | None], timeout: float
) -> dict[int, str]:
    """``{rank: stacks}`` from each rank's stack pipe within ``timeout`` seconds; a rank that
    does not answer in time (or whose pipe is gone) gets a line saying so. Call under the
    group's ``stack_lock``: a reply to an earlier request that timed out is skipped by its id."""
    rid = next(_request_ids)
    found: dict[int, str] = {}
    waiting: dict[Connection, int] = {}
    for rank, conn in conns.items():
        try:
            conn.send_bytes(pickle.dumps(rid))
            waiting[conn] = rank
        except OSError:
            found[rank] = f"pid {pids[rank]}: no stack (the worker has ended)"
    deadline = time.monotonic() + timeout
    while waiting and (remaining := deadline - time.monotonic()) > 0:
        for ready in connection.wait(list(waiting), remaining):
            assert isinstance(ready, Connection)
            rank = waiting[ready]
            try:
                got, text = pickle.loads(ready.recv_bytes())
            except (EOFError, OSError):
                got, text = rid, f"pid {pids[rank]}: no stack (the worker has ended)"
            if got == rid:  # else a late answer to an earlier request
                found[rank] = text
                del waiting[ready]
    for rank in waiting.values():
        found[rank] = f"pid {pids[rank]}: no stack within {timeout:g}s"
    return dict(sorted(found.items()))
