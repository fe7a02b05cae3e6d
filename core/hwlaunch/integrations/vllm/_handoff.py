"""What ``LLM()`` hands to the executor that vLLM constructs inside it, and takes back.

Why a context variable: vLLM builds the executor itself, from a class, deep inside
``vllm.LLM(...)``; the executor's plan comes back to ``LLM()`` for ``llm.plan`` this way, on
the same thread.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from hwlaunch import Plan

__all__ = ["PENDING", "Handoff"]


@dataclass
class Handoff:
    plan: Plan | None = None  # the plan the executor launched (with the CPU binding)


PENDING: ContextVar[Handoff | None] = ContextVar("hwlaunch_vllm_pending", default=None)
