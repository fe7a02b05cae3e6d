"""What the vLLM tests share besides fixtures: engine settings, greedy tokens, the executor."""

from __future__ import annotations

from typing import Any

# Engine settings every test uses: greedy tokens must be comparable between engines.
ENGINE = {"dtype": "float32", "max_model_len": 128, "seed": 0, "enforce_eager": True}
MAX_TOKENS = 16


def greedy() -> Any:
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def token_ids(llm: Any, prompts: list[str]) -> list[list[int]]:
    """Each prompt's greedy tokens, in prompt order."""
    outputs = llm.generate(prompts, greedy(), use_tqdm=False)
    return [list(out.outputs[0].token_ids) for out in outputs]


def executor_of(llm: Any) -> Any:
    """The engine's executor: the engine core runs in this process (``LLM()``)."""
    return llm.llm_engine.engine_core.engine_core.model_executor


def close(llm: Any) -> None:
    """End the engine and its workers now, not whenever the garbage collector runs."""
    llm.llm_engine.engine_core.shutdown()
