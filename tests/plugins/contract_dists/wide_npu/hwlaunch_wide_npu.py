"""A plugin whose device is absent here (tested with assumed facts, or emulated: its probes
count WIDENPU_EMULATED_DEVICES devices), bound job-wide: every worker sees the job's devices and
selects its local rank (as oneCCL needs)."""

from __future__ import annotations

import os

from hwlaunch import BackendSpec, Register, StartMethodRule, hookimpl


@hookimpl
def hwlaunch_register_backends(register: Register) -> None:
    register(
        BackendSpec(
            name="widenpu",
            device_type="widenpu",
            priority=40,
            is_available=lambda: _emulated() > 0,
            device_count=_emulated,
            is_initialized=lambda: False,
            start_methods=StartMethodRule(allowed=("spawn",), default="spawn"),
            dist_backend="gloo",
            worker="hwlaunch.plugins.cpu.worker:CPUWorker",
            device_control_env_var="WIDE_VISIBLE_DEVICES",
            device_binding="job_wide",
            propagate_env=("WIDE_*",),
        )
    )


def _emulated() -> int:
    return int(os.environ.get("WIDENPU_EMULATED_DEVICES", "0"))
