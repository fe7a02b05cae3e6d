"""The Intel Gaudi (HPU) backend.

spawn is the default because a forked HPU worker can hang at process exit; an explicit fork is
honoured, with that warning. ``habana_frameworks`` is imported only inside workers.
"""

from __future__ import annotations

import re
import sys

from hwlaunch import BackendSpec, Register, StartMethodRule, hookimpl
from hwlaunch.probes import device_nodes, module_installed

FORK_WARNING = (
    "workers use fork, but forked HPU workers can hang at process exit; spawn (with an "
    '`if __name__ == "__main__":` guard) is the safe choice on HPU'
)


def device_count() -> int:
    """Gaudi accelerators appear as /dev/accel/accelN (older drivers: /dev/hlN)."""
    nodes = device_nodes("/dev/accel/accel*") + device_nodes("/dev/hl*")
    return sum(1 for node in nodes if re.search(r"/(accel|hl)\d+$", node))


def is_available() -> bool:
    return device_count() > 0 and module_installed("habana_frameworks")


def is_initialized() -> bool:
    hpu = sys.modules.get("habana_frameworks.torch.hpu")
    check = getattr(hpu, "is_initialized", None)
    return bool(check()) if callable(check) else False


@hookimpl
def hwlaunch_register_backends(register: Register) -> None:
    register(
        BackendSpec(
            name="hpu",
            device_type="hpu",
            priority=90,
            is_available=is_available,
            device_count=device_count,
            is_initialized=is_initialized,
            start_methods=StartMethodRule(
                allowed=("spawn", "fork"), default="spawn", fork_warning=FORK_WARNING
            ),
            dist_backend="hccl",
            worker="hwlaunch.plugins.hpu.worker:HPUWorker",
            device_control_env_var="HABANA_VISIBLE_MODULES",
            device_binding="per_worker",
            ray_noset_visibility_var="RAY_EXPERIMENTAL_NOSET_HABANA_VISIBLE_MODULES",
            ray_resource="HPU",
            # Gaudi's teardown (releasing the device, HCCL's communicators) takes longer than
            # the default 5 s: a worker SIGKILLed mid-teardown can leave the device held.
            shutdown_timeout=30.0,
        )
    )
