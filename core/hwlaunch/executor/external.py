"""The external executor: torchrun, srun or mpirun started the ranks; this process is one.

It starts no process. This process becomes its own rank's worker: the backend's worker class
(with the caller's extension), ``init_device()`` on the launcher's local rank, and
``init_distributed()`` through the launcher's rendezvous. ``collective_rpc`` runs the call on
this rank only and returns a one-element list; the other ranks run the same program and make
the same call, which is how collectives inside it meet.

What carries over from the other executors: it is the uni executor with the launcher's rank
and rendezvous, so the worker lives on one dedicated thread, per-thread device state is the
same for start-up and every call, and a call can time out; errors are the same (an exception in the call raises WorkerError with its
traceback and this rank; a failed start raises WorkerStartupError).

What does not apply, because the launcher owns the processes:

- RpcTimeoutError closes this executor, as elsewhere, but cannot stop the call (a thread cannot
  be stopped) nor the other ranks: a collective that hangs is ended by the process group's own
  timeout or by the launcher, which ends every rank when one fails.
- WorkerDiedError is never raised: when another rank dies, the launcher ends this one.
- Restarts: torchrun's ``--max-restarts`` and SLURM's requeue restart the whole program, which
  launches again. hwlaunch does not restart a rank itself.
- ``plan.env`` and device visibility are not applied: the launcher set this process's
  environment before Python started. The thread budget (``plan.cpu_threads``) is, through
  ``torch.set_num_threads`` when the worker starts.

The rendezvous: under torchrun the agent already serves the store at ``MASTER_ADDR:MASTER_PORT``
(and tells its workers so with ``TORCHELASTIC_USE_AGENT_STORE``), so the worker joins it through
torch's own ``env://`` rendezvous. Under SLURM and MPI rank 0 hosts the store itself at the
address the plan shows (``hwlaunch.planning.launchers`` says how it is derived).
"""

from __future__ import annotations

import atexit
import weakref
from typing import TYPE_CHECKING, Any

from hwlaunch.errors import ConfigError
from hwlaunch.executor._runtime import apply_cpu_threads, worker_class
from hwlaunch.executor._setup import run_worker_setup
from hwlaunch.executor.base import ExecutorOptions
from hwlaunch.executor.uni import UniExecutor
from hwlaunch.plan import Plan
from hwlaunch.planning.launchers import detect_launcher
from hwlaunch.runtime_facts import LauncherInfo
from hwlaunch.worker import Worker

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["ExternalExecutor"]


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


class ExternalExecutor(UniExecutor):
    """This process is one rank of a job a launcher started: ``collective_rpc`` returns this
    rank's result as a one-element list."""

    def __init__(
        self,
        plan: Plan,
        worker_extension: type | str | None = None,
        **options: Unpack[ExecutorOptions],
    ) -> None:
        self.launcher = detect_launcher()
        self.rank, self._local_rank, self._addr, self._port = placement(
            plan, self.launcher, options.get("init_distributed", True)
        )
        super().__init__(plan, worker_extension, **options)
        atexit.register(_shutdown_at_exit, weakref.ref(self))

    def _check_plan(self, plan: Plan) -> None:
        """placement() has checked the plan against the launcher."""

    def _reply_of(self, results: list[Any], rank: int) -> Any:
        """Only this rank's result is here: ``unique_reply_rank=R`` gives it on rank R, and
        None on every other rank (each of which ran the call too)."""
        return results[0] if rank == self.rank else None

    def _thread_name(self) -> str:
        return f"hwlaunch-external-rank{self.rank}"

    def _build_worker(self, extension: bytes | str | None, init_distributed: bool) -> Worker:
        cls = worker_class(self.plan, extension)
        apply_cpu_threads(self.plan)
        if self.launcher.launcher == "torchrun":
            cls = type(cls.__name__, (EnvRendezvous, cls), {})
        worker = cls(
            rank=self.rank,
            local_rank=self._local_rank,
            world_size=self.plan.world_size,
            plan=self.plan,
            master_addr=self._addr,
            master_port=self._port,
        )
        run_worker_setup(worker)
        worker.init_device()
        if init_distributed:
            worker.init_distributed()
        return worker
