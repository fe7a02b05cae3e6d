"""Two plugins that register something invalid: a spec with a bad field, and not a spec at all."""

from __future__ import annotations

from typing import Any

from hwlaunch import BackendSpec, Register, StartMethodRule, hookimpl


class BadField:
    @staticmethod
    @hookimpl
    def hwlaunch_register_backends(register: Register) -> None:
        register(
            BackendSpec(
                name="badnpu",
                device_type="npu",
                priority=1,
                is_available=lambda: True,
                device_count=lambda: 1,
                is_initialized=lambda: False,
                start_methods=StartMethodRule(allowed=("spawn",), default="spawn"),
                dist_backend="gloo",
                worker="not an import path",
            )
        )


class NotASpec:
    @staticmethod
    @hookimpl
    def hwlaunch_register_backends(register: Register) -> None:
        spec: Any = {"name": "dictnpu", "device_type": "npu"}
        register(spec)
