"""Executors differ by what their ExecutorSpec declares, never by their names.

Each test resolves with the rules alone (pure: no process starts) against executors registered
under names of their own, so a rule that compared names with "mp", "ray", "uni" or "external"
would give these executors nothing and fail here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import hwlaunch
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


# -- the conformance suites choose their checks the same way -----------------------------------

VENDOR = {
    spec.name: spec
    for spec in (
        executor("vendor-procs", start_method=True, restarts=True, rpc_channel=True),
        executor("vendor-inline", in_process=True, max_world_size=1),
        executor("vendor-actors", ray=True),
        executor("vendor-adopts", needs_launcher=True, in_process=True),
        executor("vendor-plain", max_nodes=1),
    )
}


def case_ids(cases: list[Any]) -> list[str]:
    return [case.id for case in cases]


def test_the_conformance_lifecycle_cases_follow_the_declared_capabilities() -> None:
    from hwlaunch.testing._capabilities import lifecycle_cases, ray_cases

    cases = lifecycle_cases(list(VENDOR), VENDOR, "TestVendor")
    assert case_ids(cases) == [  # in-process last: its worker may initialize the device here
        "vendor-procs-fork",
        "vendor-procs-spawn",
        "vendor-procs-forkserver",
        "vendor-plain",
        "vendor-inline",
    ]
    assert case_ids(ray_cases(list(VENDOR), VENDOR, "TestVendor")) == ["vendor-actors"]
    (none,) = lifecycle_cases(["vendor-actors"], VENDOR, "TestVendor")
    assert none.marks[0].kwargs["reason"] == (
        "no executor in TestVendor.executors starts workers without Ray or a launcher"
    )


def test_the_worker_contract_asks_of_each_executor_what_it_declares() -> None:
    from hwlaunch.testing._capabilities import own_processes, sets_binding, world_size_for

    cpu_spec = SPECS["cpu"]
    got = {
        name: (own_processes(spec), sets_binding(spec), world_size_for(spec, cpu_spec, 8))
        for name, spec in VENDOR.items()
    }
    assert got == {
        "vendor-procs": (True, True, 2),
        "vendor-inline": (False, False, 1),
        "vendor-actors": (True, False, 2),  # Ray sets the visibility variable in its actors
        "vendor-adopts": (False, False, 2),
        "vendor-plain": (True, True, 2),
    }


def test_no_code_compares_an_executor_with_a_built_in_name() -> None:
    """The rules name the built-ins only as the defaults they choose (planning/rules.py);
    everything else reads capabilities."""
    root = Path(hwlaunch.__file__).parent
    compared = re.compile(
        r"""(==|!=)\s*["'](uni|mp|ray|external)["']|["'](uni|mp|ray|external)["']\s*(==|!=)"""
    )
    found = [
        f"{path.relative_to(root)}:{number}: {line.strip()}"
        for path in sorted(root.rglob("*.py"))
        if "integrations" not in path.parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if compared.search(line)
    ]
    assert found == []
