"""What the scripts share with the tests: engine settings, prompts, greedy tokens, a report."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # tests/vllm: the shared settings

from tiny_llama import PROMPTS
from vllm_engines import ENGINE, greedy

__all__ = ["ENGINE", "PROMPTS", "dist_ident", "rank_cpus", "report", "token_ids"]


def token_ids(llm: Any) -> list[list[int]]:
    outputs = llm.generate(PROMPTS, greedy(), use_tqdm=False)
    return [list(out.outputs[0].token_ids) for out in outputs]


def rank_cpus(llm: Any) -> list[list[int]]:
    """Each rank's CPU affinity, read in the worker."""
    executor = llm.llm_engine.engine_core.engine_core.model_executor
    return [sorted(cpus) for cpus in executor.collective_rpc(_affinity)]


def dist_ident(llm: Any) -> str:
    """The name vLLM's ranks give their shared-memory segments (``VLLM_DIST_IDENT``)."""
    executor = llm.llm_engine.engine_core.engine_core.model_executor
    return str(executor.collective_rpc(_ident)[0])


def _ident(worker: Any) -> str | None:
    return os.environ.get("VLLM_DIST_IDENT")


def _affinity(worker: Any) -> list[int]:
    return sorted(os.sched_getaffinity(0))


def report(**values: Any) -> None:
    """One JSON line on stdout: what the test reads."""
    print(json.dumps(values), flush=True)
