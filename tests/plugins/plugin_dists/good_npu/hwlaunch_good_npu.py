"""A vendor plugin that works: one valid backend, "goodnpu", with two always-present devices."""

from __future__ import annotations

from hwlaunch import BackendSpec, Register, StartMethodRule, hookimpl


@hookimpl
def hwlaunch_register_backends(register: Register) -> None:
    register(
        BackendSpec(
            name="goodnpu",
            device_type="npu",
            priority=50,
            is_available=lambda: True,
            device_count=lambda: 2,
            is_initialized=lambda: False,
            start_methods=StartMethodRule(allowed=("spawn",), default="spawn"),
            dist_backend="gloo",
            worker="hwlaunch.plugins.cpu.worker:CPUWorker",
            device_control_env_var="GOODNPU_VISIBLE_DEVICES",
            ray_resource="NPU",
        )
    )
