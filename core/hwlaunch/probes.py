"""Cheap, side-effect-free building blocks for backend probes.

Plugins use these so that listing backends never imports torch or a vendor module, and never
initializes a device runtime (which would make fork unsafe for the rest of the process).
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import sys
from functools import lru_cache


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (a container's or taskset's limit),
    which ``os.cpu_count()`` ignores; the machine's count where the OS has no affinity call."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def module_imported(name: str) -> bool:
    """Whether ``name`` is already imported (so asking it questions costs nothing new)."""
    return name in sys.modules


def module_installed(name: str) -> bool:
    """Whether ``name`` could be imported, found without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def device_nodes(pattern: str) -> list[str]:
    """Device files matching a glob such as ``/dev/accel/accel*``."""
    return sorted(glob.glob(pattern))


@lru_cache(maxsize=1)
def nvml_device_count() -> int:
    """The number of NVIDIA GPUs, asked through NVML as PYTORCH_NVML_BASED_CUDA_CHECK=1 does.

    NVML never calls cuInit, so a forked child can still use CUDA afterwards. Returns 0 when the
    NVML library is absent (no driver) or fails to initialize.
    """
    for lib in ("libnvidia-ml.so.1", "libnvidia-ml.so"):
        try:
            nvml = ctypes.CDLL(lib)
        except OSError:
            continue
        if nvml.nvmlInit_v2() != 0:
            return 0
        try:
            count = ctypes.c_uint(0)
            if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
                return 0
            return int(count.value)
        finally:
            nvml.nvmlShutdown()
    return 0
