"""A plugin whose device is absent here (tested with assumed facts), bound job-wide: every
worker sees the job's devices and selects its local rank (as oneCCL needs)."""

from __future__ import annotations

from hwlaunch import BackendSpec, Register, StartMethodRule, hookimpl


@hookimpl
def hwlaunch_register_backends(register: Register) -> None:
    register(
        BackendSpec(
            name="widenpu",
            device_type="widenpu",
            priority=40,
            is_available=lambda: False,
            device_count=lambda: 0,
            is_initialized=lambda: False,
            start_methods=StartMethodRule(allowed=("spawn",), default="spawn"),
            dist_backend="gloo",
            worker="hwlaunch.plugins.cpu.worker:CPUWorker",
            device_control_env_var="WIDE_VISIBLE_DEVICES",
            device_binding="job_wide",
            propagate_env=("WIDE_*",),
        )
    )
