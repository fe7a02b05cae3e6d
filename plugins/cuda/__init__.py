"""The NVIDIA CUDA backend.

fork is the default (fastest, works without a main guard), but once CUDA is initialized in the
parent a forked child cannot use it, so the rule falls back then, to forkserver: a fork server
started fresh (CUDA never initialized in it) imports torch once, and each worker forks from it,
which is as safe as spawn and starts 8 workers several times faster (docs/performance.md).
Devices are counted through NVML, which never calls cuInit, so asking does not itself make fork
unsafe.
"""

from __future__ import annotations

import os
import sys

from hwlaunch import BackendSpec, Register, StartMethodRule, hookimpl
from hwlaunch.probes import nvml_device_count


def device_count() -> int:
    """NVML's count, narrowed by CUDA_VISIBLE_DEVICES as CUDA itself would narrow it."""
    total = nvml_device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or total == 0:
        return int(total)
    entries = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry or entry.startswith("-"):
            break  # CUDA stops at the first invalid or negative entry
        entries.append(entry)
    return int(min(len(entries), total))


def is_initialized() -> bool:
    """Only a torch that is already imported can have initialized CUDA in this process."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


@hookimpl
def hwlaunch_register_backends(register: Register) -> None:
    register(
        BackendSpec(
            name="cuda",
            device_type="cuda",
            priority=100,
            is_available=lambda: device_count() > 0,
            device_count=device_count,
            is_initialized=is_initialized,
            start_methods=StartMethodRule(
                allowed=("fork", "spawn", "forkserver"),
                default="fork",
                fork_unsafe_after_init=True,
                fallback="forkserver",
                preload=("torch",),
            ),
            dist_backend="nccl",
            worker="hwlaunch.plugins.cuda.worker:CUDAWorker",
            device_control_env_var="CUDA_VISIBLE_DEVICES",
            device_binding="per_worker",
            ray_noset_visibility_var="RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
            ray_resource="GPU",
        )
    )
