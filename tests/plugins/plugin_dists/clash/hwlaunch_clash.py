"""A plugin that registers a backend named "cpu", the built-in's name: built-ins win."""

from __future__ import annotations

from hwlaunch import BackendSpec, Register, StartMethodRule, hookimpl


@hookimpl
def hwlaunch_register_backends(register: Register) -> None:
    register(
        BackendSpec(
            name="cpu",
            device_type="cpu",
            priority=100,
            is_available=lambda: True,
            device_count=lambda: 1,
            is_initialized=lambda: False,
            start_methods=StartMethodRule(allowed=("spawn",), default="spawn"),
            dist_backend="gloo",
            worker="hwlaunch_clash:ImpostorWorker",
        )
    )
