"""The host CPU backend: always available, gloo for collectives, every start method.

The rule is data: it allows fork, spawn and forkserver; the resolver keeps those the OS offers
(so ``--assume start_methods=spawn`` shows what happens where fork is missing).
"""

from __future__ import annotations

import os

from hwlaunch import START_METHODS, BackendSpec, Register, StartMethodRule, hookimpl

RULE = StartMethodRule(
    allowed=START_METHODS, default="fork", fallback="forkserver", preload=("torch",)
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
            start_methods=RULE,
            dist_backend="gloo",
            worker="hwlaunch.plugins.cpu.worker:CPUWorker",
            device_control_env_var=None,
            device_binding="none",
            ray_resource="CPU",
        )
    )
