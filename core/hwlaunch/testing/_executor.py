"""ExecutorConformance: the checks any executor plugin runs from its own pytest suite.

Subclass it in a test module and name the executor::

    from hwlaunch.testing import ExecutorConformance

    class TestAcmeSub(ExecutorConformance):
        executor = "acme-sub"

pytest collects the subclass and runs, against the installed plugin: registration (the spec is
listed and its class is a ``hwlaunch.Executor``), results in rank order, a worker's exception as
WorkerError from the lowest failing rank (the executor stays usable), a failed start as
WorkerStartupError, an idempotent shutdown after which calls are refused, and no process left
behind after a normal shutdown, a failed start, or leaving the ``with`` block on an exception.
Then the worker contract of :class:`BackendConformance`'s lifecycle check, run under this
executor with ``backend``, as the executor's declared capabilities say (each start method the
backend allows for ``start_method``, a two-node Ray cluster for ``ray``, one process per rank
unless ``in_process``): a vendor's executor is held to what a built-in is.

Executors that adopt a launcher's ranks (``needs_launcher``) run only under that launcher:
the class skips them, with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import psutil
import pytest

from hwlaunch.errors import WorkerError, WorkerStartupError
from hwlaunch.executor.base import Executor
from hwlaunch.executor.launcher import launch, registered_executor
from hwlaunch.planning.registry import load_registry
from hwlaunch.planning.resolver import resolve
from hwlaunch.spec import START_METHODS
from hwlaunch.testing._capabilities import two_node_cluster
from hwlaunch.testing._conformance import BackendConformance
from hwlaunch.worker import Worker

__all__ = ["ExecutorConformance"]

GONE_WAIT = 30.0  # seconds a stopped worker process may take to disappear


class _FailsToStart:
    def init_device(self) -> None:
        raise RuntimeError("conformance: init_device fails on purpose")


def _rank(worker: Worker) -> int:
    return worker.rank


def _pid(worker: Worker) -> int:
    return os.getpid()


def _fail_on_last(worker: Worker, marker: str) -> int:
    if worker.rank == worker.world_size - 1:
        raise ValueError(f"{marker} on rank {worker.rank}")
    return worker.rank


class ExecutorConformance:
    """Conformance checks for one executor; subclass as ``Test<Name>`` and set ``executor``."""

    executor: ClassVar[str]
    backend: ClassVar[str] = "cpu"
    world_size: ClassVar[int | None] = None  # default: 2, or the executor's max_world_size

    # -- helpers ---------------------------------------------------------------------------
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """The worker contract once per start method where the executor declares
        ``start_method``, else once (``ray``: on two nodes)."""
        if "contract_method" not in metafunc.fixturenames:
            return
        spec = load_registry().executor_specs.get(self.executor)
        if spec is not None and spec.start_method:
            metafunc.parametrize("contract_method", START_METHODS, ids=START_METHODS)
        else:
            ray = spec is not None and spec.ray
            metafunc.parametrize(
                "contract_method", [None], ids=["two-nodes" if ray else self.executor]
            )

    def backend_kit(self) -> BackendConformance:
        """The backend suite, checking ``backend`` under this executor only."""
        kit: type[BackendConformance] = type(
            f"{type(self).__name__}Backend",
            (BackendConformance,),
            {"backend": self.backend, "executors": (self.executor,)},
        )
        return kit()

    @pytest.fixture(autouse=True)
    def _applicable(self) -> None:
        spec = load_registry().executor_specs.get(self.executor)
        if spec is not None and spec.needs_launcher:
            pytest.skip(f"executor {self.executor!r} runs only under its launcher")

    def size(self) -> int:
        if self.world_size is not None:
            return self.world_size
        limit = load_registry().executor_specs[self.executor].max_world_size
        return min(2, limit or 2)

    def start(self, **kwargs: Any) -> Executor:
        plan = resolve(backend=self.backend, world_size=self.size(), executor=self.executor)
        assert plan.executor == self.executor, plan.explain()
        return launch(plan, **kwargs)

    @pytest.fixture
    def pids(self) -> Iterator[set[int]]:
        """Worker pids the test saw; after the test, every one other than ours has exited."""
        seen: set[int] = set()
        yield seen
        others = [p for p in seen if p != os.getpid()]
        procs = [psutil.Process(p) for p in others if psutil.pid_exists(p)]
        _, alive = psutil.wait_procs(procs, timeout=GONE_WAIT)
        alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"worker processes left running: {[p.pid for p in alive]}"

    # -- the checks ------------------------------------------------------------------------
    def test_registered(self) -> None:
        registry = load_registry()
        assert self.executor in registry.executors, (
            f"executor {self.executor!r} is not registered; registered: "
            f"{sorted(registry.executors)}; failed plugins: "
            f"{[(p.name, p.error) for p in registry.failures]}"
        )
        assert issubclass(registered_executor(self.executor)[1], Executor)

    def test_rank_order_and_process_group(self, pids: set[int]) -> None:
        n = self.size()
        with self.start() as executor:
            assert executor.world_size == n
            assert executor.collective_rpc(_rank) == list(range(n))
            pids.update(executor.collective_rpc(_pid))
            assert executor.collective_rpc("all_reduce_rank") == [n * (n - 1) // 2] * n
            executor.check_health()

    def test_worker_error_names_the_rank_and_keeps_the_executor(self, pids: set[int]) -> None:
        n = self.size()
        with self.start() as executor:
            pids.update(executor.collective_rpc(_pid))
            with pytest.raises(WorkerError) as info:
                executor.collective_rpc(_fail_on_last, args=("conformance",))
            assert info.value.rank == n - 1
            assert info.value.exc_type == "ValueError"
            assert "_fail_on_last" in info.value.remote_traceback
            assert executor.collective_rpc(_rank) == list(range(n))

    def test_startup_error(self, pids: set[int]) -> None:
        children = {p.pid for p in psutil.Process().children(recursive=True)}
        with pytest.raises(WorkerStartupError) as info:
            self.start(worker_extension=_FailsToStart)
        assert "init_device fails on purpose" in str(info.value)
        pids.update(p.pid for p in psutil.Process().children(recursive=True))
        pids.difference_update(children)

    def test_shutdown_is_idempotent_and_final(self, pids: set[int]) -> None:
        executor = self.start()
        pids.update(executor.collective_rpc(_pid))
        executor.shutdown()
        executor.shutdown()
        with pytest.raises(Exception, match="shut down"):
            executor.collective_rpc(_rank)

    def test_leaving_with_on_an_exception_stops_the_workers(self, pids: set[int]) -> None:
        with pytest.raises(KeyError), self.start() as executor:
            pids.update(executor.collective_rpc(_pid))
            raise KeyError("leaving the block")

    def test_worker_contract(
        self, contract_method: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The backend suite's lifecycle under this executor; one rank on each node of a real
        two-node Ray cluster where it declares ``ray``."""
        kit = self.backend_kit()
        if not load_registry().executor_specs[self.executor].ray:
            kit.run_lifecycle(self.executor, contract_method, tmp_path, monkeypatch)
            return
        with two_node_cluster(kit.spec()) as address:
            kit.run_lifecycle(
                self.executor, None, tmp_path, monkeypatch, nnodes=2, ray_address=address
            )
