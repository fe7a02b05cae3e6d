"""Non-blocking calls on the mp executor: sent from the caller's thread, replies read by whoever
needs them first (``hwlaunch.executor._deferred``), with every promise of a Future kept.

Real worker processes on both channels; each test fails when the behaviour it names breaks:
a call not sent until asked for, a Future that only ``result()`` completes, a done callback
that deadlocks, a timeout on ``result`` that breaks the executor, a death or a shutdown that
leaves a Future pending for ever.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from concurrent.futures import Future, wait
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import pytest
from processes import alive, mp_launch, processes, wait_until

from hwlaunch import ExecutorClosedError, RpcTimeoutError, WorkerDiedError, WorkerError
from hwlaunch.executor._deferred import COLLECT_AFTER, DeferredCall
from hwlaunch.executor.base import TIMEOUT_BOUND

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("clean_env")]
CHANNELS = ["shm", "pipe"]


class Stamps:
    """Worker extension: when a call began on each rank, by the machine's monotonic clock."""

    rank: int

    def stamp(self, nap: float = 0.0) -> float:
        began = time.monotonic()
        time.sleep(nap)
        return began

    def echo(self, value: Any) -> Any:
        return value

    def fail(self) -> None:
        raise ValueError(f"rank {self.rank} fails on purpose")


def launch(channel: str, **options: Any) -> Any:
    return mp_launch(Stamps, start_method="fork", rpc_channel=channel, **options)


def threads_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


@pytest.mark.parametrize("channel", CHANNELS)
def test_sent_at_once_from_the_callers_thread(channel: str) -> None:
    """The workers start the call before anyone asks for its result, and no thread is made
    to send it (the queue's thread, hwlaunch-rpc, stays unstarted)."""
    with launch(channel) as executor:
        executor.collective_rpc("stamp")  # the workers are up and idle
        sent = time.monotonic()
        future = executor.collective_rpc("stamp", non_block=True)
        assert isinstance(future, DeferredCall)
        assert not threads_named("hwlaunch-rpc")
        time.sleep(0.5)
        asked = time.monotonic()
        began = future.result()
        assert all(sent <= b < asked - 0.3 for b in began), (sent, began, asked)


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_caller_that_only_waits_gets_the_reply(channel: str) -> None:
    """Nobody calls result(): the collector reads the reply, so wait() and done callbacks
    see the Future complete soon after the workers answered."""
    with launch(channel) as executor:
        future = executor.collective_rpc("stamp", (0.2,), non_block=True)
        called = threading.Event()
        future.add_done_callback(lambda _done: called.set())
        done, _ = wait([future], timeout=10)
        assert done == {future} and called.wait(10)
        assert len(future.result()) == 2


def test_a_done_callback_may_call_the_executor() -> None:
    """Done callbacks run once the RPC lock is released: one that makes a blocking call on
    the same executor neither deadlocks nor disturbs the order of calls."""
    with launch("shm") as executor:
        answers: Future[Any] = Future()
        future = executor.collective_rpc("stamp", (0.1,), non_block=True)
        future.add_done_callback(lambda _done: answers.set_result(executor.collective_rpc("stamp")))
        future.result()
        assert len(answers.result(10)) == 2


def test_result_with_a_timeout_leaves_the_executor_usable() -> None:
    with launch("shm") as executor:
        future = executor.collective_rpc("stamp", (1.0,), non_block=True)
        with pytest.raises(FutureTimeout):
            future.result(timeout=0.2)
        assert len(future.result(timeout=10)) == 2
        assert len(executor.collective_rpc("stamp")) == 2


def test_calls_keep_their_order_and_a_failure_stays_in_its_future() -> None:
    """A deferred call, then calls queued behind it, then a blocking one: each Future gets its
    own outcome, in the order the calls were made."""
    with launch("shm") as executor:
        first = executor.collective_rpc("stamp", (0.2,), non_block=True)
        failing = executor.collective_rpc("fail", non_block=True)  # queued: first is unread
        third = executor.collective_rpc("stamp", non_block=True)
        last = executor.collective_rpc("stamp")
        assert isinstance(failing.exception(10), WorkerError)
        assert max(first.result()) < min(third.result()) < min(last)


