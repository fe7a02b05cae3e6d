"""What ``LLM()`` hands to the executor that vLLM constructs inside it, and takes back.

Why a context variable: vLLM builds the executor itself, from a class, deep inside
``vllm.LLM(...)``; the environment as the user had it (before vLLM's platform wrote into it)
reaches the executor on the same thread this way, and the executor's plan comes back for
``llm.plan``.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from hwlaunch import Plan

__all__ = ["PENDING", "PLATFORM_ONLY_ENV", "Handoff"]

# What vLLM's CPU platform writes into the engine's process for its own executor alone: one
# compile thread (its workers are daemonic: no compile pool) and spawn for its workers.
# Neither belongs in hwlaunch's workers, nor in the user's environment once the engine is built.
PLATFORM_ONLY_ENV = ("TORCHINDUCTOR_COMPILE_THREADS", "VLLM_WORKER_MULTIPROC_METHOD")


@dataclass
class Handoff:
    user_environ: dict[str, str]  # os.environ before vLLM's platform changed it
    plan: Plan | None = None  # the plan the executor launched (with the CPU binding)


PENDING: ContextVar[Handoff | None] = ContextVar("hwlaunch_vllm_pending", default=None)
