"""The driver's side of reading mp workers' stacks: py-spy from outside, the workers' own
stack threads (``hwlaunch.executor._stacks``) as the fallback, both at once, by one deadline.

Each worker has a pipe of its own to its stack thread, apart from the call channel, so a
request is answered while the worker's main thread is busy or stuck in a call, as long as
that thread lets the stack thread run (it does not hold the GIL, it is not stopped). py-spy
needs nothing of the worker (``hwlaunch.executor._outside_stacks``). A rank's stacks are
py-spy's where it read them, else the worker's own answer; the wait ends as soon as every rank
has one of them, and never after the deadline.
"""

from __future__ import annotations

import itertools
import pickle
import time
from multiprocessing import connection
from multiprocessing.connection import Connection

from hwlaunch.executor._outside_stacks import OutsideReads

__all__ = ["request_stacks"]

_request_ids = itertools.count(1)


class _OwnAnswers:
    """One request to the ranks' stack threads (``serve_stacks``) and their answers."""

    def __init__(self, conns: dict[int, Connection], pids: dict[int, int | None]) -> None:
        self.rid = next(_request_ids)
        self.pids = pids
        self.answers: dict[int, str] = {}
        self.waiting: dict[Connection, int] = {}
        for rank, conn in conns.items():
            try:
                conn.send_bytes(pickle.dumps(self.rid))
                self.waiting[conn] = rank
            except OSError:
                self.answers[rank] = self._ended(rank)

    def _ended(self, rank: int) -> str:
        return f"pid {self.pids[rank]}: no stack (the worker has ended)"

    def take(self, ready: Connection) -> None:
        rank = self.waiting[ready]
        try:
            got, text = pickle.loads(ready.recv_bytes())
        except (EOFError, OSError):
            got, text = self.rid, self._ended(rank)
        if got == self.rid:  # else a late answer to an earlier request
            self.answers[rank] = text
            del self.waiting[ready]


def request_stacks(
    conns: dict[int, Connection] | None, pids: dict[int, int | None], timeout: float
) -> dict[int, str]:
    """``{rank: stacks}`` of the ranks of ``pids`` within ``timeout`` seconds; a rank with no
    stack by then gets a line saying why. ``conns``: each rank's stack pipe (None: py-spy
    alone, while another request holds the pipes). Call with the pipes under the group's
    ``stack_lock``: a reply to an earlier request that timed out is skipped by its id."""
    deadline = time.monotonic() + timeout
    outside = OutsideReads(pids)
    own = _OwnAnswers(conns or {}, pids)
    while _unsettled(pids, outside, own):
        remaining = max(0.0, deadline - time.monotonic())
        ready = connection.wait([*own.waiting, *outside.waitables()], remaining)
        for pipe in ready:
            if isinstance(pipe, Connection):
                own.take(pipe)
            else:
                outside.take(pipe)
        if not ready and remaining == 0.0:
            break  # the deadline, and nothing more that is ready at it
    outside.close(timeout)
    busy = conns is None
    return {rank: _stack_of(rank, outside, own, busy, timeout) for rank in sorted(pids)}


def _unsettled(pids: dict[int, int | None], outside: OutsideReads, own: _OwnAnswers) -> bool:
    """Whether a rank may still get a better stack: py-spy is still reading it, or py-spy gave
    none and its own answer may still come."""
    return any(
        rank not in outside.found
        and (rank not in outside.failed or (rank not in own.answers and own.waiting))
        for rank in pids
    )


def _stack_of(
    rank: int, outside: OutsideReads, own: _OwnAnswers, busy: bool, timeout: float
) -> str:
    if rank in outside.found:
        return outside.found[rank]
    if rank in own.answers:
        return own.answers[rank]
    why = outside.failed.get(rank, "py-spy did not read it")
    if busy:
        itself = "its stack thread was busy with another request"
    else:
        itself = "its stack thread did not answer: its main thread may hold the GIL"
    return f"pid {own.pids[rank]}: no stack within {timeout:g}s ({why}; {itself})"
