"""Executors differ by what their ExecutorSpec declares, never by their names.

Each test resolves with the rules alone (pure: no process starts) against executors registered
under names of their own, so a rule that compared names with "mp", "ray", "uni" or "external"
would give these executors nothing and fail here.
"""

from __future__ import annotations

from typing import Any

import pytest

from hwlaunch import ExecutorSpec, PluginError
from hwlaunch.planning.rules import decide
from hwlaunch.planning.settings import Overrides, Sourced
from hwlaunch.plugins import cpu
from hwlaunch.runtime_facts import DeviceFacts, MainGuard, RuntimeFacts

SPECS: dict[str, Any] = {}
cpu.hwlaunch_register_backends(register=lambda spec: SPECS.setdefault(spec.name, spec))
FACTS = RuntimeFacts(
    os_start_methods=("fork", "spawn", "forkserver"),
    devices={"cpu": DeviceFacts(True, 8, False)},
    main_guard=MainGuard("guarded"),
    daemonic=False,
    in_ray_actor=False,
)


def executor(name: str, **capabilities: Any) -> ExecutorSpec:
    return ExecutorSpec(name=name, executor="vendor_pkg.module:VendorExecutor", **capabilities)


def plan_with(spec: ExecutorSpec, **settings: Any) -> Any:
    values = {"executor": spec.name, "world_size": 2, **settings}
    overrides = Overrides(explicit={k: Sourced(v, f"--{k}") for k, v in values.items()})
    return decide(SPECS, FACTS, overrides, executors={spec.name: spec})


def decided(plan: Any) -> set[str]:
    return {d.setting for d in plan.decisions}


def test_an_executor_declaring_what_mp_declares_gets_what_mp_gets() -> None:
    procs = executor("vendor-procs", start_method=True, restarts=True, rpc_channel=True)
    plan = plan_with(procs, max_restarts=2, rpc_channel="pipe", start_method="spawn")
    assert (plan.start_method, plan.max_restarts, plan.rpc_channel) == ("spawn", 2, "pipe")
    assert {"rpc_channel", "start_method"} <= decided(plan)
    assert not plan.ranks_from_launcher
    assert plan.warnings == ()


def test_an_executor_declaring_nothing_gets_no_restarts_channel_or_start_method() -> None:
    plain = executor("vendor-plain")
    plan = plan_with(plain, max_restarts=2, start_method="spawn")
    assert (plan.start_method, plan.max_restarts) == (None, 0)
    assert "rpc_channel" not in decided(plan)
    assert (
        "max_restarts 2 (from --max_restarts) is not used: the vendor-plain executor does not "
        "restart worker groups" in plan.warnings
    )
    assert plan.decision("start_method").reason == "not used by the vendor-plain executor"


def test_an_executor_declaring_ray_gets_the_ray_settings() -> None:
    actors = executor("vendor-actors", ray=True, restarts=True)
    plan = plan_with(actors, ray_address="10.0.0.2:6379", max_restarts=1)
    assert (plan.ray_address, plan.max_restarts) == ("10.0.0.2:6379", 1)
    assert {"ray_address", "ray_pg_timeout"} <= decided(plan)
    assert plan.decision("start_method").reason == "not used: Ray starts the worker processes"
    assert "ray_address" not in decided(plan_with(executor("vendor-plain")))


def test_an_in_process_executor_is_told_why_it_cannot_restart() -> None:
    inline = executor("vendor-inline", in_process=True, max_world_size=1)
    plan = plan_with(inline, world_size=1, max_restarts=1)
    assert plan.max_restarts == 0
    assert any(
        "the vendor-inline executor runs the worker in this process, which a restart cannot "
        "replace" in warning
        for warning in plan.warnings
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"restarts": "yes"}, "invalid ExecutorSpec field 'restarts': 'yes' must be a bool"),
        ({"ray": 1}, "invalid ExecutorSpec field 'ray': 1 must be a bool"),
        (
            {"restarts": True, "in_process": True},
            "invalid ExecutorSpec field 'restarts': an in_process executor cannot restart",
        ),
    ],
)
def test_a_capability_that_cannot_hold_fails_the_spec(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(PluginError) as raised:
        executor("vendor-bad", **fields)
    assert message in str(raised.value)
