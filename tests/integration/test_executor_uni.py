"""The uni executor: one worker in the caller's process, with the mp executor's interface and errors."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hwlaunch
from hwlaunch import Executor, RpcTimeoutError, Worker, WorkerError, WorkerStartupError

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("clean_env")]


class Probe:
    rank: int

    def echo(self, value: Any, *, tag: str | None = None) -> tuple[int, Any, str | None]:
        return self.rank, value, tag

    def where(self) -> tuple[int, int]:
        return os.getpid(), threading.get_ident()

    def nap(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


class FailsToInit:
    def init_device(self) -> None:
        raise RuntimeError("no device for you")


def explode(worker: Worker, message: str) -> None:
    raise KeyError(message)


@pytest.fixture
def started() -> Iterator[list[Executor]]:
    executors: list[Executor] = []
    yield executors
    for executor in executors:
        executor.shutdown()


def launch_uni(started: list[Executor], **kwargs: Any) -> Executor:
    executor = hwlaunch.launch(backend="cpu", world_size=1, **kwargs)
    started.append(executor)
    assert type(executor).__name__ == "UniExecutor"
    return executor


def test_runs_in_the_callers_process(started: list[Executor]) -> None:
    executor = launch_uni(started, worker_extension=Probe)
    assert executor.plan.executor == "uni" and executor.world_size == 1
    assert executor.collective_rpc("ping") == [os.getpid()]
    ((pid, thread),) = executor.collective_rpc("where")
    assert pid == os.getpid() and thread != threading.get_ident()
    # the same thread for every call: per-thread device state stays put
    assert executor.collective_rpc("where") == [(pid, thread)]


def test_callables_methods_kwargs_and_payload(started: list[Executor]) -> None:
    executor = launch_uni(started, worker_extension=Probe)
    offset = 5
    assert executor.collective_rpc(lambda w, x: w.rank + x + offset, args=(1,)) == [6]
    assert executor.collective_rpc("echo", args=(1,), kwargs={"tag": "t"}) == [(0, 1, "t")]
    payload = os.urandom(1 << 20)
    ((rank, back, _),) = executor.collective_rpc("echo", args=(payload,))
    assert rank == 0
    assert hashlib.sha256(back).digest() == hashlib.sha256(payload).digest()


def test_extension_by_import_path(started: list[Executor], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SCRIPTS))
    executor = launch_uni(started, worker_extension="hwl_ext:Greeter", init_distributed=False)
    assert executor.collective_rpc("greet", args=("bo",)) == ["hello bo from rank 0!"]


def test_worker_error_keeps_the_executor_usable(started: list[Executor]) -> None:
    executor = launch_uni(started)
    with pytest.raises(WorkerError) as info:
        executor.collective_rpc(explode, args=("missing",))
    err = info.value
    assert (err.rank, err.exc_type) == (0, "KeyError")
    assert "in explode" in err.remote_traceback
    assert err.__context__ is None  # raised cleanly, not "during handling of" another error
    assert executor.collective_rpc("ping") == [os.getpid()]


def test_rpc_timeout_closes_the_executor(started: list[Executor]) -> None:
    executor = launch_uni(started, worker_extension=Probe)
    with pytest.raises(RpcTimeoutError) as info:
        executor.collective_rpc("nap", args=(1.0,), timeout=0.1)
    assert (info.value.method, info.value.ranks) == ("nap", [0])
    with pytest.raises(hwlaunch.ExecutorClosedError, match="'nap' timed out"):
        executor.collective_rpc("ping")
    # the worker's own shutdown still runs once the nap is over: the process group is left
    import torch.distributed as dist

    deadline = time.monotonic() + 10
    while dist.is_initialized():
        assert time.monotonic() < deadline, "the timed-out worker never shut down"
        time.sleep(0.01)


def test_startup_errors(
    started: list[Executor], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(WorkerStartupError) as info:
        launch_uni(started, worker_extension=FailsToInit)
    assert info.value.rank == 0
    assert "RuntimeError: no device for you" in str(info.value)
    assert "in init_device" in info.value.remote_traceback
    monkeypatch.syspath_prepend(str(SCRIPTS))
    monkeypatch.setenv("HWL_TEST_MARKERS", str(tmp_path))  # read by the module before it fails
    with pytest.raises(WorkerStartupError) as info:
        launch_uni(started, worker_extension="hwl_ext_broken:X")
    assert "hwl_ext_broken fails at import on purpose" in str(info.value)


def test_shutdown_idempotent_and_context_manager(started: list[Executor]) -> None:
    import torch.distributed as dist

    before = dict(os.environ)
    with launch_uni(started) as executor:
        assert executor.collective_rpc("all_reduce_rank") == [0]  # n*(n-1)/2 for n = 1
        assert dist.is_initialized()
    assert not dist.is_initialized()
    executor.shutdown()
    executor.shutdown()
    with pytest.raises(hwlaunch.ExecutorClosedError, match="shut down"):
        executor.collective_rpc("ping")
    assert dict(os.environ) == before


def test_two_threads_at_once(started: list[Executor]) -> None:
    executor = launch_uni(started, worker_extension=Probe)
    barrier = threading.Barrier(2)
    got: dict[str, list[Any]] = {"a": [], "b": []}

    def caller(name: str) -> None:
        barrier.wait()
        for i in range(50):
            got[name].append(executor.collective_rpc("echo", args=((name, i),)))

    threads = [threading.Thread(target=caller, args=(n,)) for n in got]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for name, replies in got.items():
        assert replies == [[(0, (name, i), None)] for i in range(50)]


def test_launch_shows_the_plan_warnings_at_the_callers_line(started: list[Executor]) -> None:
    with pytest.warns(UserWarning, match="'fork' from resolve.start_method=. is ignored") as record:
        launch_uni(started, start_method="fork", init_distributed=False)
    assert record[0].filename == __file__