@pytest.mark.parametrize("channel", CHANNELS)
def test_a_death_during_a_deferred_call_is_its_futures_error(channel: str) -> None:
    with launch(channel) as executor:
        pids = executor.pids
        future = executor.collective_rpc("stamp", (30.0,), non_block=True)
        time.sleep(0.2)
        os.kill(pids[1], signal.SIGKILL)
        error = future.exception(timeout=10)
        assert isinstance(error, WorkerDiedError) and error.rank == 1
        with pytest.raises(WorkerDiedError):
            executor.collective_rpc("stamp")
    wait_until(lambda: not alive(processes(pids)), 10, "the workers to end")


def test_shutdown_ends_an_unread_call() -> None:
    """A call still running at shutdown: its Future gets the shutdown's error, nothing waits
    for ever, and no worker is left."""
    executor = launch("shm")
    pids = executor.pids
    future = executor.collective_rpc("stamp", (30.0,), non_block=True)
    time.sleep(0.1)
    started = time.monotonic()
    executor.shutdown()
    assert isinstance(future.exception(timeout=10), ExecutorClosedError)
    assert time.monotonic() - started < 10
    assert not alive(processes(pids))


def test_a_deferred_calls_timeout_counts_from_the_call() -> None:
    """The timeout runs from collective_rpc, not from result(): asked late, the call has
    already timed out."""
    executor = launch("shm")
    try:
        future = executor.collective_rpc("stamp", (30.0,), timeout=0.5, non_block=True)
        time.sleep(1.5 + COLLECT_AFTER)
        assert future.done()  # the collector met the timeout without being asked
        assert isinstance(future.exception(), RpcTimeoutError)
    finally:
        executor.shutdown()


@pytest.mark.parametrize("channel", CHANNELS)
def test_threads_mixing_every_kind_of_call_each_get_their_own_answers(channel: str) -> None:
    """Four threads, each making 100 calls of every kind on one executor (blocking,
    non-blocking read by result(), by a timeout, by wait(), by a done callback only): every
    call gets its own answer, in time, and none is lost or read twice."""
    with launch(channel) as executor:
        errors: list[BaseException] = []

        def one_thread(number: int) -> None:
            try:
                for index in range(100):
                    tag = number * 1000 + index
                    kind = index % 5
                    if kind == 0:
                        assert executor.collective_rpc("echo", (tag,)) == [tag, tag]
                        continue
                    future = executor.collective_rpc("echo", (tag,), non_block=True)
                    if kind == 1:
                        assert future.result() == [tag, tag]
                    elif kind == 2:
                        assert future.result(timeout=30) == [tag, tag]
                    elif kind == 3:
                        assert wait([future], timeout=30).done == {future}
                        assert future.result() == [tag, tag]
                    else:
                        seen: Future[Any] = Future()
                        future.add_done_callback(lambda done, seen=seen: seen.set_result(done))
                        assert seen.result(30).result() == [tag, tag]
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=one_thread, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not [t for t in threads if t.is_alive()], "a thread hung"
        assert errors == []


def holds_the_gil_in_c(worker: Any) -> None:
    """Rank 1 sleeps in libc through ctypes.PyDLL, which keeps the GIL for the whole call."""
    if worker.rank == 1:
        ctypes.PyDLL(None).sleep(60)


@pytest.mark.parametrize("reader", ["result", "wait"])
def test_the_timeout_bound_holds_for_a_deferred_call(reader: str) -> None:
    """RpcTimeoutError within TIMEOUT_BOUND of the timeout (2x here: shared CPUs), read by the
    caller's result() or, for a caller that only waits, by the collector; a rank that holds
    the GIL in C cannot answer anything, and no worker is left."""
    executor = launch("shm")
    pids = executor.pids
    try:
        began = time.monotonic()
        future = executor.collective_rpc(holds_the_gil_in_c, timeout=1.0, non_block=True)
        if reader == "result":
            with pytest.raises(RpcTimeoutError):
                future.result()
        else:
            assert wait([future], timeout=10).done == {future}
        past = time.monotonic() - began - 1.0
        assert isinstance(future.exception(), RpcTimeoutError)
        assert past < TIMEOUT_BOUND * 2, f"RpcTimeoutError {past:.2f}s after the timeout"
    finally:
        executor.shutdown()
    assert not alive(processes(pids))


def test_the_collector_ends_when_idle() -> None:
    with launch("shm") as executor:
        executor.collective_rpc("stamp", non_block=True).result()
        assert threads_named("hwlaunch-collect")
        wait_until(lambda: not threads_named("hwlaunch-collect"), 10, "the collector to end")
        assert len(executor.collective_rpc("stamp", non_block=True).result()) == 2
