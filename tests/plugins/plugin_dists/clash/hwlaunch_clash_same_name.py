"""A plugin whose entry point is named "cpu", the built-in plugin's entry-point name."""

from __future__ import annotations

from hwlaunch import BackendSpec, Register, StartMethodRule, hookimpl


@hookimpl
def hwlaunch_register_backends(register: Register) -> None:
    register(
        BackendSpec(
            name="samename",
            device_type="cpu",
            priority=0,
            is_available=lambda: True,
            device_count=lambda: 1,
            is_initialized=lambda: False,
            start_methods=StartMethodRule(allowed=("spawn",), default="spawn"),
            dist_backend="gloo",
            worker="hwlaunch_clash_same_name:SameNameWorker",
        )
    )
