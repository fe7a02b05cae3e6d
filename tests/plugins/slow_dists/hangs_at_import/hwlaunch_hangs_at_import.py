"""A plugin whose import waits for a vendor service that does not answer: for
``HANGS_AT_IMPORT_SECONDS`` seconds (unset: for ever), then it registers its backend."""

from __future__ import annotations

import os
import threading

import hwlaunch


def wait_for_the_vendor_daemon() -> None:
    seconds = os.environ.get("HANGS_AT_IMPORT_SECONDS")
    threading.Event().wait(float(seconds) if seconds else None)


wait_for_the_vendor_daemon()


@hwlaunch.hookimpl
def hwlaunch_register_backends(register: hwlaunch.Register) -> None:
    register(
        hwlaunch.BackendSpec(
            name="slownpu",
            device_type="npu",
            priority=5,
            is_available=lambda: False,
            device_count=lambda: 0,
            is_initialized=lambda: False,
            start_methods=hwlaunch.StartMethodRule(allowed=("spawn",), default="spawn"),
            dist_backend="gloo",
            worker="hwlaunch_hangs_at_import:Worker",
            ray_resource="NPU",
        )
    )
