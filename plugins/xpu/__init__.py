"""The Intel XPU backend: spawn only (the XPU runtime does not survive fork)."""

from __future__ import annotations

import importlib.util
import os
import sys

from hwlaunch import BackendSpec, Register, StartMethodRule, hookimpl
from hwlaunch.probes import device_nodes, module_installed


def _runtime_installed() -> bool:
    """IPEX, or a torch built with XPU support (it ships libtorch_xpu), found without imports."""
    if module_installed("intel_extension_for_pytorch"):
        return True
    if not module_installed("torch"):
        return False
    torch_spec = importlib.util.find_spec("torch")
    if torch_spec is None or not torch_spec.submodule_search_locations:
        return False
    lib = os.path.join(next(iter(torch_spec.submodule_search_locations)), "lib", "libtorch_xpu.so")
    return os.path.exists(lib)


def device_count() -> int:
    """Render nodes of Intel GPUs, narrowed by ZE_AFFINITY_MASK when it is set."""
    nodes = device_nodes("/dev/dri/renderD*")
    mask = os.environ.get("ZE_AFFINITY_MASK")
    if mask:
        return min(len([m for m in mask.split(",") if m.strip()]), len(nodes))
    return len(nodes)


def is_available() -> bool:
    return device_count() > 0 and _runtime_installed()


def is_initialized() -> bool:
    torch = sys.modules.get("torch")
    xpu = getattr(torch, "xpu", None)
    check = getattr(xpu, "is_initialized", None)
    return bool(check()) if callable(check) else False


@hookimpl
def hwlaunch_register_backends(register: Register) -> None:
    register(
        BackendSpec(
            name="xpu",
            device_type="xpu",
            priority=80,
            is_available=is_available,
            device_count=device_count,
            is_initialized=is_initialized,
            start_methods=StartMethodRule(allowed=("spawn",), default="spawn"),
            dist_backend="xccl",  # the worker switches to ccl where oneCCL is installed
            worker="hwlaunch.plugins.xpu.worker:XPUWorker",
            device_control_env_var="ZE_AFFINITY_MASK",
            # oneCCL hangs across processes when each worker sees only its own device: every
            # worker sees the job's devices and selects its local rank.
            device_binding="job_wide",
            ray_noset_visibility_var="RAY_EXPERIMENTAL_NOSET_ZE_AFFINITY_MASK",
            ray_resource="GPU",
        )
    )
