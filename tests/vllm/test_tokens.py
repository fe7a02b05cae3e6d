"""Same tokens as vLLM's own executor: greedy outputs at TP 1 and 2, on the same model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_engines import ENGINE, close, executor_of, token_ids
from vllm_scripts import run_script


def test_tp1_tokens_equal_vllms_own_executor(
    engine_tp1: Any, prompts: list[str], own_executor_tokens: dict[int, list[list[int]]]
) -> None:
    assert token_ids(engine_tp1, prompts) == own_executor_tokens[1]


def test_tp2_tokens_equal_vllms_own_executor(
    engine_tp2: Any, prompts: list[str], own_executor_tokens: dict[int, list[list[int]]]
) -> None:
    assert token_ids(engine_tp2, prompts) == own_executor_tokens[2]


def test_the_engine_runs_on_hwlaunchs_workers_by_its_plan(engine_tp2: Any) -> None:
    import hwlaunch
    from hwlaunch.integrations.vllm import HwlaunchExecutor

    executor = executor_of(engine_tp2)
    assert isinstance(executor, HwlaunchExecutor)
    assert isinstance(engine_tp2.plan, hwlaunch.Plan)
    assert executor.plan is engine_tp2.plan
    plan = engine_tp2.plan
    assert (plan.backend, plan.world_size, plan.executor) == ("cpu", 2, "mp")
    # fork, or (threads running here: tokenizers', tqdm's) forkserver, by hwlaunch's rules
    assert plan.start_method in ("fork", "forkserver"), plan.explain()
    assert plan.decision("start_method").reason
    assert len(executor.pids) == 2
    # every rank runs the call; the output rank's result alone comes back with unique_reply_rank
    assert executor.collective_rpc(_rank) == [0, 1]
    assert executor.collective_rpc(_rank, None, (), None, False, 1) == 1
    future = executor.collective_rpc(_rank, non_block=True)
    assert future.result(timeout=30) == [0, 1]
    executor.check_health()


def _rank(worker: Any) -> int:
    return int(worker.rpc_rank)


def test_vllms_own_llm_takes_the_executor_by_its_dotted_name(
    tiny_model: Path, own_executor_tokens: dict[int, list[list[int]]]
) -> None:
    finished = run_script("dotted_name.py", str(tiny_model))
    assert finished.json["tokens"] == own_executor_tokens[2]
    assert "hwlaunch plan for vLLM's workers" in finished.stderr + finished.stdout


def test_with_a_kv_connector_the_aggregated_outputs_give_the_same_tokens(
    tiny_model: Path,
    tmp_path: Path,
    prompts: list[str],
    own_executor_tokens: dict[int, list[list[int]]],
) -> None:
    """A KV connector (vLLM's ExampleConnector, on disk) makes the engine merge every rank's
    outputs of a step through its KV output aggregator: the step's non-blocking Future is then
    the aggregator's, read through the call it merges. Greedy tokens stay vLLM's."""
    from vllm.config import KVTransferConfig

    from hwlaunch.integrations.vllm import LLM

    connector = KVTransferConfig(
        kv_connector="ExampleConnector",
        kv_role="kv_both",
        kv_connector_extra_config={"shared_storage_path": str(tmp_path / "kv")},
    )
    llm = LLM(str(tiny_model), tensor_parallel_size=2, kv_transfer_config=connector, **ENGINE)
    try:
        assert executor_of(llm).kv_output_aggregator is not None
        assert token_ids(llm, prompts) == own_executor_tokens[2]
        assert token_ids(llm, prompts) == own_executor_tokens[2]  # now from the stored KV too
    finally:
        close(llm)
