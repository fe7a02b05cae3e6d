"""A plugin written for a plugin contract newer than the installed hwlaunch provides."""

from __future__ import annotations

from hwlaunch import BackendSpec, Register, StartMethodRule, hookimpl


@hookimpl
def hwlaunch_register_backends(register: Register) -> None:
    register(
        BackendSpec(
            name="futurenpu",
            device_type="npu",
            priority=40,
            is_available=lambda: True,
            device_count=lambda: 1,
            is_initialized=lambda: False,
            start_methods=StartMethodRule(allowed=("spawn",), default="spawn"),
            dist_backend="gloo",
            worker="hwlaunch.plugins.cpu.worker:CPUWorker",
            device_control_env_var="FUTURE_VISIBLE_DEVICES",
            contract="1.9",
        )
    )
