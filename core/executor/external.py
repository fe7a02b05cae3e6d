"""The external executor: torchrun, srun or mpirun started the ranks; this process is one.

It starts no process. This process becomes its own rank's worker: the backend's worker class
(with the caller's extension), ``init_device()`` on the launcher's local rank, and
``init_distributed()`` through the launcher's rendezvous. ``collective_rpc`` runs the call on
this rank only and returns a one-element list; the other ranks run the same program and make
the same call, which is how collectives inside it meet.

What carries over from the other executors: the worker lives on one dedicated thread (as in
the uni executor), so per-thread device state is the same for start-up and every call, and a
call can time out; errors are the same (an exception in the call raises WorkerError with its
traceback and this rank; a failed start raises WorkerStartupError).

What does not apply, because the launcher owns the processes:

- RpcTimeoutError closes this executor, as elsewhere, but cannot stop the call (a thread cannot
  be stopped) nor the other ranks: a collective that hangs is ended by the process group's own
  timeout or by the launcher, which ends every rank when one fails.
- WorkerDiedError is never raised: when another rank dies, the launcher ends this one.
- Restarts: torchrun's ``--max-restarts`` and SLURM's requeue restart the whole program, which
  launches again. hwlaunch does not restart a rank itself.
- ``plan.env`` and device visibility are not applied: the launcher set this process's
  environment before Python started.

The rendezvous: under torchrun the agent already serves the store at ``MASTER_ADDR:MASTER_PORT``
(and tells its workers so with ``TORCHELASTIC_USE_AGENT_STORE``), so the worker joins it through
torch's own ``env://`` rendezvous. Under SLURM and MPI rank 0 hosts the store itself at the
address the plan shows (``hwlaunch.launchers`` says how it is derived).
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any

from hwlaunch.errors import ConfigError, RpcTimeoutError, WorkerStartupError
from hwlaunch.executor.base import Executor, StatusCallback, raise_first_failure
from hwlaunch.launchers import LauncherInfo, detect_launcher
from hwlaunch.plan import Plan
from hwlaunch.worker import Worker
from hwlaunch.worker_runtime import (
    Failure,
    call,
    encode_extension,
    encode_method,
    method_label,
    worker_class,
)

SHUTDOWN_WAIT = 5.0  # seconds shutdown() waits for the worker's own shutdown()

_Job = tuple[Callable[[], Any], "Future[Any]"]


class EnvRendezvous:
    """Worker mixin: join torchrun's store through torch's ``env://`` rendezvous."""

    rank: int
    world_size: int

    def rendezvous_store(self) -> Any:
        from torch.distributed import rendezvous  # type: ignore[attr-defined]  # re-exported

        store, _, _ = next(rendezvous("env://", rank=self.rank, world_size=self.world_size))
        return store


def placement(plan: Plan, info: LauncherInfo, init_distributed: bool) -> tuple[int, int, str, int]:
    """(rank, local rank, MASTER_ADDR, MASTER_PORT) of this process, checked against the plan.

    The launcher is read again now, from this process's environment: a plan made elsewhere or
    with ``--assume launcher=...`` must still match the ranks that actually run.
    """
    planned = plan.facts.launcher.launcher if plan.facts is not None else "a launcher"
    if not info.detected or info.rank is None or info.world_size is None:
        raise ConfigError(
            f"the plan's executor is 'external' ({planned}), but no launcher started this "
            "process: TORCHELASTIC_RUN_ID with RANK/WORLD_SIZE/LOCAL_RANK, SLURM_PROCID with "
            "SLURM_STEP_NUM_TASKS, OMPI_COMM_WORLD_RANK or PMI_RANK/PMI_SIZE is not set. Fix: "
            "run the program under torchrun, srun or mpirun, or choose executor uni, mp or ray"
        )
    if info.world_size.value != plan.world_size:
        raise ConfigError(
            f"the plan's world_size {plan.world_size} disagrees with the {info.launcher} "
            f"launcher's {info.world_size.value} (from {info.world_size.source}). Fix: resolve "
            "the plan in this process, under the launcher"
        )
    rank = int(info.rank.value)
    local_rank = int(info.local_rank.value) if info.local_rank is not None else 0
    if not init_distributed or plan.world_size == 1:
        return rank, local_rank, "127.0.0.1", 0
    if info.master_addr is None or info.master_port is None:
        raise ConfigError(
            f"{' and '.join(info.missing)} not set, and {info.launcher} gives nothing to derive "
            "them from, so the ranks cannot meet. Fix: set MASTER_ADDR (the host of rank 0) and "
            "MASTER_PORT (a free port there) for every rank, e.g. mpirun -x MASTER_ADDR=host0 "
            "-x MASTER_PORT=29500"
        )
    return rank, local_rank, str(info.master_addr.value), int(info.master_port.value)


