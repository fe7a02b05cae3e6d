"""The resolver's rules, table-driven: the pure ``decide()`` on facts built directly, and the
public ``hwlaunch.resolve(..., assume=...)`` on assumed facts, for every built-in backend."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hwlaunch
from hwlaunch import (
    BackendSpec,
    BackendUnavailableError,
    ConfigError,
    HwlaunchError,
    MissingMainGuardError,
    Plan,
    StartMethodError,
)
from hwlaunch.planning.facts import MAIN_GUARD_VALUES
from hwlaunch.planning.rules import decide
from hwlaunch.planning.settings import Overrides, Sourced
from hwlaunch.plugins import cpu, cuda, hpu, xpu
from hwlaunch.runtime_facts import (
    REIMPORT_UNSAFE,
    DeviceFacts,
    Limit,
    MainGuard,
    Room,
    RuntimeFacts,
    ThreadFacts,
    ThreadInfo,
)

pytestmark = pytest.mark.usefixtures("clean_env")

ALL_METHODS = ("fork", "spawn", "forkserver")
FLAG = {
    "backend": "--backend",
    "world_size": "--world-size",
    "nnodes": "--nnodes",
    "executor": "--executor",
    "start_method": "--start-method",
    "rpc_channel": "--rpc-channel",
}


def builtin_specs() -> dict[str, BackendSpec]:
    """The built-in plugins' specs, registered by calling their hooks (no entry points)."""
    specs: dict[str, BackendSpec] = {}
    for plugin in (cpu, cuda, hpu, xpu):
        plugin.hwlaunch_register_backends(register=lambda spec: specs.setdefault(spec.name, spec))
    return specs


SPECS = builtin_specs()
XPU_COMM = SPECS["xpu"].dist_backend


def make_facts(
    devices: dict[str, tuple[int, bool]] | None = None,
    *,
    main_guard: str = "guarded",
    start_methods: tuple[str, ...] = ALL_METHODS,
    daemonic: bool = False,
    in_ray_actor: bool = False,
) -> RuntimeFacts:
    """Facts with cpu available (8 cores) and each of ``devices`` as name -> (count, initialized)."""
    devices = devices or {}
    table = {name: DeviceFacts(False, 0, False) for name in SPECS}
    table["cpu"] = DeviceFacts(True, 8, False)
    for name, (count, initialized) in devices.items():
        table[name] = DeviceFacts(count > 0, count, initialized)
    guard = (
        MainGuard("unguarded", file="/work/train.py", line=7)
        if main_guard == "unguarded"
        else MainGuard(main_guard)  # type: ignore[arg-type]
    )
    return RuntimeFacts(
        os_start_methods=start_methods,
        devices=table,
        main_guard=guard,
        daemonic=daemonic,
        in_ray_actor=in_ray_actor,
    )


def flags(**values: Any) -> Overrides:
    """Overrides as if given on the command line."""
    return Overrides(explicit={k: Sourced(v, FLAG[k]) for k, v in values.items()})


@dataclass
class Row:
    id: str
    facts: RuntimeFacts
    overrides: Overrides
    expect: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()  # each a substring of some warning; () means no warning


