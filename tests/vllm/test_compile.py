"""torch.compile in hwlaunch's workers: inductor's compile workers at their default.

vLLM's CPU platform sets ``TORCHINDUCTOR_COMPILE_THREADS=1`` because its workers are
daemonic (no children allowed); hwlaunch's workers are not, so the variable, which the user
did not set, stays out of them and inductor decides its compile workers itself.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vllm_engines import ENGINE, close, executor_of, token_ids


def _inductor_threads(worker: Any) -> tuple[str | None, int, int, list[str]]:
    import psutil
    import torch._inductor.config as inductor

    variable = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")
    children = [" ".join(p.cmdline())[:120] for p in psutil.Process().children(recursive=True)]
    return variable, int(inductor.compile_threads), len(os.sched_getaffinity(0)), children


def test_compiled_workers_give_the_eager_tokens(
    tiny_model: Path, engine_tp1: Any, prompts: list[str]
) -> None:
    from hwlaunch.integrations.vllm import LLM

    llm = LLM(str(tiny_model), **{**ENGINE, "enforce_eager": False})
    try:
        compiled = token_ids(llm, prompts)
        [(variable, threads, cpus, children)] = executor_of(llm).collective_rpc(_inductor_threads)
    finally:
        close(llm)
    assert compiled == token_ids(engine_tp1, prompts)
    print(f"compile threads {threads} on {cpus} CPUs; the worker's children: {children}")
    assert variable is None
    assert threads == min(32, cpus)  # inductor's default: one compile worker per CPU