def _shutdown_at_exit(ref: weakref.ref[ExternalExecutor]) -> None:
    """Leave the process group before the interpreter ends (torch warns otherwise)."""
    executor = ref()
    if executor is not None:
        executor.shutdown()


class ExternalExecutor(Executor):
    def __init__(
        self,
        plan: Plan,
        worker_extension: type | str | None = None,
        *,
        init_distributed: bool = True,
        startup_timeout: float | None = None,
        on_status: StatusCallback | None = None,
    ) -> None:
        self.plan = plan
        self.warnings: list[str] = []
        self.launcher = detect_launcher()
        self.rank, local_rank, addr, port = placement(plan, self.launcher, init_distributed)
        cls = worker_class(plan, encode_extension(worker_extension))
        if self.launcher.launcher == "torchrun":
            cls = type(cls.__name__, (EnvRendezvous, cls), {})
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._rpc_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._closed_because: str | None = None
        self._worker: Worker | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"hwlaunch-external-rank{self.rank}", daemon=True
        )
        self._thread.start()
        if on_status:
            on_status(self.rank, "adopted")

        def build() -> Worker:
            worker = cls(
                rank=self.rank,
                local_rank=local_rank,
                world_size=plan.world_size,
                plan=plan,
                master_addr=addr,
                master_port=port,
            )
            worker.init_device()
            if init_distributed:
                worker.init_distributed()
            return worker

        future = self._submit(build)
        if not wait([future], startup_timeout).done:
            future.add_done_callback(lambda f: f.exception() or f.result().shutdown())
            self._close(f"the worker was not ready within {startup_timeout:g}s")
            raise WorkerStartupError(self.rank, f"not ready within {startup_timeout:g}s")
        error = future.exception()
        if error is not None:
            self._close("the worker failed to start")
            failure = Failure.current(error)
            raise WorkerStartupError(
                self.rank, f"{failure.exc_type}: {failure.message}", failure.traceback
            )
        self._worker = future.result()
        atexit.register(_shutdown_at_exit, weakref.ref(self))
        if on_status:
            on_status(self.rank, "ready")

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

    def _submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._jobs.put((fn, future))
        return future

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        """Run ``method`` on this rank; ``[result]`` (the other ranks get theirs)."""
        encoded = encode_method(method)
        with self._rpc_lock:
            with self._state_lock:
                if self._closed_because is not None:
                    raise RuntimeError(
                        f"this executor was shut down ({self._closed_because}); launch a new one"
                    )
                worker = self._worker
                assert worker is not None
                future = self._submit(
                    lambda: call(worker, encoded, tuple(args), dict(kwargs or {}))
                )
            if not wait([future], timeout).done:
                label = method_label(method)
                self._close(f"collective_rpc {label!r} timed out", wait_for_worker=False)
                raise RpcTimeoutError(label, [self.rank], timeout or 0.0)
            error = future.exception()
            if error is not None:
                raise_first_failure({self.rank: Failure.current(error)})
            return [future.result()]

    def check_health(self) -> None:
        self.collective_rpc("ping", timeout=30.0)

    def shutdown(self) -> None:
        self._close("shutdown() was called")

    def _close(self, reason: str, *, wait_for_worker: bool = True) -> None:
        """Queue the worker's shutdown (leaving the process group) behind the running call."""
        with self._state_lock:
            if self._closed_because is not None:
                return
            self._closed_because = reason
            worker = self._worker
        done = self._submit(worker.shutdown) if worker is not None else None
        self._jobs.put(None)
        if wait_for_worker and done is not None and wait([done], SHUTDOWN_WAIT).done:
            self._thread.join(SHUTDOWN_WAIT)
