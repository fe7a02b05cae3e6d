"""``LLM(model, **kwargs)``: vLLM's offline engine on hwlaunch's executor, the one obvious way.

Why the engine core runs in the caller's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set
only while the engine is built): vLLM otherwise starts its engine core as a process of its
own, and on its CPU platform always with spawn, which re-imports the caller's ``__main__``:
a script without ``if __name__ == "__main__":`` dies in CPython's "bootstrapping phase"
error, and a killed driver leaves that process (and its workers) running. In the caller's
process the engine core needs no process of its own; the only processes are hwlaunch's
workers, started the way hwlaunch's plan says. The plan is resolved here, before vLLM loads
anything, and again by the executor with the facts of the moment it launches: a plan that
needs spawn or forkserver for a launch at module level raises ``MissingMainGuardError``
naming the caller's file:line before any process starts.
"""

from __future__ import annotations

from typing import Any

from hwlaunch.integrations.vllm._environ import environment
from hwlaunch.integrations.vllm._handoff import PENDING, Handoff
from hwlaunch.integrations.vllm._plan import resolve_for_vllm

__all__ = ["LLM"]

ENGINE_IN_PROCESS = "VLLM_ENABLE_V1_MULTIPROCESSING"
EXECUTOR = "hwlaunch.integrations.vllm.HwlaunchExecutor"
WORKER_METHOD = "VLLM_WORKER_MULTIPROC_METHOD"


def LLM(model: str, **kwargs: Any) -> Any:
    """``vllm.LLM(model, **kwargs)`` whose workers are hwlaunch's; ``llm.plan`` is the plan.

    ``distributed_executor_backend`` is hwlaunch's (passing another is a ValueError). The
    world size is ``tensor_parallel_size`` x ``pipeline_parallel_size`` x
    ``prefill_context_parallel_size``, as vLLM computes it.
    """
    backend = kwargs.pop("distributed_executor_backend", None)
    if (
        backend is not None
        and backend != EXECUTOR
        and getattr(backend, "__name__", None) != "HwlaunchExecutor"
    ):
        raise ValueError(
            f"hwlaunch.integrations.vllm.LLM runs on hwlaunch's executor, got "
            f"distributed_executor_backend={backend!r}. Fix: leave it out, or use vllm.LLM "
            "for vLLM's own executors"
        )
    world_size = 1
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "prefill_context_parallel_size"):
        world_size *= int(kwargs.get(name) or 1)
    resolve_for_vllm(world_size)  # fails here, before vLLM loads, on what it would fail on later
    handoff = Handoff()
    import vllm

    from hwlaunch.integrations.vllm._executor import HwlaunchExecutor

    token = PENDING.set(handoff)
    try:
        # VLLM_ENABLE_V1_MULTIPROCESSING=0 while vLLM builds its engine (the variable is read
        # then); afterwards it, and the VLLM_WORKER_MULTIPROC_METHOD=spawn that vLLM's CPU
        # platform writes for its own executor (not used here), are as the user had them.
        with environment({ENGINE_IN_PROCESS: "0"}, restore=(WORKER_METHOD,)):
            llm = vllm.LLM(model, distributed_executor_backend=HwlaunchExecutor, **kwargs)
    finally:
        PENDING.reset(token)
    llm.plan = handoff.plan
    return llm