ROWS = [
    # -- cpu ---------------------------------------------------------------------------------
    Row(
        "cpu default: fork where the OS offers it",
        make_facts(),
        flags(world_size=2),
        {
            "backend": "cpu",
            "executor": "mp",
            "start_method": "fork",
            "dist_backend": "gloo",
            "device_control_env_var": None,
            "ray_resource": "CPU",
            "worker": "hwlaunch.plugins.cpu.worker:CPUWorker",
        },
        {"backend": "auto-detected", "start_method": "rule of backend cpu"},
    ),
    Row(
        "cpu: spawn when the OS offers only spawn",
        make_facts(start_methods=("spawn",)),
        flags(world_size=2),
        {"backend": "cpu", "executor": "mp", "start_method": "spawn"},
        {"start_method": "rule of backend cpu"},
    ),
    Row(
        "cpu: world size 1 runs in-process, no start method",
        make_facts(),
        Overrides(),
        {"backend": "cpu", "world_size": 1, "nnodes": 1, "executor": "uni", "start_method": None},
        {"world_size": "built-in default", "executor": "rule"},
    ),
    Row(
        "cpu: explicit forkserver preloads the worker module",
        make_facts(),
        flags(world_size=2, start_method="forkserver"),
        {"start_method": "forkserver", "preload": ("torch", "hwlaunch.plugins.cpu.worker")},
        {"start_method": "--start-method"},
    ),
    Row(
        "cpu: unguarded main keeps the default fork without a warning",
        make_facts(main_guard="unguarded"),
        flags(world_size=2),
        {"start_method": "fork"},
    ),
    # -- cuda --------------------------------------------------------------------------------
    Row(
        "cuda default: fork, nccl, CUDA_VISIBLE_DEVICES, GPU",
        make_facts({"cuda": (2, False)}),
        flags(world_size=2),
        {
            "backend": "cuda",
            "executor": "mp",
            "start_method": "fork",
            "dist_backend": "nccl",
            "device_control_env_var": "CUDA_VISIBLE_DEVICES",
            "ray_resource": "GPU",
            "worker": "hwlaunch.plugins.cuda.worker:CUDAWorker",
        },
        {
            "backend": "auto-detected",
            "start_method": "rule of backend cuda",
            "dist_backend": "rule of backend cuda",
            "device_control_env_var": "rule of backend cuda",
            "ray_resource": "rule of backend cuda",
        },
    ),
    Row(
        "cuda initialized: fork is unsafe, fall back to forkserver with a warning saying why",
        make_facts({"cuda": (2, True)}),
        flags(world_size=2),
        {"start_method": "forkserver", "preload": ("torch", "hwlaunch.plugins.cuda.worker")},
        {"start_method": "fact: cuda.initialized"},
        ("instead of fork: cuda is already initialized",),
    ),
    Row(
        "cuda: explicit spawn is honoured",
        make_facts({"cuda": (2, False)}),
        flags(world_size=2, start_method="spawn"),
        {"start_method": "spawn"},
        {"start_method": "--start-method"},
    ),
    Row(
        "cuda inside a Ray actor: fork is unsafe, fall back to forkserver",
        make_facts({"cuda": (2, False)}, in_ray_actor=True),
        flags(world_size=2),
        {"start_method": "forkserver"},
        {"start_method": "fact: in_ray_actor"},
        ("Ray actor",),
    ),
    Row(
        "cuda inside a Ray actor: an explicit fork is honoured with a warning",
        make_facts({"cuda": (2, False)}, in_ray_actor=True),
        flags(world_size=2, start_method="fork"),
        {"start_method": "fork"},
        {"start_method": "--start-method"},
        ("fork was requested (--start-method) although this process is a Ray actor",),
    ),
    Row(
        "cuda: world size above the local device count goes to Ray",
        make_facts({"cuda": (2, False)}),
        flags(world_size=4),
        {"executor": "ray", "start_method": None, "ray_resource": "GPU"},
        {"executor": "fact: cuda.device_count"},
    ),
    # -- hpu ---------------------------------------------------------------------------------
    Row(
        "hpu default: spawn, hccl, HABANA_VISIBLE_MODULES, HPU",
        make_facts({"hpu": (8, False)}),
        flags(world_size=8),
        {
            "backend": "hpu",
            "executor": "mp",
            "start_method": "spawn",
            "dist_backend": "hccl",
            "device_control_env_var": "HABANA_VISIBLE_MODULES",
            "ray_resource": "HPU",
            "worker": "hwlaunch.plugins.hpu.worker:HPUWorker",
        },
        {"start_method": "rule of backend hpu"},
    ),
    Row(
        "hpu: explicit fork is honoured with the hang-at-exit warning",
        make_facts({"hpu": (8, False)}),
        flags(world_size=2, start_method="fork"),
        {"start_method": "fork"},
        {"start_method": "--start-method"},
        ("hang at",),
    ),
    Row(
        "hpu unguarded: the rule's spawn becomes fork, with a warning naming file:line",
        make_facts({"hpu": (8, False)}, main_guard="unguarded"),
        flags(world_size=2),
        {"start_method": "fork"},
        {"start_method": "fact: main_guard"},
        ("/work/train.py:7 starts workers at module level", "using fork instead", "hang at"),
    ),
    # -- xpu ---------------------------------------------------------------------------------
    Row(
        "xpu default: spawn, ZE_AFFINITY_MASK, GPU",
        make_facts({"xpu": (4, False)}),
        flags(world_size=4),
        {
            "backend": "xpu",
            "executor": "mp",
            "start_method": "spawn",
            "dist_backend": XPU_COMM,
            "device_control_env_var": "ZE_AFFINITY_MASK",
            "ray_resource": "GPU",
            "worker": "hwlaunch.plugins.xpu.worker:XPUWorker",
        },
        {"start_method": "rule of backend xpu"},
    ),
    Row(
        "xpu from a REPL (no main file): spawn is fine, nothing to re-import",
        make_facts({"xpu": (2, False)}, main_guard="no-main-file"),
        flags(world_size=2),
        {"start_method": "spawn"},
    ),
    Row(
        "hpu when the main cannot be analysed: fork, which re-imports nothing",
        make_facts({"hpu": (2, False)}, main_guard="unknown"),
        flags(world_size=2),
        {"start_method": "fork"},
        {"start_method": "fact: main_guard"},
        ("cannot read what that re-run does", "using fork instead"),
    ),
    Row(
        "cpu with code read from stdin: the default fork, nothing to refuse",
        make_facts(main_guard="not-reimportable"),
        flags(world_size=2),
        {"start_method": "fork"},
    ),
    # -- backend choice ----------------------------------------------------------------------
    Row(
        "auto-detection takes the highest priority available: cuda over hpu over xpu",
        make_facts({"cuda": (1, False), "hpu": (1, False), "xpu": (1, False)}),
        Overrides(),
        {"backend": "cuda"},
        {"backend": "auto-detected"},
    ),
    Row(
        "auto-detection: hpu over xpu",
        make_facts({"hpu": (1, False), "xpu": (1, False)}),
        Overrides(),
        {"backend": "hpu"},
    ),
    Row(
        "an explicit backend beats priority",
        make_facts({"cuda": (1, False)}),
        flags(backend="cpu", world_size=2),
        {"backend": "cpu", "start_method": "fork"},
        {"backend": "--backend"},
    ),
    # -- executor ----------------------------------------------------------------------------
    Row(
        "more than one node means Ray",
        make_facts(),
        flags(world_size=4, nnodes=2),
        {"executor": "ray", "nnodes": 2, "start_method": None},
        {"executor": "nnodes (from --nnodes)", "nnodes": "--nnodes"},
    ),
    Row(
        "cpu world size beyond the core count still fits one node (cpu is no accelerator)",
        make_facts(),
        flags(world_size=64),
        {"executor": "mp"},
    ),
    Row(
        "explicit ray: a start method is ignored, with a warning",
        make_facts(),
        flags(world_size=2, executor="ray", start_method="spawn"),
        {"executor": "ray", "start_method": None},
        {"executor": "--executor"},
        ("start method 'spawn' from --start-method is ignored: the ray executor",),
    ),
    Row(
        "explicit uni: a start method is ignored, with a warning",
        make_facts(),
        flags(executor="uni", start_method="fork"),
        {"executor": "uni", "start_method": None},
        {},
        ("start method 'fork' from --start-method is ignored: the uni executor",),
    ),
    Row(
        "a daemonic process may still run the in-process executor",
        make_facts(daemonic=True),
        Overrides(),
        {"executor": "uni"},
    ),
    Row(
        "a daemonic process may still use Ray",
        make_facts(daemonic=True),
        flags(world_size=2, executor="ray"),
        {"executor": "ray"},
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_decide_rules(row: Row) -> None:
    plan = decide(SPECS, row.facts, row.overrides)
    for attr, value in row.expect.items():
        assert getattr(plan, attr) == value, attr
    for setting, source in row.sources.items():
        assert plan.decision(setting).source == source, setting
    if row.warnings:
        for expected in row.warnings:
            assert any(expected in w for w in plan.warnings), (expected, plan.warnings)
    else:
        assert plan.warnings == ()


@dataclass
class Bad:
    id: str
    facts: RuntimeFacts
    overrides: Overrides
    error: type[HwlaunchError]
    text: tuple[str, ...]


BAD = [
    Bad(
        "xpu: fork is not allowed by the rule",
        make_facts({"xpu": (2, False)}),
        flags(world_size=2, start_method="fork"),
        StartMethodError,
        ("'fork' from --start-method", "rule of backend xpu", "allows only spawn"),
    ),
    Bad(
        "xpu: forkserver is not allowed by the rule",
        make_facts({"xpu": (2, False)}),
        flags(world_size=2, start_method="forkserver"),
        StartMethodError,
        ("'forkserver'", "rule of backend xpu", "allows only spawn"),
    ),
    Bad(
        "cuda initialized: an explicit fork cannot work",
        make_facts({"cuda": (2, True)}),
        flags(world_size=2, start_method="fork"),
        StartMethodError,
        (
            "'fork' from --start-method cannot work",
            "cuda is already initialized",
            "Cannot re-initialize CUDA in forked subprocess",
            "Fix: use start method 'forkserver'",
        ),
    ),
    Bad(
        "a method the OS does not offer",
        make_facts(start_methods=("spawn",)),
        flags(world_size=2, start_method="fork"),
        StartMethodError,
        ("'fork' from --start-method is not offered by this OS", "offered: spawn"),
    ),
    Bad(
        "xpu where the OS offers no spawn",
        make_facts({"xpu": (2, False)}, start_methods=("fork",)),
        flags(world_size=2),
        StartMethodError,
        ("backend xpu allows spawn, but this OS offers only fork",),
    ),
    Bad(
        "explicit uni with world size > 1",
        make_facts(),
        flags(world_size=2, executor="uni"),
        ConfigError,
        ("executor 'uni' from --executor", "world_size is 2 (from --world-size)", "Fix"),
    ),
    Bad(
        "explicit mp with more than one node",
        make_facts(),
        flags(world_size=4, nnodes=2, executor="mp"),
        ConfigError,
        ("executor 'mp' from --executor runs on one node", "nnodes is 2", "use executor 'ray'"),
    ),
    Bad(
        "explicit uni with more than one node",
        make_facts(),
        flags(world_size=2, nnodes=2, executor="uni"),
        ConfigError,
        ("executor 'uni'",),
    ),
    Bad(
        "nnodes above world size",
        make_facts(),
        flags(world_size=2, nnodes=3),
        ConfigError,
        ("nnodes 3 (from --nnodes) exceeds world_size 2 (from --world-size)",),
    ),
    Bad(
        "explicit mp with more workers than local accelerators",
        make_facts({"cuda": (2, False)}),
        flags(world_size=4, executor="mp"),
        ConfigError,
        ("exceeds the 2 local devices", "use executor 'ray' or world_size <= 2"),
    ),
    Bad(
        "explicit spawn with an unguarded main",
        make_facts(main_guard="unguarded"),
        flags(world_size=2, start_method="spawn"),
        MissingMainGuardError,
        (
            "/work/train.py:7",
            "(from --start-method)",
            'if __name__ == "__main__":',
            "or use start method 'fork'",
        ),
    ),
    Bad(
        "explicit forkserver with an unguarded main",
        make_facts({"cuda": (2, False)}, main_guard="unguarded"),
        flags(world_size=2, start_method="forkserver"),
        MissingMainGuardError,
        ("'forkserver' (from --start-method)",),
    ),
    Bad(
        "xpu with an unguarded main: no fork to fall back to",
        make_facts({"xpu": (2, False)}, main_guard="unguarded"),
        flags(world_size=2),
        MissingMainGuardError,
        ("/work/train.py:7", "rule of backend xpu", "backend xpu does not allow it"),
    ),
    Bad(
        "cuda initialized with an unguarded main: fork is unsafe and forkserver needs the guard",
        make_facts({"cuda": (2, True)}, main_guard="unguarded"),
        flags(world_size=2),
        MissingMainGuardError,
        ("'forkserver' (from fact: cuda.initialized)", "cuda is already initialized"),
    ),
    Bad(
        "only spawn offered with an unguarded main",
        make_facts(main_guard="unguarded", start_methods=("spawn",)),
        flags(world_size=2),
        MissingMainGuardError,
        ("this OS does not offer it",),
    ),
    Bad(
        "xpu when the main cannot be analysed: no fork to fall back to",
        make_facts({"xpu": (2, False)}, main_guard="unknown"),
        flags(world_size=2),
        MissingMainGuardError,
        ("cannot read what that re-run does", "backend xpu does not allow it", "run that file"),
    ),
    Bad(
        "explicit spawn with code read from stdin",
        make_facts(main_guard="not-reimportable"),
        flags(world_size=2, start_method="spawn"),
        MissingMainGuardError,
        ("which it cannot read", "(from --start-method)", "or use start method 'fork'"),
    ),
    Bad(
        "a launch while a spawned child re-imports __main__, even with fork",
        make_facts(main_guard="reimporting"),
        flags(world_size=2, start_method="fork"),
        MissingMainGuardError,
        ("being re-imported by a spawned child",),
    ),
    Bad(
        "a launch while a spawned child re-imports __main__, even in-process",
        make_facts(main_guard="reimporting"),
        flags(world_size=1),
        MissingMainGuardError,
        ("being re-imported by a spawned child",),
    ),
    Bad(
        "world size 1 with a start method this OS does not offer",
        make_facts(start_methods=("spawn",)),
        flags(world_size=1, start_method="fork"),
        StartMethodError,
        ("'fork' from --start-method is not offered by this OS", "offered: spawn"),
    ),
    Bad(
        "a daemonic process cannot start mp workers",
        make_facts(daemonic=True),
        flags(world_size=2),
        StartMethodError,
        ("daemonic", "not allowed to have children", "daemon=False"),
    ),
    Bad(
        "an explicit backend that is not available",
        make_facts(),
        flags(backend="cuda"),
        BackendUnavailableError,
        ("backend 'cuda' from --backend is not available", "--assume cuda.available=true"),
    ),
    Bad(
        "an unknown backend name",
        make_facts(),
        flags(backend="cdua"),
        BackendUnavailableError,
        ("unknown backend 'cdua'", "did you mean 'cuda'", "from --backend"),
    ),
]


@pytest.mark.parametrize("bad", BAD, ids=[b.id for b in BAD])
def test_decide_errors(bad: Bad) -> None:
    with pytest.raises(HwlaunchError) as info:
        decide(SPECS, bad.facts, bad.overrides)
    assert type(info.value) is bad.error
    assert info.value.exit_code == 2
    for text in bad.text:
        assert text in str(info.value)


def test_no_backend_available_without_cpu_plugin() -> None:
    specs = {name: spec for name, spec in SPECS.items() if name != "cpu"}
    with pytest.raises(BackendUnavailableError, match="cpu plugin is not loaded"):
        decide(specs, make_facts(), Overrides())


def test_cpu_is_the_fallback_when_nothing_reports_available() -> None:
    facts = make_facts()
    facts = RuntimeFacts(
        **{**facts.__dict__, "devices": {n: DeviceFacts(False, 0, False) for n in SPECS}}
    )
    plan = decide(SPECS, facts, Overrides())
    assert plan.backend == "cpu"
    assert plan.decision("backend").source == "built-in default"


def test_plugin_problems_become_warnings() -> None:
    plan = decide(SPECS, make_facts(), Overrides(), ["plugin 'npu' failed to load: boom"])
    assert plan.warnings == ("plugin 'npu' failed to load: boom",)


# -- the same rows through the public resolve(..., assume=...) ----------------------------------
NOTHING = {"cuda.available": False, "hpu.available": False, "xpu.available": False}
# Only the states a row names: neither this process's daemon flag, Ray, nor its threads (pytest's own).
GUARDED = {"main_guard": "guarded", "daemonic": False, "in_ray_actor": False, "threads": "none"}


@pytest.mark.parametrize(
    ("kwargs", "assume", "expect"),
    [
        pytest.param(
            {"world_size": 2},
            {**NOTHING, "start_methods": "fork,spawn,forkserver"},
            {"backend": "cpu", "executor": "mp", "start_method": "fork", "dist_backend": "gloo"},
            id="cpu-fork",
        ),
        pytest.param(
            {"world_size": 2},
            {**NOTHING, "start_methods": "spawn"},
            {"backend": "cpu", "start_method": "spawn"},
            id="cpu-spawn-only-os",
        ),
        pytest.param(
            {"world_size": 2},
            {"cuda.device_count": 2, "cuda.initialized": False},
            {
                "backend": "cuda",
                "start_method": "fork",
                "dist_backend": "nccl",
                "device_control_env_var": "CUDA_VISIBLE_DEVICES",
                "ray_resource": "GPU",
            },
            id="cuda-fork",
        ),
        pytest.param(
            {"world_size": 2},
            {"cuda.available": True, "cuda.device_count": 2, "cuda.initialized": True},
            {"backend": "cuda", "start_method": "forkserver"},
            id="cuda-initialized-forkserver",
        ),
        pytest.param(
            {"world_size": 4},
            {"cuda.available": True, "cuda.device_count": 2},
            {"backend": "cuda", "executor": "ray", "start_method": None},
            id="cuda-ray",
        ),
        pytest.param(
            {"backend": "hpu", "world_size": 2},
            {"hpu.available": True, "hpu.device_count": 8},
            {
                "start_method": "spawn",
                "dist_backend": "hccl",
                "device_control_env_var": "HABANA_VISIBLE_MODULES",
                "ray_resource": "HPU",
            },
            id="hpu-spawn",
        ),
        pytest.param(
            {"backend": "hpu", "world_size": 2, "start_method": "fork"},
            {"hpu.available": True, "hpu.device_count": 2},
            {"start_method": "fork"},
            id="hpu-explicit-fork",
        ),
        pytest.param(
            {"backend": "xpu", "world_size": 2},
            {"xpu.available": True, "xpu.device_count": 2},
            {
                "start_method": "spawn",
                "dist_backend": XPU_COMM,
                "device_control_env_var": "ZE_AFFINITY_MASK",
                "ray_resource": "GPU",
            },
            id="xpu-spawn",
        ),
    ],
)
def test_resolve_rows_with_assumed_facts(
    kwargs: dict[str, Any], assume: dict[str, object], expect: dict[str, Any]
) -> None:
    plan = hwlaunch.resolve(**kwargs, assume={**GUARDED, **assume})
    for attr, value in expect.items():
        assert getattr(plan, attr) == value, attr
    assert plan.facts is not None
    assert set(assume) <= plan.facts.assumed


def test_resolve_cuda_world_size_above_device_count_explains_ray() -> None:
    plan = hwlaunch.resolve(
        world_size=4, assume={**GUARDED, "cuda.available": True, "cuda.device_count": 2}
    )
    executor = plan.decision("executor")
    assert (plan.executor, executor.source) == ("ray", "fact: cuda.device_count (assumed)")
    assert "world size 4 exceeds the 2 local cuda devices (assumed)" in executor.reason


def test_resolve_cuda_initialized_warns_why() -> None:
    plan = hwlaunch.resolve(
        world_size=2, assume={**GUARDED, "cuda.initialized": True, "cuda.device_count": 2}
    )
    assert plan.start_method == "forkserver"
    assert plan.decision("start_method").source == "fact: cuda.initialized (assumed)"
    assert any("cuda is already initialized in this process (assumed)" in w for w in plan.warnings)


def test_resolve_hpu_explicit_fork_warns_hang() -> None:
    plan = hwlaunch.resolve(
        backend="hpu", world_size=2, start_method="fork", assume={**GUARDED, "hpu.device_count": 2}
    )
    assert plan.start_method == "fork"
    assert any("hang at" in w and "HPU" in w for w in plan.warnings)


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_resolve_xpu_rejects_non_spawn(method: str) -> None:
    with pytest.raises(StartMethodError, match="rule of backend xpu, which allows only spawn"):
        hwlaunch.resolve(
            backend="xpu", world_size=2, start_method=method, assume={"xpu.device_count": 2}
        )


def test_resolve_cuda_initialized_explicit_fork_fails() -> None:
    with pytest.raises(StartMethodError, match=r"cannot work: cuda is already initialized"):
        hwlaunch.resolve(
            world_size=2,
            start_method="fork",
            assume={"cuda.initialized": "yes", "cuda.device_count": "2"},
        )


def test_resolve_unguarded_kwargs_names_the_argument() -> None:
    with pytest.raises(MissingMainGuardError, match=r"from resolve\(start_method=\)"):
        hwlaunch.resolve(
            world_size=2, start_method="spawn", assume={**NOTHING, "main_guard": "unguarded"}
        )


def test_resolve_unguarded_hpu_rule_chooses_fork() -> None:
    plan = hwlaunch.resolve(
        backend="hpu", world_size=2, assume={"hpu.device_count": 2, "main_guard": "unguarded"}
    )
    assert plan.start_method == "fork"
    assert plan.decision("start_method").source == "fact: main_guard (assumed)"
    assert any("outside an `if __name__" in w for w in plan.warnings)


def test_resolve_in_ray_actor_falls_back() -> None:
    plan = hwlaunch.resolve(world_size=2, assume={**NOTHING, **GUARDED, "in_ray_actor": 1})
    assert (plan.backend, plan.start_method) == ("cpu", "forkserver")
    assert plan.decision("start_method").source == "fact: in_ray_actor (assumed)"


def test_resolve_daemonic() -> None:
    with pytest.raises(StartMethodError, match="daemonic"):
        hwlaunch.resolve(world_size=2, assume={**NOTHING, "daemonic": True})
    assert hwlaunch.resolve(assume={**NOTHING, "daemonic": True}).executor == "uni"


def test_resolve_is_pure() -> None:
    """No environment write, no global start method, no child process."""
    before = dict(os.environ)
    method = multiprocessing.get_start_method(allow_none=True)
    children = multiprocessing.active_children()
    hwlaunch.resolve(world_size=2, start_method="spawn", assume={**GUARDED, **NOTHING})
    hwlaunch.resolve(world_size=4, assume={"cuda.device_count": 2})
    assert dict(os.environ) == before
    assert multiprocessing.get_start_method(allow_none=True) == method
    assert multiprocessing.active_children() == children


# -- Plan: to_dict and explain --------------------------------------------------------------
PLAN_KEYS = {
    "backend",
    "world_size",
    "nnodes",
    "executor",
    "start_method",
    "dist_backend",
    "worker",
    "env",
    "decisions",
    "warnings",
}


def test_plan_to_dict_is_json_with_documented_keys() -> None:
    plan = hwlaunch.resolve(
        world_size=2, assume={"cuda.initialized": True, "cuda.device_count": 2, **GUARDED}
    )
    data = json.loads(json.dumps(plan.to_dict()))
    assert set(data) >= PLAN_KEYS
    assert data["backend"] == "cuda"
    assert data["start_method"] == "forkserver"
    assert data["warnings"] == list(plan.warnings) != []
    assert [d["setting"] for d in data["decisions"]][:5] == [
        "backend",
        "world_size",
        "nnodes",
        "executor",
        "start_method",
    ]
    for decision in data["decisions"]:
        assert set(decision) == {"setting", "value", "source", "reason"}
        assert decision["source"] and decision["reason"]
    assert "cuda.initialized" in data["facts"]["assumed"]


def test_plan_explain_mentions_every_decision_and_warning() -> None:
    plan = hwlaunch.resolve(
        world_size=4, nnodes=2, start_method="spawn", assume={"cuda.device_count": 2}
    )
    text = plan.explain(width=400)
    for decision in plan.decisions:
        assert decision.setting in text
        assert decision.source in text
    assert plan.warnings
    for warning in plan.warnings:
        assert f"warning: {warning}" in " ".join(text.split())
    assert "assumed facts: cuda.available, cuda.device_count" in text
    assert "(assumed)" in text


def test_plan_pickles_and_compares() -> None:
    import pickle

    plan = hwlaunch.resolve(world_size=2, assume={**NOTHING, **GUARDED})
    assert pickle.loads(pickle.dumps(plan)) == plan


def test_assumed_facts_marked_only_when_assumed() -> None:
    plan = hwlaunch.resolve(world_size=2, assume={**NOTHING, **GUARDED})
    assert "(assumed)" not in plan.decision("start_method").source
    assert "(assumed)" not in plan.decision("backend").reason


# -- any facts, any overrides: a consistent plan or a user error ------------------------------
_device = st.tuples(st.integers(0, 4), st.booleans())
_facts = st.builds(
    make_facts,
    st.fixed_dictionaries({"cuda": _device, "hpu": _device, "xpu": _device}),
    main_guard=st.sampled_from(MAIN_GUARD_VALUES),
    start_methods=st.sampled_from([ALL_METHODS, ("spawn",), ("fork", "spawn"), ("spawn", "fork")]),
    daemonic=st.booleans(),
    in_ray_actor=st.booleans(),
)
_flags = st.fixed_dictionaries(
    {},
    optional={
        "backend": st.sampled_from(list(SPECS)),
        "world_size": st.integers(1, 8),
        "nnodes": st.integers(1, 3),
        "executor": st.sampled_from(["uni", "mp", "ray"]),
        "start_method": st.sampled_from(ALL_METHODS),
    },
)


@settings(max_examples=300, deadline=None)
@given(facts=_facts, values=_flags)
def test_any_input_gives_a_safe_plan_or_a_user_error(
    facts: RuntimeFacts, values: dict[str, Any]
) -> None:
    try:
        plan = decide(SPECS, facts, flags(**values))
    except HwlaunchError as exc:
        assert exc.exit_code == 2
        return
    check_invariants(plan, facts, values)


def check_invariants(plan: Plan, facts: RuntimeFacts, values: dict[str, Any]) -> None:
    spec = SPECS[plan.backend]
    device = facts.devices[plan.backend]
    assert device.available
    assert facts.main_guard.status != "reimporting"
    assert plan.nnodes <= plan.world_size
    assert (plan.executor == "mp") == (plan.start_method is not None)
    if plan.nnodes > 1:
        assert plan.executor == "ray"
    if plan.world_size > 1:
        assert plan.executor != "uni"
    if plan.executor == "mp":
        assert not facts.daemonic
        assert plan.start_method in spec.start_methods.allowed
        assert plan.start_method in facts.os_start_methods
        if facts.main_guard.status in REIMPORT_UNSAFE:
            assert plan.start_method == "fork"
        if spec.start_methods.fork_unsafe_after_init and device.initialized:
            assert plan.start_method != "fork"
        if spec.is_accelerator:
            assert plan.world_size <= device.device_count
    for setting, value in values.items():
        if setting != "start_method" or plan.executor == "mp":
            assert plan.decision(setting).value == value
            assert plan.decision(setting).source == FLAG[setting]
    for decision in plan.decisions:
        assert decision.source and decision.reason
    for setting in DECIDED:
        assert plan.decision(setting).value == getattr(plan, setting), setting
    json.dumps(plan.to_dict())


# Every Plan field that is decided carries a decision with the same value.
DECIDED = (
    "backend",
    "world_size",
    "nnodes",
    "executor",
    "start_method",
    "dist_backend",
    "worker",
    "device_control_env_var",
    "ray_resource",
    "env",
)


@pytest.mark.parametrize("executor", ["uni", "ray"])
def test_disallowed_explicit_method_is_an_error_for_every_executor(executor: str) -> None:
    world = 1 if executor == "uni" else 2
    with pytest.raises(StartMethodError, match=r"'fork' from resolve\(start_method=\).*xpu"):
        hwlaunch.resolve(
            backend="xpu",
            executor=executor,
            world_size=world,
            start_method="fork",
            assume={"xpu.device_count": 2},
        )


def test_allowed_explicit_method_is_ignored_with_a_warning_outside_mp() -> None:
    plan = hwlaunch.resolve(backend="cpu", world_size=1, start_method="spawn")
    assert plan.executor == "uni"
    assert plan.start_method is None
    assert any("'spawn' from resolve(start_method=) is ignored" in w for w in plan.warnings)


def test_threads_summary_counts_native_threads_alike_whatever_their_names() -> None:
    """Ray leaves ten native threads of differing names (``gcs_client_io_s``,
    ``event_engine``, ...) in _raylet.so: one count, as the label shows no name; Python
    threads stay apart by name."""
    ray = [ThreadInfo(name, "native", "_raylet.so", "ray") for name in ("gcs", "ev", "ev", "tm")]
    python = [
        ThreadInfo("poller", "python"),
        ThreadInfo("poller", "python"),
        ThreadInfo("x", "python"),
    ]
    summary = ThreadFacts(others=(*ray, *python)).summary()
    assert summary == "7 threads: 4 native threads of ray (_raylet.so), 2 of 'poller', 'x'"


# -- room: the limits of this machine (planning.room) ----------------------------------------------
def test_a_world_size_beyond_the_room_left_is_refused_naming_the_limit() -> None:
    """The rule reads the probed limits: here the user's RLIMIT_NPROC, which root does not
    meet on the machine the suite runs on."""
    limit = Limit(10, "RLIMIT_NPROC of uid 1000 (ulimit -u: 100, 90 tasks in use)")
    facts = dataclasses.replace(make_facts(), room=Room(tasks=limit))
    plan = decide(SPECS, facts, flags(backend="cpu", world_size=3, executor="mp"))
    assert plan.world_size == 3  # 9 tasks of 10
    with pytest.raises(ConfigError) as caught:
        decide(SPECS, facts, flags(backend="cpu", world_size=4, executor="mp"))
    message = str(caught.value)
    assert message.startswith("world_size 4 (from --world-size) does not fit on this machine")
    assert "4 workers need 12 tasks (3 tasks each" in message
    assert "RLIMIT_NPROC of uid 1000 (ulimit -u: 100, 90 tasks in use) leaves 10 tasks" in message
    assert "Fix: world_size <= 3" in message


@pytest.mark.parametrize(
    ("room", "needs"),
    [
        (Room(fds=Limit(30, "RLIMIT_NOFILE")), "36 file descriptors"),
        (Room(memory=Limit(2**24, "MemAvailable")), "32 MiB of shared memory"),
    ],
)
def test_descriptors_and_the_channels_memory_are_counted_too(room: Room, needs: str) -> None:
    facts = dataclasses.replace(make_facts(), room=room)
    with pytest.raises(ConfigError, match=f"4 workers need {needs}"):
        decide(SPECS, facts, flags(backend="cpu", world_size=4, executor="mp"))


def test_room_is_not_asked_of_executors_that_start_no_local_process() -> None:
    facts = dataclasses.replace(make_facts(), room=Room(tasks=Limit(0, "pids.max")))
    assert decide(SPECS, facts, flags(backend="cpu", world_size=64, executor="ray")).nnodes == 1
    pipe = decide(
        SPECS,
        dataclasses.replace(make_facts(), room=Room(memory=Limit(0, "MemAvailable"))),
        flags(backend="cpu", world_size=4, executor="mp", rpc_channel="pipe"),
    )
    assert pipe.rpc_channel == "pipe"  # no shared memory to count
