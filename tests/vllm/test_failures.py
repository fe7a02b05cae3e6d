"""Failures end where users meet them: a killed worker, a killed driver, a stuck worker."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from vllm_engines import ENGINE, close, executor_of
from vllm_scripts import left_behind, start_script

sys.path.insert(0, str(Path(__file__).parent.parent))  # tests/: the shared process helpers
from processes import alive, kill_all, processes, wait_until

REPORT_WITHIN = 2.0  # seconds from a worker's death to the engine's error


def _tree(pids: list[int]) -> list[psutil.Process]:
    """The processes and all their descendants."""
    found = processes(pids)
    return found + [child for proc in found for child in proc.children(recursive=True)]


def _generate_until_stopped(llm: Any, stop: threading.Event, outcome: dict[str, Any]) -> None:
    from tiny_llama import PROMPTS
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)
    try:
        while not stop.is_set():
            llm.generate(PROMPTS * 8, params, use_tqdm=False)
    except BaseException as exc:
        outcome["error"], outcome["at"] = exc, time.monotonic()


def test_worker_killed_mid_generate_is_reported_naming_its_rank(tiny_model: Path) -> None:
    from hwlaunch.integrations.vllm import LLM

    llm = LLM(str(tiny_model), tensor_parallel_size=2, **ENGINE)
    executor = executor_of(llm)
    tree = _tree(executor.pids)
    ident = executor._segments
    failed = threading.Event()
    executor.register_failure_callback(failed.set)
    stop, outcome = threading.Event(), {}
    thread = threading.Thread(target=_generate_until_stopped, args=(llm, stop, outcome))
    try:
        thread.start()
        wait_until(llm.llm_engine.has_unfinished_requests, 60, "generate to begin")
        time.sleep(0.5)
        os.kill(executor.pids[1], signal.SIGKILL)
        killed = time.monotonic()
        thread.join(30)
        assert "error" in outcome, "generate went on after a worker was killed"
        error = outcome["error"]
        took = outcome["at"] - killed
        print(f"reported {took:.3f}s after the kill: {error}")
        assert took < REPORT_WITHIN, f"reported {took:.2f}s after the kill: {error!r}"
        assert "rank 1" in str(error), repr(error)
        assert type(error).__name__ == "WorkerDiedError", repr(error)
        assert failed.wait(REPORT_WITHIN), "the engine's failure callback was not called"
    finally:
        stop.set()
        close(llm)
        thread.join(30)
        leftovers = kill_all(tree)
    assert not leftovers, f"left running after the engine closed: {leftovers}"
    assert left_behind(ident) == []


def test_driver_killed_mid_generate_leaves_nothing_running(tiny_model: Path) -> None:
    driver = start_script("generate_forever.py", str(tiny_model), "2")
    tree: list[psutil.Process] = []
    try:
        assert driver.stdout is not None
        for line in driver.stdout:
            if line.startswith("{"):
                started = json.loads(line)
                tree = _tree(started["pids"])
            if line.startswith("generating") and tree:
                break
        else:
            pytest.fail(
                f"the driver ended early:\n{driver.stderr.read()[-3000:] if driver.stderr else ''}"
            )
        time.sleep(1.0)  # inside generate
        driver.kill()
        driver.wait(10)
        # each worker runs its own shutdown within the plan's grace (5 s), then SIGTERM and
        # SIGKILL 2 s later: 15 s is well past that
        took = wait_until(lambda: not alive(tree), 15, "the engine's workers to exit")
        print(f"workers gone {took:.2f}s after the driver's SIGKILL")
        assert left_behind(started["ident"]) == []
    finally:
        driver.kill()
        leftovers = kill_all(tree)
        driver.wait(10)
    assert not leftovers


def _stall_on_rank_1(worker: Any, seconds: float) -> int:
    if worker.rpc_rank == 1:
        time.sleep(seconds)
    return int(worker.rpc_rank)


def test_stuck_worker_is_named_with_its_stack(
    engine_tp2: Any, caplog: pytest.LogCaptureFixture
) -> None:
    executor = executor_of(engine_tp2)
    assert executor.plan.rpc_warn_after == 1.0
    with caplog.at_level(logging.WARNING, logger="hwlaunch"):
        assert executor.collective_rpc(_stall_on_rank_1, args=(2.5,)) == [0, 1]
    warnings = [r.getMessage() for r in caplog.records if "has waited" in r.getMessage()]
    assert warnings, caplog.text
    assert "for ranks [1]" in warnings[0], warnings[0]
    assert "_stall_on_rank_1" in warnings[0] and "time.sleep" in warnings[0], warnings[0]
