"""A plugin with a misspelled hook next to a correct one: the misspelling must not pass silently."""

from __future__ import annotations

from hwlaunch import BackendSpec, Register, StartMethodRule, Worker, hookimpl


@hookimpl
def hwlaunch_register_backends(register: Register) -> None:
    register(
        BackendSpec(
            name="typonpu",
            device_type="npu",
            priority=40,
            is_available=lambda: True,
            device_count=lambda: 1,
            is_initialized=lambda: False,
            start_methods=StartMethodRule(allowed=("spawn",), default="spawn"),
            dist_backend="gloo",
            worker="hwlaunch.plugins.cpu.worker:CPUWorker",
            device_control_env_var="TYPO_VISIBLE_DEVICES",
        )
    )


@hookimpl
def hwlaunch_worker_setpu(worker: Worker) -> None:
    pass
