"""One set of semantics for every executor: closed, RPC timeout, start-up failure and timeout,
and a worker's death, for uni, mp under each start method, and ray (real processes, a real local
Ray instance)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import hwlaunch
from hwlaunch import (
    Executor,
    ExecutorClosedError,
    RpcTimeoutError,
    Worker,
    WorkerDiedError,
    WorkerError,
    WorkerStartupError,
)

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("clean_env")]

LOCAL_KINDS = ("uni", "mp-fork", "mp-spawn", "mp-forkserver")
# Ray actors cannot import this test module: its classes and functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Napper:
    def nap(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


class FailsToInit:
    def init_device(self) -> None:
        raise RuntimeError("no device here")


class HangsInInit:
    def init_device(self) -> None:
        time.sleep(60)


def a_lock(worker: Worker) -> Any:
    return threading.Lock()


def only_in_workers(worker: Worker, folder: str) -> Any:
    """An object of a class that only the workers can import: its module is on their path.
    Written whole under another name, then renamed: every rank writes it, and a rank must never
    import the file while another has it truncated."""
    partial = Path(folder, f".only_in_workers.{os.getpid()}")
    partial.write_text("class Token:\n    pass\n")
    os.replace(partial, Path(folder, "only_in_workers.py"))
    sys.path.insert(0, folder)
    import only_in_workers  # type: ignore[import-not-found]

    return only_in_workers.Token()


def exit_on_rank0(worker: Worker) -> None:
    if worker.rank == 0:
        os._exit(3)


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    """One local Ray instance for the module: the executors join it instead of starting one."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", num_cpus=4)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def started() -> Iterator[list[Executor]]:
    executors: list[Executor] = []
    yield executors
    for executor in executors:
        executor.shutdown()


def launch(kind: str, started: list[Executor], **kwargs: Any) -> Executor:
    executor_name, _, method = kind.partition("-")
    options: dict[str, Any] = {
        "backend": "cpu",
        "executor": executor_name,
        "world_size": 1 if executor_name == "uni" else 2,
        "start_method": method or None,
        "assume": {"main_guard": "guarded"},
        **kwargs,
    }
    executor = hwlaunch.launch(**options)
    started.append(executor)
    return executor


class Semantics:
    """The checks; each subclass names the executors it runs them on."""

    def test_closed_executor_raises_executor_closed(
        self, kind: str, started: list[Executor]
    ) -> None:
        executor = launch(kind, started, init_distributed=False)
        assert executor.collective_rpc("ping") != []
        executor.shutdown()
        executor.shutdown()  # idempotent
        with pytest.raises(ExecutorClosedError, match="shut down"):
            executor.collective_rpc("ping")
        with pytest.raises(ExecutorClosedError):
            executor.check_health()

    def test_rpc_timeout_closes_the_executor(self, kind: str, started: list[Executor]) -> None:
        executor = launch(kind, started, worker_extension=Napper, init_distributed=False)
        with pytest.raises(RpcTimeoutError) as info:
            executor.collective_rpc("nap", args=(30.0,), timeout=0.5)
        assert info.value.method == "nap"
        assert info.value.ranks == list(range(executor.world_size))
        with pytest.raises(ExecutorClosedError, match="'nap' timed out"):
            executor.collective_rpc("ping")

    def test_startup_failure_is_a_startup_error(self, kind: str, started: list[Executor]) -> None:
        with pytest.raises(WorkerStartupError, match="RuntimeError: no device here") as info:
            launch(kind, started, worker_extension=FailsToInit, init_distributed=False)
        assert "in init_device" in info.value.remote_traceback

    def test_startup_timeout_from_the_environment(
        self, kind: str, started: list[Executor], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """HWLAUNCH_STARTUP_TIMEOUT is resolved onto the plan and honoured by every executor (the
        uni executor too: a hanging init_device raises instead of waiting forever)."""
        monkeypatch.setenv("HWLAUNCH_STARTUP_TIMEOUT", "1.5")
        began = time.monotonic()
        with pytest.raises(WorkerStartupError, match=r"not ready within 1\.5s") as info:
            launch(kind, started, worker_extension=HangsInInit, init_distributed=False)
        assert "env HWLAUNCH_STARTUP_TIMEOUT" in str(info.value)
        assert time.monotonic() - began < 45, "the start-up timeout was not honoured"

    def test_a_result_that_cannot_be_pickled_is_a_worker_error(
        self, kind: str, started: list[Executor]
    ) -> None:
        if kind == "uni":
            pytest.skip("the uni worker's results stay in the caller's process: nothing pickles")
        executor = launch(kind, started, init_distributed=False)
        with pytest.raises(WorkerError) as info:
            executor.collective_rpc(a_lock)
        assert info.value.exc_type == "TypeError"
        assert "cannot pickle '_thread.lock' object" in info.value.message
        assert executor.collective_rpc(lambda worker: worker.rank) == [0, 1]  # still usable

    def test_a_reply_the_driver_cannot_decode_blames_the_driver(
        self, kind: str, started: list[Executor], tmp_path: Path
    ) -> None:
        """The worker raised nothing: its result holds a class the driver cannot import. The
        error says the driver could not decode the reply, and why, with the driver's own
        traceback; the executor stays usable."""
        if kind == "uni":
            pytest.skip("the uni worker's results stay in the caller's process: nothing pickles")
        executor = launch(kind, started, init_distributed=False)
        with pytest.raises(WorkerError) as info:
            executor.collective_rpc(only_in_workers, args=(str(tmp_path),))
        message = str(info.value)
        assert message.startswith(
            "the driver could not decode rank 0's reply to collective_rpc 'only_in_workers': "
            "ModuleNotFoundError: No module named 'only_in_workers'"
        ), message
        assert "rank 0 raised" not in message and "(ranks [1] failed too)" not in message
        assert "rank 1's reply could not be decoded either" in message
        assert info.value.rank == 0 and info.value.exc_type == "ModuleNotFoundError"
        assert "--- the driver's traceback (decoding rank 0's reply) ---" in message
        assert executor.collective_rpc(lambda worker: worker.rank) == [0, 1]  # still usable

    def test_worker_death_is_worker_died(self, kind: str, started: list[Executor]) -> None:
        if kind == "uni":
            pytest.skip("the uni worker is the caller's own process: it cannot die on its own")
        executor = launch(kind, started, init_distributed=False)
        with pytest.raises(WorkerDiedError) as info:
            executor.collective_rpc(exit_on_rank0, timeout=60)
        assert info.value.rank == 0
        with pytest.raises(WorkerDiedError):
            executor.collective_rpc("ping")


class TestLocalExecutors(Semantics):
    @pytest.fixture(params=LOCAL_KINDS)
    def kind(self, request: pytest.FixtureRequest) -> str:
        return str(request.param)


# Marked ray: it runs after every test that forks (tests/conftest.py), so that no forked
# process inherits Ray's threads.
@pytest.mark.ray
class TestRayExecutor(Semantics):
    @pytest.fixture
    def kind(self, ray_instance: None) -> str:
        return "ray"
