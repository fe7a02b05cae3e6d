"""A driver whose OpenMP pool is running: a safe start method, named with its reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_engines import token_ids
from vllm_scripts import run_script


def test_driver_with_a_started_openmp_pool_gets_a_safe_start_method(
    tiny_model: Path, engine_tp2: Any, prompts: list[str]
) -> None:
    result = run_script("openmp_driver.py", str(tiny_model)).json
    print(f"start method {result['start_method']} ({result['source']}): {result['reason']}")
    # a forked worker would inherit the pool's locks without its threads and hang in its
    # first matmul: the plan starts the workers another way, and says why
    assert result["start_method"] in ("forkserver", "spawn"), result
    assert "OpenMP" in result["reason"] or "openmp" in result["reason"].lower(), result
    assert result["tokens"] == token_ids(engine_tp2, prompts)
