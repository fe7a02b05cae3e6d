"""The vLLM tests: one tiny model per session, engines shared, the directory skipped without vLLM.

Why skipped and not failed: hwlaunch's own environment has no vLLM (it needs its own torch and
transformers pins); CI's vLLM environment sets ``HWLAUNCH_REQUIRE_VLLM=1``, and there a vLLM
that does not import fails the run loudly instead of skipping it. Every engine start costs
tens of seconds on two cores: engines live in module or session fixtures wherever the tests
allow, and tests that end an engine (a killed worker) start their own.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_engines import ENGINE, close

HERE = Path(__file__).parent
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: keep each engine's KV cache small


def _vllm_missing() -> str | None:
    """Why vLLM cannot be used here (None: it imports); fails where it is required.

    This directory itself is a namespace package named ``vllm`` where ``tests/`` is on
    ``sys.path``: ``import vllm`` would find it when vLLM is not installed. Only a module with
    a file of its own (the real vLLM; it wins where it is installed) counts.
    """
    try:
        spec = importlib.util.find_spec("vllm")
        if spec is None or spec.origin is None:
            raise ModuleNotFoundError("No module named 'vllm'", name="vllm")
        import vllm  # noqa: F401
    except Exception as exc:
        if os.environ.get("HWLAUNCH_REQUIRE_VLLM") == "1":
            raise pytest.UsageError(
                f"HWLAUNCH_REQUIRE_VLLM=1 but vLLM does not import: {type(exc).__name__}: {exc}"
            ) from exc
        return f"vLLM is not importable ({type(exc).__name__}: {exc})"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of this directory ``vllm``; skip them all where vLLM is missing."""
    ours = [item for item in items if HERE in Path(str(item.path)).parents]
    if not ours:
        return
    missing = _vllm_missing()
    for item in ours:
        item.add_marker(pytest.mark.vllm)
        if missing:
            item.add_marker(pytest.mark.skip(reason=missing))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama (``tiny_llama.build``), built once per session."""
    from tiny_llama import build

    return build(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def prompts() -> list[str]:
    from tiny_llama import PROMPTS

    return list(PROMPTS)


@pytest.fixture(scope="session")
def engine_tp2(tiny_model: Path) -> Iterator[Any]:
    """Our executor at TP=2, eager; its watchdog warns after 1 s (the stuck-worker test)."""
    from hwlaunch.integrations.vllm import LLM

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HWLAUNCH_RPC_WARN_AFTER", "1")
        patch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
        llm = LLM(str(tiny_model), tensor_parallel_size=2, **ENGINE)
    yield llm
    close(llm)


@pytest.fixture(scope="session")
def engine_tp1(tiny_model: Path) -> Iterator[Any]:
    """Our executor at TP=1, eager."""
    from hwlaunch.integrations.vllm import LLM

    llm = LLM(str(tiny_model), **ENGINE)
    yield llm
    close(llm)


@pytest.fixture(scope="session")
def own_executor_tokens(tiny_model: Path, prompts: list[str]) -> dict[int, list[list[int]]]:
    """vLLM's own ``mp`` executor's greedy tokens at TP 1 and 2 (a script of its own: vLLM's
    engine core and workers are processes it spawns)."""
    from vllm_scripts import run_script

    result = run_script("own_executor.py", str(tiny_model), timeout=600)
    return {int(tp): tokens for tp, tokens in result.json["tokens"].items()}
