"""HwlaunchExecutor: vLLM's V1 ``Executor`` on hwlaunch's workers.

Why: vLLM's own executors decide nothing about how their processes start (its CPU platform
forces spawn), make daemonic workers (no torch.compile pool, no DataLoader), and leave the
engine's processes running when the driver is killed. This executor starts vLLM's own worker
class (the config's ``worker_cls``, through vLLM's ``WorkerWrapperBase``) in hwlaunch's
workers, from a plan made by hwlaunch's rules, and answers every call the engine makes
(``collective_rpc`` with vLLM's argument order, futures for ``execute_model`` and
``sample_tokens``, ``check_health``, ``shutdown``, the failure callback) through hwlaunch's
executor: its thread budget, per-rank output, stall watchdog, shutdown grace and
driver-death teardown come with it.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import cloudpickle
import vllm.envs as vllm_envs
from vllm.v1.executor.abstract import Executor

import hwlaunch
from hwlaunch.integrations.vllm._handoff import PENDING
from hwlaunch.integrations.vllm._plan import bind_cpus, resolve_for_vllm
from hwlaunch.integrations.vllm._shm import (
    remove_rendezvous_file,
    remove_segments,
    segments_ident,
)

__all__ = ["HwlaunchExecutor"]

EXTENSION = "hwlaunch.integrations.vllm._worker:VllmWorker"
# A child of vLLM's logger: the plan appears where vLLM's own messages do, in its format.
logger = logging.getLogger("vllm.hwlaunch")


class HwlaunchExecutor(Executor):
    """vLLM's executor on hwlaunch: ``vllm.LLM(..., distributed_executor_backend=HwlaunchExecutor)``
    or ``"hwlaunch.integrations.vllm.HwlaunchExecutor"``. ``executor.plan`` is the plan."""

    supports_pp = True
    plan: hwlaunch.Plan

    def _init_executor(self) -> None:
        handoff = PENDING.get()
        world_size = self.parallel_config.world_size
        # Resolved now, not reused from LLM(): the facts (threads, devices) are as they are
        # at the launch, after vLLM built its engine in this process.
        self.plan = bind_cpus(resolve_for_vllm(world_size), os.environ)
        if handoff is not None:
            handoff.plan = self.plan
        logger.info("hwlaunch plan for vLLM's workers:\n%s", self.plan.explain())
        self._on_failure: Callable[[], None] | None = None
        self._failure_lock = threading.Lock()
        self.output_rank = world_size - (
            self.parallel_config.tensor_parallel_size
            * self.parallel_config.prefill_context_parallel_size
        )
        self._workers = hwlaunch.launch(
            self.plan, worker_extension=EXTENSION, init_distributed=False
        )
        init_method = self._rendezvous = _init_method()
        self._segments = segments_ident(init_method)
        try:
            self._workers.collective_rpc("vllm_start", args=(self.vllm_config, init_method))
        except BaseException:
            self.shutdown()
            raise

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        non_block: bool = False,
        unique_reply_rank: int | None = None,
    ) -> Any:
        """Run ``method`` on vLLM's worker in every rank, vLLM's order of arguments: a list
        in rank order, rank ``unique_reply_rank``'s result alone, or a Future of either."""
        sent = (
            method
            if isinstance(method, str)
            else cloudpickle.dumps(method, protocol=pickle.HIGHEST_PROTOCOL)
        )
        return self._call(
            "vllm_call", (sent, tuple(args), kwargs or {}), timeout, non_block, unique_reply_rank
        )

    def _call(
        self,
        name: str,
        args: tuple[Any, ...],
        timeout: float | None,
        non_block: bool,
        unique_reply_rank: int | None,
    ) -> Any:
        """One call of hwlaunch's executor; a worker's death met here fails the engine too."""
        try:
            result = self._workers.collective_rpc(
                name,
                args=args,
                timeout=timeout,
                non_block=non_block,
                unique_reply_rank=unique_reply_rank,
            )
        except hwlaunch.WorkerDiedError:
            self._failed()
            raise
        if non_block:
            result.add_done_callback(self._failed_if_died)
        return result

    def execute_model(self, scheduler_output: Any, non_block: bool = False) -> Any:
        return self._step("execute_model", scheduler_output, non_block)

    def sample_tokens(self, grammar_output: Any, non_block: bool = False) -> Any:
        return self._step("sample_tokens", grammar_output, non_block)

    def take_draft_token_ids(self) -> Any:
        return self.collective_rpc("take_draft_token_ids", unique_reply_rank=self.output_rank)

    def execute_dummy_batch(self) -> None:
        self.collective_rpc("execute_dummy_batch", unique_reply_rank=self.output_rank)

    def _step(self, method: str, arg: Any, non_block: bool) -> Any:
        """One step of the model: every rank runs it, the output rank's result comes back
        (a Future of it when ``non_block``), as the engine expects."""
        timeout = vllm_envs.VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS
        aggregator = self.kv_output_aggregator
        if aggregator is None:  # called by name on the worker: warnings and timeouts say which
            return self._call(method, (arg,), timeout, non_block, self.output_rank)
        outputs = self._call(method, (arg,), timeout, non_block, None)
        if not non_block:
            return aggregator.aggregate(outputs, output_rank=self.output_rank)
        return _Aggregated(outputs, aggregator, self.output_rank)

    def check_health(self) -> None:
        """Raises hwlaunch's WorkerDiedError (naming the rank) or RpcTimeoutError unless
        every rank's vLLM worker answers within 10 s."""
        self.collective_rpc("check_health", timeout=10)

    def register_failure_callback(self, callback: Callable[[], None]) -> None:
        """``callback()`` once, when a worker dies: from hwlaunch's monitor thread between
        calls, from the call that met the death during one (at once if one died already)."""
        self._on_failure = callback
        try:
            self._workers.raise_if_closed()
        except hwlaunch.WorkerDiedError:
            self._failed()
            return
        except hwlaunch.ExecutorClosedError:
            return  # shut down on purpose: no failure to report
        self._workers.watch_deaths(lambda _error: self._failed())

    def _failed_if_died(self, future: Future[Any]) -> None:
        if not future.cancelled() and isinstance(future.exception(), hwlaunch.WorkerDiedError):
            self._failed()

    def _failed(self) -> None:
        """Call the engine's failure callback, once."""
        with self._failure_lock:
            callback, self._on_failure = self._on_failure, None
        if callback is not None:
            callback()

    def shutdown(self) -> None:
        """Stop every worker (their own shutdown first, within the plan's grace); idempotent."""
        workers = getattr(self, "_workers", None)
        if workers is not None:
            workers.shutdown()
            remove_segments(self._segments)  # a rank that was killed left its own
            remove_rendezvous_file(self._rendezvous)

    @property
    def pids(self) -> list[int]:
        """The workers' process ids, in rank order."""
        return list(getattr(self._workers, "pids", ()))

    @classmethod
    def supports_async_scheduling(cls) -> bool:
        return False


