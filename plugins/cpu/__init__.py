"""The host CPU backend: always available, gloo for collectives, any start method the OS offers."""

from __future__ import annotations

import multiprocessing
import os

from hwlaunch import START_METHODS, BackendSpec, Register, StartMethodRule, hookimpl


def _rule() -> StartMethodRule:
    offered = multiprocessing.get_all_start_methods()
    allowed = tuple(m for m in START_METHODS if m in offered)
    return StartMethodRule(
        allowed=allowed,
        default="fork" if "fork" in allowed else "spawn",
        fallback="forkserver" if "forkserver" in allowed else "spawn",
        preload=("torch",),
    )


@hookimpl
def hwlaunch_register_backends(register: Register) -> None:
    register(
        BackendSpec(
            name="cpu",
            device_type="cpu",
            priority=0,
            is_available=lambda: True,
            device_count=lambda: os.cpu_count() or 1,
            is_initialized=lambda: False,
            start_methods=_rule(),
            dist_backend="gloo",
            worker="hwlaunch.plugins.cpu.worker:CPUWorker",
            device_control_env_var=None,
            device_binding="none",
            ray_resource="CPU",
        )
    )
