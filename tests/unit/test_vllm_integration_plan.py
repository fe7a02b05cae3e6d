"""hwlaunch.integrations.vllm without vLLM: the package imports, the CPU sets, the plan's binding.

Why here, in the fast loop: the CPU binding is pure (facts in, a plan out), and the promise
that ``import hwlaunch`` and the integration's package import no vLLM is checked where vLLM
is not installed as well as where it is (tests/vllm).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import hwlaunch
from hwlaunch.integrations.vllm._binding import (
    BIND_VAR,
    binding_text,
    parse_binding,
    share_cpus,
)
from hwlaunch.integrations.vllm._plan import bind_cpus, resolve_for_vllm


def test_importing_the_integration_imports_no_vllm_and_no_torch() -> None:
    code = (
        "import sys, hwlaunch, hwlaunch.integrations.vllm as v\n"
        "from hwlaunch.integrations.vllm import _binding, _worker\n"
        "assert 'HwlaunchExecutor' in dir(v) and 'LLM' in dir(v)\n"
        "print(sorted(m for m in ('vllm', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_each_rank_gets_its_share_of_the_cpus_in_order() -> None:
    assert share_cpus([0, 1], 2, 1) == [[0], [1]]
    assert share_cpus([3, 1, 2, 0], 2, 2) == [[0, 1], [2, 3]]
    assert share_cpus([0, 1], 4, 1) == [[0], [1], [0], [1]]  # more ranks than CPUs: shared
    assert binding_text([[0, 1], [2, 3]]) == "0,1|2,3"


def test_a_binding_is_read_as_vllm_writes_it() -> None:
    assert parse_binding("0-2,7|3", 2, "env") == [[0, 1, 2, 7], [3]]
    assert parse_binding("nobind", 2, "env") is None


@pytest.mark.parametrize(
    ("text", "names"),
    [("0|1|2", "lists 3 CPU set(s) for 2 local rank(s)"), ("0|x", "'x' is not a list of CPU ids")],
)
def test_a_bad_binding_is_a_config_error_naming_it(text: str, names: str) -> None:
    with pytest.raises(hwlaunch.ConfigError) as raised:
        parse_binding(text, 2, f"env {BIND_VAR}")
    message = str(raised.value)
    assert names in message and f"{BIND_VAR}={text!r} (env {BIND_VAR})" in message
    assert "Fix:" in message


def _cpu_plan() -> hwlaunch.Plan:
    return hwlaunch.resolve(backend="cpu", world_size=2, executor="mp", cpu_threads=1)


def test_the_plan_carries_each_ranks_cpus_with_its_reason() -> None:
    plan = bind_cpus(_cpu_plan(), {}, allowed=[4, 5])
    assert plan.env[BIND_VAR] == "4|5"
    decision = plan.decision(BIND_VAR)
    assert decision.value == "4|5" and decision.source == "cpu_threads"
    assert BIND_VAR in plan.explain()


@pytest.mark.parametrize(
    ("world", "allowed", "expected"),
    [
        (1, [0, 1], "1"),  # one CPU left to the engine core, as vLLM's own binding leaves it
        (2, [0, 1], "0|1"),  # no CPU to spare: every CPU to a rank
        (2, [0, 1, 2, 3], "2|3"),
        (2, list(range(8)), "2,3,4|5,6,7"),
        (1, [7], "7"),
    ],
)
def test_the_ranks_leave_the_engine_core_a_cpu_each_where_there_is_one_to_spare(
    world: int, allowed: list[int], expected: str
) -> None:
    plan = hwlaunch.resolve(backend="cpu", world_size=world, executor="mp")
    bound = bind_cpus(plan, {}, allowed=allowed)
    assert bound.env[BIND_VAR] == expected
    assert "left to the engine core" in bound.decision(BIND_VAR).reason


def test_a_binding_the_user_set_wins_and_auto_is_hwlaunchs() -> None:
    plan = bind_cpus(_cpu_plan(), {BIND_VAR: "1|0"}, allowed=[0, 1])
    assert plan.env[BIND_VAR] == "1|0"
    assert plan.decision(BIND_VAR).source == f"env {BIND_VAR}"
    assert bind_cpus(_cpu_plan(), {BIND_VAR: "auto"}, allowed=[0, 1]).env[BIND_VAR] == "0|1"
    with pytest.raises(hwlaunch.ConfigError):
        bind_cpus(_cpu_plan(), {BIND_VAR: "0"}, allowed=[0, 1])


def test_a_platform_without_an_hwlaunch_backend_is_named() -> None:
    with pytest.raises(hwlaunch.BackendUnavailableError) as raised:
        resolve_for_vllm(2, backend="tpu")
    assert "vLLM runs on its platform 'tpu'" in str(raised.value)
    assert "unknown backend 'tpu'" in str(raised.value) and "Fix:" in str(raised.value)


def test_vllms_workers_get_processes_of_their_own_and_no_restarts() -> None:
    plan = resolve_for_vllm(1, backend="cpu")
    assert (plan.executor, plan.max_restarts, plan.world_size) == ("mp", 0, 1)


def test_the_segments_are_named_as_vllms_cpu_worker_names_them() -> None:
    from hwlaunch.integrations.vllm._shm import segments_ident

    assert segments_ident("file:///tmp/vllm_dist_ab12") == "vllm_dist_ab12"
    assert segments_ident("tcp://127.0.0.1:29500") == "29500"


def test_llm_refuses_another_executor_before_anything_starts() -> None:
    from hwlaunch.integrations.vllm import LLM

    with pytest.raises(ValueError, match=r"distributed_executor_backend='mp'.*Fix: leave it out"):
        LLM("some-model", distributed_executor_backend="mp")


def test_the_workers_poll_between_steps_unless_the_user_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HWLAUNCH_RPC_SPIN", raising=False)
    plan = resolve_for_vllm(2, backend="cpu")
    assert plan.rpc_spin == 0.05
    assert plan.decision("rpc_spin").source == "hwlaunch.integrations.vllm"
    assert "poll" in plan.decision("rpc_spin").reason
    monkeypatch.setenv("HWLAUNCH_RPC_SPIN", "0")
    plan = resolve_for_vllm(2, backend="cpu")
    assert plan.rpc_spin == 0.0 and plan.decision("rpc_spin").source == "env HWLAUNCH_RPC_SPIN"