def _init_method() -> str:
    """Where vLLM's ranks meet, chosen as vLLM's own executor chooses it."""
    from vllm.utils.network_utils import (
        aiter_requires_tcp_store,
        get_distributed_init_method,
        get_file_store_init_method,
        get_loopback_ip,
        get_open_port,
    )

    if aiter_requires_tcp_store():
        return str(get_distributed_init_method(get_loopback_ip(), get_open_port()))
    return str(get_file_store_init_method())


class _Aggregated(Future[Any]):
    """Every rank's outputs, merged by vLLM's KV output aggregator once they are in. Asking it
    asks the call it merges (hwlaunch reads a non-blocking call's replies in the thread that
    asks for them)."""

    def __init__(self, outputs: Future[Any], aggregator: Any, rank: int) -> None:
        super().__init__()
        self._outputs = outputs
        outputs.add_done_callback(lambda done: self._merge(done, aggregator, rank))

    def _merge(self, done: Future[Any], aggregator: Any, rank: int) -> None:
        try:
            self.set_result(aggregator.aggregate(done.result(), output_rank=rank))
        except BaseException as exc:
            self.set_exception(exc)

    def result(self, timeout: float | None = None) -> Any:
        self._outputs.exception(timeout)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._outputs.exception(timeout)
        return super().exception(timeout)
