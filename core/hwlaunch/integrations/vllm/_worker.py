"""The worker side: vLLM's own worker, built and driven inside an hwlaunch worker.

Why a mixin (``worker_extension``) and not a worker class of our own: hwlaunch's backend worker
already owns the process (its device, thread budget, output, watchdog, shutdown and
driver-death teardown); vLLM's ``WorkerWrapperBase`` builds the config's ``worker_cls`` and
answers the engine's calls through ``run_method``, exactly as in vLLM's own executors. This
module imports neither vLLM nor torch when it is imported: the CPU set is applied first, so
the OpenMP pool that torch starts later runs on the rank's CPUs.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from hwlaunch.integrations.vllm._binding import BIND_VAR, parse_binding
from hwlaunch.integrations.vllm._shm import (
    remove_rendezvous_file,
    remove_segments,
    unlink_sockets,
)

__all__ = ["VllmWorker"]

COMPILE_THREADS = "TORCHINDUCTOR_COMPILE_THREADS"


class VllmWorker:
    """Mixed into the backend's ``hwlaunch.Worker``: ``vllm_start`` builds vLLM's worker,
    ``vllm_call`` runs one of the engine's calls on it."""

    rank: int
    local_rank: int
    world_size: int
    plan: Any
    _vllm: Any = None
    _rendezvous: str | None = None  # where the ranks met (vllm_start)

    def init_device(self) -> None:
        """Bind this rank's CPUs (vLLM's CPU platform, from the plan's binding) before
        anything starts a thread pool, then bind the device as the backend does."""
        _bind_cpus(self.plan.env.get(BIND_VAR), self.local_rank, self.plan.world_size)
        super().init_device()  # type: ignore[misc]

    def vllm_start(self, vllm_config: Any, distributed_init_method: str) -> None:
        """Build vLLM's worker for this rank: ``init_worker``, ``init_device``, ``load_model``."""
        from vllm.v1.worker.worker_base import WorkerWrapperBase

        _inductor_at_its_default(self.plan.env)
        parallel = vllm_config.parallel_config
        kwargs = {
            "vllm_config": vllm_config,
            "local_rank": self.local_rank,
            "rank": self.rank,
            "distributed_init_method": distributed_init_method,
            "is_driver_worker": self.rank % parallel.tensor_parallel_size == 0,
        }
        all_kwargs: list[dict[str, Any]] = [{} for _ in range(self.world_size)]
        all_kwargs[self.rank] = kwargs
        wrapper = WorkerWrapperBase(rpc_rank=self.rank, global_rank=self.rank)
        self._rendezvous = distributed_init_method
        wrapper.init_worker(all_kwargs)
        wrapper.init_device()
        wrapper.load_model()
        self._vllm = wrapper

    def vllm_call(self, method: str | bytes, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One of the engine's calls: a method of vLLM's worker by name, or a callable
        (pickled by value in the driver) given vLLM's worker as its first argument."""
        from vllm.v1.outputs import AsyncModelRunnerOutput
        from vllm.v1.serial_utils import run_method

        if self._vllm is None:
            raise RuntimeError(f"vLLM's worker on rank {self.rank} is not started (vllm_start)")
        result = run_method(self._vllm, method, args, kwargs)
        if isinstance(result, AsyncModelRunnerOutput):  # resolved here: the reply is plain data
            result = result.get_output()
        return result

    def execute_model(self, scheduler_output: Any) -> Any:
        """The engine's step, by its own name: a stall warning or a timeout names it."""
        return self.vllm_call("execute_model", (scheduler_output,), {})

    def sample_tokens(self, grammar_output: Any) -> Any:
        """The step's sampling, by its own name (see ``execute_model``)."""
        return self.vllm_call("sample_tokens", (grammar_output,), {})

    def shutdown(self) -> None:
        """The job's CPU all-reduce segments unlinked, then vLLM's worker, then its process
        groups (as vLLM's own worker processes end them), then the backend's."""
        wrapper, self._vllm = self._vllm, None
        try:
            if wrapper is not None:
                # Unlinked first: a rank whose peer is gone (its driver killed, or the engine
                # core killed by vLLM's server) may not come back from ending vLLM's worker and
                # groups within its grace; every rank that holds the segments keeps them mapped.
                remove_segments(os.environ.get("VLLM_DIST_IDENT"))
                wrapper.shutdown()
                sockets = _broadcast_sockets()
                _end_vllm_groups()
                unlink_sockets(sockets)
                remove_rendezvous_file(self._rendezvous)  # nothing reads the store now
        finally:
            super().shutdown()  # type: ignore[misc]


def _broadcast_sockets() -> list[str]:
    """The ipc socket files of the broadcast queues this rank's vLLM groups bound (their
    writer's subscribe and notify addresses): vLLM closes the sockets and leaves the files."""
    from vllm.distributed import parallel_state

    paths = []
    for ref in list(getattr(parallel_state, "_groups", {}).values()):
        handle = getattr(getattr(ref(), "mq_broadcaster", None), "handle", None)
        for address in (getattr(handle, "local_subscribe_addr", None),
                        getattr(handle, "local_notify_addr", None)):  # fmt: skip
            if isinstance(address, str) and address.startswith("ipc://"):
                paths.append(address.removeprefix("ipc://"))
    return paths


def _end_vllm_groups() -> None:
    """vLLM's model-parallel groups and its distributed environment, ended."""
    from vllm.distributed.parallel_state import (
        destroy_distributed_environment,
        destroy_model_parallel,
    )

    destroy_model_parallel()
    destroy_distributed_environment()


def _bind_cpus(binding: str | None, local_rank: int, ranks: int) -> None:
    """Pin this process to its CPU set; torch's intra-op threads follow the set's size."""
    if not binding or not hasattr(os, "sched_setaffinity"):
        return
    cpu_sets = parse_binding(binding, ranks, "the plan's env")
    if cpu_sets is None:
        return
    cpus = cpu_sets[local_rank]
    os.sched_setaffinity(0, cpus)
    count = str(len(set(cpus)))
    os.environ["OMP_NUM_THREADS"] = count  # for a torch imported after this (spawn)
    torch = sys.modules.get("torch")
    if torch is not None:  # imported before the fork: resize its pool now
        torch.set_num_threads(int(count))


def _inductor_at_its_default(plan_env: dict[str, str]) -> None:
    """Let torch's inductor choose its compile workers, unless the plan's env sets them.

    ``import vllm`` sets ``TORCHINDUCTOR_COMPILE_THREADS=1`` in every process (its workers are
    daemonic, and a daemonic process cannot start inductor's compile pool); hwlaunch's workers
    are not daemonic. Inductor reads the variable when its config is imported: decide again.
    """
    if COMPILE_THREADS in plan_env:
        return
    os.environ.pop(COMPILE_THREADS, None)
    config: Any = sys.modules.get("torch._inductor.config")
    if config is not None:
        config.compile_threads = config.decide_compile_threads()
