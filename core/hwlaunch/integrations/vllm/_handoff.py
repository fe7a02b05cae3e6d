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

__all__ = ["PENDING", "Handoff"]


@dataclass
class Handoff:
    user_environ: dict[str, str]  # os.environ before vLLM's platform changed it
    plan: Plan | None = None  # the plan the executor launched (with the CPU binding)


PENDING: ContextVar[Handoff | None] = ContextVar("hwlaunch_vllm_pending", default=None)
