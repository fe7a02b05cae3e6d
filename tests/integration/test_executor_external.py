"""The external executor in this process, as rank 0 of a one-rank torchrun job.

The two-rank job under a real torchrun is in test_external.py; here are the error paths, which
need no second rank.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hwlaunch
from hwlaunch import (
    ConfigError,
    Executor,
    ExecutorClosedError,
    RpcTimeoutError,
    Worker,
    WorkerError,
    WorkerStartupError,
)
from hwlaunch.executor.base import free_port

pytestmark = [pytest.mark.timeout(60)]


class Probe:
    rank: int

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
def one_rank(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Executor]]:
    """torchrun's variables for rank 0 of 1, with the store at a free loopback port."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_")):
            monkeypatch.delenv(name)
    env = {
        "TORCHELASTIC_RUN_ID": "test",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    executors: list[Executor] = []
    yield executors
    for executor in executors:
        executor.shutdown()


def adopt(started: list[Executor], **kwargs: Any) -> Any:
    executor = hwlaunch.launch(backend="cpu", **kwargs)
    started.append(executor)
    assert type(executor).__name__ == "ExternalExecutor"
    return executor


def test_this_process_is_the_worker(one_rank: list[Executor]) -> None:
    executor = adopt(one_rank, worker_extension=Probe)
    assert (executor.plan.executor, executor.world_size, executor.rank) == ("external", 1, 0)
    ((pid, thread),) = executor.collective_rpc("where")
    assert pid == os.getpid() and thread != threading.get_ident()
    assert executor.collective_rpc("all_reduce_rank") == [0]
    import torch.distributed as dist

    assert dist.is_initialized()  # joined through torchrun's env:// rendezvous
    executor.shutdown()
    assert not dist.is_initialized()  # shutdown left the process group
    with pytest.raises(ExecutorClosedError, match="shut down"):
        executor.collective_rpc("ping")


def test_worker_error_keeps_the_executor_usable(one_rank: list[Executor]) -> None:
    executor = adopt(one_rank)
    with pytest.raises(WorkerError) as info:
        executor.collective_rpc(explode, args=("missing",))
    assert (info.value.rank, info.value.exc_type) == (0, "KeyError")
    assert "in explode" in info.value.remote_traceback
    assert executor.collective_rpc("ping") == [os.getpid()]


def test_rpc_timeout_closes_the_executor(one_rank: list[Executor]) -> None:
    executor = adopt(one_rank, worker_extension=Probe)
    with pytest.raises(RpcTimeoutError) as info:
        executor.collective_rpc("nap", args=(1.0,), timeout=0.1)
    assert (info.value.method, info.value.ranks) == ("nap", [0])
    with pytest.raises(ExecutorClosedError, match="'nap' timed out"):
        executor.collective_rpc("ping")
    # the worker's own shutdown still runs once the nap is over: the process group is left
    # (and a test after this one may fork workers, which must not inherit it)
    import torch.distributed as dist

    deadline = time.monotonic() + 10
    while dist.is_initialized():
        assert time.monotonic() < deadline, "the timed-out worker never shut down"
        time.sleep(0.01)


def test_startup_error_names_the_rank(one_rank: list[Executor]) -> None:
    with pytest.raises(WorkerStartupError) as info:
        adopt(one_rank, worker_extension=FailsToInit)
    assert info.value.rank == 0
    assert "RuntimeError: no device for you" in str(info.value)


def test_plan_made_for_another_job_is_refused(
    one_rank: list[Executor], monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = hwlaunch.resolve(backend="cpu")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="the plan's world_size 1 disagrees with the torchrun"):
        hwlaunch.launch(plan)
    for name in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name)
    with pytest.raises(ConfigError, match="no launcher started this process"):
        hwlaunch.launch(plan)


def test_mpi_without_master_port_says_what_to_set(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith(("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_", "MASTER_")):
            monkeypatch.delenv(name)
    for key, value in {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}.items():
        monkeypatch.setenv(key, value)
    with (
        pytest.warns(UserWarning, match="MASTER_PORT not set and not derivable for launcher mpi"),
        pytest.raises(ConfigError, match="MASTER_PORT not set, and mpi gives nothing"),
    ):
        hwlaunch.launch(backend="cpu")  # the plan warns, the executor refuses
