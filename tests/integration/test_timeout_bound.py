"""A collective_rpc timeout is a promise kept to the second: RpcTimeoutError comes within
``TIMEOUT_BOUND`` (0.5 s) of the timeout whatever state the silent rank is in, with its stack
read from outside its process; and no process is left: on a machine too busy to end the
workers within the bound, the error is not held back and their stop goes on, until they are
all gone (``shutdown()`` waits for it).

The silent rank holds the GIL in a C call (``ctypes.PyDLL``: a foreign call that keeps the
GIL, so neither its stack thread nor its signal handlers run), is stopped (SIGSTOP), or sleeps
in native code with the GIL released (its own stack thread can answer). The first two could not
answer a request for their stacks: py-spy reads them from outside. Without py-spy (not
installed), the rank's own answer stands in where it can give one, within the same bound.

The bound is checked against 2x its figure here, room for the CPUs this test shares with the
rest of the suite (``benchmarks/reliability.py`` measures it side by side: docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from processes import alive, processes, wait_until

import hwlaunch
from hwlaunch import RpcTimeoutError, Worker
from hwlaunch.executor import _outside_stacks
from hwlaunch.executor.base import TIMEOUT_BOUND

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("clean_env")]
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ALLOWANCE = 2.0  # times the bound: the CPUs are shared with the other tests
TIMEOUT = 1.0


def holds_the_gil_in_c(worker: Worker) -> None:
    """Rank 1 sleeps in libc through ctypes.PyDLL, which keeps the GIL for the whole call."""
    if worker.rank == 1:
        ctypes.PyDLL(None).sleep(60)
    time.sleep(60)


def stops_itself(worker: Worker) -> None:
    if worker.rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(60)


def sleeps_in_native_code(worker: Worker) -> None:
    if worker.rank == 1:
        time.sleep(60)


STATES: dict[str, tuple[Callable[[Worker], None], str]] = {
    "holds the GIL in C": (holds_the_gil_in_c, "holds_the_gil_in_c"),
    "stopped": (stops_itself, "stops_itself"),
    "sleeps in native code": (sleeps_in_native_code, "sleeps_in_native_code"),
}


def timed_out(
    method: str, fn: Callable[[Worker], None]
) -> tuple[float, RpcTimeoutError, list[int]]:
    """Seconds past the timeout when the error came, the error, and the workers left 10 s
    later (the stop that went on after the error, if it had to, has ended by then)."""
    executor = hwlaunch.launch(
        backend="cpu", world_size=2, start_method=method, init_distributed=False
    )
    workers = processes(executor.pids)
    try:
        executor.collective_rpc("ping")
        began = time.monotonic()
        with pytest.raises(RpcTimeoutError) as caught:
            executor.collective_rpc(fn, timeout=TIMEOUT)
        past = time.monotonic() - began - TIMEOUT
        with contextlib.suppress(AssertionError):
            wait_until(lambda: alive(workers) == [], 10, "the workers to end")
        left = alive(workers)
    finally:
        executor.shutdown()
        for proc in workers:
            if proc.is_running():
                proc.kill()
    return past, caught.value, left


@pytest.mark.parametrize("state", list(STATES))
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_timeout_error_within_the_bound_with_the_silent_ranks_stack(
    method: str, state: str
) -> None:
    fn, name = STATES[state]
    for _ in range(2):  # once more where py-spy was not given a CPU in time (a shared machine)
        past, error, left = timed_out(method, fn)
        if "py-spy did not read it within" not in error.stacks.get(1, ""):
            break
    assert past < TIMEOUT_BOUND * ALLOWANCE, f"RpcTimeoutError {past:.2f}s after the timeout"
    assert left == [], f"workers still running after the error: {left}"
    ranks = [1] if state == "sleeps in native code" else [0, 1]
    assert error.ranks == ranks
    stack = error.stacks[1]
    assert f"in {name}" in stack, stack
    if state != "sleeps in native code":
        assert "read by py-spy" in stack, stack
    if state == "holds the GIL in C":
        assert 'Thread "MainThread" (holds the GIL)' in stack
    if state == "stopped":
        assert "the process is stopped" in stack


@pytest.mark.parametrize("state", list(STATES))
def test_without_py_spy_the_bound_holds_and_the_rank_says_why(
    state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """py-spy not installed: ranks that can answer give their own stacks; those that cannot
    get a line saying why, and the error still comes within the bound."""
    monkeypatch.setattr(_outside_stacks, "pyspy_command", lambda: None)
    fn, name = STATES[state]
    past, error, left = timed_out("fork", fn)
    assert past < TIMEOUT_BOUND * ALLOWANCE, f"RpcTimeoutError {past:.2f}s after the timeout"
    assert left == []
    stack = error.stacks[1]
    if state == "sleeps in native code":
        assert f"in {name}" in stack and "read by py-spy" not in stack
    else:
        assert "no stack within 0.3s (py-spy is not installed;" in stack, stack
        assert "its stack thread did not answer" in stack


def test_idle_fork_workers_stack_starts_at_the_worker_not_the_drivers_launch(
    tmp_path: Path,
) -> None:
    """A forked worker's main thread began in the driver's own launch(); its stack shows the
    worker from its entry point and counts what led there, both from py-spy and from the
    worker's own answer."""
    with hwlaunch.launch(backend="cpu", world_size=2, start_method="fork") as executor:
        outside = executor.dump_stacks([0])[0]
        own = _own_answer(executor)
    for stack in (outside, own):
        main = stack.split('Thread "MainThread"', 1)[1].split("\nThread ", 1)[0]
        assert "in worker_main" in main, stack
        assert "in launch" not in main and "in start_ranks" not in main, stack
        assert "outer frames not shown" in main


def _own_answer(executor: Any) -> str:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_outside_stacks, "pyspy_command", lambda: None)
        return str(executor.dump_stacks([0])[0])


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One local Ray instance (loopback only), joined by the executor: ``shutdown()`` keeps it."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.ray
@pytest.mark.parametrize("state", ["holds the GIL in C", "stopped"])
def test_ray_actor_that_cannot_answer_times_out_within_the_bound(
    local_ray: None, state: str
) -> None:
    """An actor on this node is read by py-spy; the error does not wait for its own answer,
    nor for the connection to Ray to end."""
    fn, name = STATES[state]
    executor = hwlaunch.launch(backend="cpu", world_size=2, executor="ray", init_distributed=False)
    try:
        executor.collective_rpc("ping")
        began = time.monotonic()
        with pytest.raises(RpcTimeoutError) as caught:
            executor.collective_rpc(fn, timeout=TIMEOUT)
        past = time.monotonic() - began - TIMEOUT
    finally:
        executor.shutdown()
    assert past < TIMEOUT_BOUND * ALLOWANCE, f"RpcTimeoutError {past:.2f}s after the timeout"
    assert f"in {name}" in caught.value.stacks[1] and "read by py-spy" in caught.value.stacks[1]
