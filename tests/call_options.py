"""What every executor must do with ``non_block`` and ``unique_reply_rank`` (uni, mp, ray)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest

from hwlaunch import WorkerError

# The threads of non-blocking calls: the queue's (executor._background), the reply collector's
# (executor._deferred). Both end on their own once idle.
CALL_THREADS = ("hwlaunch-rpc", "hwlaunch-collect")


class CallOptionsProbe:
    """Worker extension: named methods that record, per rank, which calls ran in which order."""

    rank: int
    log: list[str]

    def record(self, tag: str, nap: float = 0.0) -> list[str]:
        time.sleep(nap)
        if not hasattr(self, "log"):
            self.log = []
        self.log.append(tag)
        return [*self.log]

    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"rank {rank} fails on purpose")
        return self.rank


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        time.sleep(0.005)


def check_call_options(executor: Any) -> None:
    """The same expectations for every executor, on a fresh one with CallOptionsProbe mixed in."""
    n = executor.world_size
    first = executor.collective_rpc("record", ("a", 0.2), non_block=True)
    second = executor.collective_rpc("record", ("b",), non_block=True)
    assert isinstance(first, Future) and isinstance(second, Future)
    third = executor.collective_rpc("record", ("c",))  # waits for the calls made before it
    assert third == [["a", "b", "c"]] * n
    assert first.result(60) == [["a"]] * n and second.result(60) == [["a", "b"]] * n
    last = n - 1
    assert executor.collective_rpc("record", ("d",), unique_reply_rank=last) == ["a", "b", "c", "d"]
    assert executor.collective_rpc("record", ("e",)) == [["a", "b", "c", "d", "e"]] * n
    future = executor.collective_rpc(lambda w: w.rank, non_block=True, unique_reply_rank=last)
    assert future.result(60) == last
    with pytest.raises(WorkerError) as info:  # another rank's failure still raises
        executor.collective_rpc("fail_on", (0,), unique_reply_rank=last)
    assert info.value.rank == 0
    failed = executor.collective_rpc("fail_on", (last,), non_block=True)
    assert isinstance(failed.exception(60), WorkerError)
    for bad in (n, -1, True, "0"):
        with pytest.raises(ValueError, match=f"unique_reply_rank={bad!r}"):
            executor.collective_rpc("ping", unique_reply_rank=bad)
    wait_until(
        lambda: not [t for t in threading.enumerate() if t.name in CALL_THREADS],
        10,
        "the background call and reply collector threads to end when idle",
    )
