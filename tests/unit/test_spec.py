"""BackendSpec and StartMethodRule validation: a bad spec is rejected when it is built, with a
PluginError naming the field, so a plugin author learns at registration and not in a worker."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from hwlaunch import BackendSpec, PluginError, StartMethodRule


def rule(**changes: Any) -> StartMethodRule:
    fields: dict[str, Any] = {
        "allowed": ("fork", "spawn"),
        "default": "fork",
        "fork_unsafe_after_init": True,
        "fallback": "spawn",
    }
    return StartMethodRule(**{**fields, **changes})


def spec(**changes: Any) -> BackendSpec:
    fields: dict[str, Any] = {
        "name": "my-npu",
        "device_type": "npu",
        "priority": 50,
        "is_available": lambda: False,
        "device_count": lambda: 0,
        "is_initialized": lambda: False,
        "start_methods": StartMethodRule(allowed=("spawn",), default="spawn"),
        "dist_backend": "hccl",
        "worker": "my_npu.worker:NPUWorker",
        "device_control_env_var": "NPU_VISIBLE_DEVICES",
        "ray_resource": "NPU",
        "worker_env": {"NPU_LOG": "1"},
    }
    return BackendSpec(**{**fields, **changes})


def test_valid_spec_is_frozen_and_its_env_read_only() -> None:
    built = spec()
    assert built.is_accelerator
    assert not spec(device_type="cpu").is_accelerator
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        built.worker_env["X"] = "1"  # type: ignore[index]


def test_worker_env_is_copied() -> None:
    env = {"A": "1"}
    built = spec(worker_env=env)
    env["A"] = "2"
    assert dict(built.worker_env) == {"A": "1"}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": "CUDA"}, "name"),
        ({"name": "my npu"}, "name"),
        ({"name": 3}, "name"),
        ({"device_type": ""}, "device_type"),
        ({"priority": "10"}, "priority"),
        ({"priority": True}, "priority"),
        ({"is_available": True}, "is_available"),
        ({"device_count": 2}, "device_count"),
        ({"is_initialized": None}, "is_initialized"),
        ({"start_methods": ("spawn",)}, "start_methods"),
        ({"dist_backend": ""}, "dist_backend"),
        ({"worker": "my_npu.worker.NPUWorker"}, "worker"),
        ({"worker": object}, "worker"),
        ({"device_control_env_var": "NPU-VISIBLE"}, "device_control_env_var"),
        ({"ray_resource": ""}, "ray_resource"),
        ({"worker_env": {"A": 1}}, "worker_env"),
        ({"worker_env": {"1A": "x"}}, "worker_env"),
        ({"worker_env": [("A", "1")]}, "worker_env"),
        ({"worker_env": {"A": "x\0y"}}, "worker_env"),
    ],
)
def test_bad_spec_field_is_named(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(PluginError, match=rf"invalid BackendSpec field '{field}':"):
        spec(**changes)


@pytest.mark.parametrize(
    ("changes", "field", "text"),
    [
        ({"allowed": ()}, "start_methods.allowed", "non-empty tuple"),
        ({"allowed": ["fork", "spawn"]}, "start_methods.allowed", "non-empty tuple"),
        ({"allowed": ("fork", "vfork")}, "start_methods.allowed", "'vfork' is not a start method"),
        ({"allowed": ("fork", "fork")}, "start_methods.allowed", "duplicate"),
        ({"default": "forkserver"}, "start_methods.default", "not among allowed"),
        ({"default": "thread"}, "start_methods.default", "'thread' is not a start method"),
        ({"fallback": "fork"}, "start_methods.fallback", "must be a non-fork method"),
        ({"fallback": "forkserver"}, "start_methods.fallback", "among allowed"),
        ({"fallback": None}, "start_methods.fallback", "required when fork_unsafe_after_init"),
        ({"fork_unsafe_after_init": "yes"}, "start_methods.fork_unsafe_after_init", "bool"),
        ({"fork_warning": 3}, "start_methods.fork_warning", "string"),
        ({"preload": ["torch"]}, "start_methods.preload", "tuple of module names"),
        ({"preload": ("",)}, "start_methods.preload", "tuple of module names"),
    ],
)
def test_bad_start_method_rule_is_named(changes: dict[str, Any], field: str, text: str) -> None:
    with pytest.raises(PluginError) as info:
        rule(**changes)
    assert f"invalid BackendSpec field {field!r}:" in str(info.value)
    assert text in str(info.value)


def test_rule_without_fork_needs_no_fallback() -> None:
    assert rule(allowed=("spawn",), default="spawn", fallback=None).fallback is None


def test_builtin_plugins_register_valid_specs() -> None:
    from hwlaunch.plugins import cpu, cuda, hpu, xpu

    seen: list[BackendSpec] = []
    for plugin in (cpu, cuda, hpu, xpu):
        plugin.hwlaunch_register_backends(register=seen.append)
    assert [s.name for s in seen] == ["cpu", "cuda", "hpu", "xpu"]
    by_name = {s.name: s for s in seen}
    assert by_name["xpu"].start_methods.allowed == ("spawn",)
    assert by_name["hpu"].start_methods.default == "spawn"
    assert by_name["hpu"].start_methods.fork_warning
    assert by_name["cuda"].start_methods.fork_unsafe_after_init
    assert by_name["cuda"].start_methods.fallback == "forkserver"
    assert by_name["cpu"].start_methods.fork_unsafe_after_init is False
