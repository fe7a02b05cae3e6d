"""The built-in backends through hwlaunch.testing, as a third-party plugin would run it.

cpu runs every check, worker lifecycle included. cuda, hpu and xpu run the registration, probe,
rule and resolver checks with the device assumed where it is absent; their lifecycle checks skip
with the reason unless the hardware is here.
"""

from __future__ import annotations

from hwlaunch.testing import BackendConformance, ExecutorConformance


class TestCPU(BackendConformance):
    backend = "cpu"


class TestCUDA(BackendConformance):
    backend = "cuda"
    assume = ("cuda.device_count=8",)  # what-if: a node with 8 GPUs
    vendor_modules = ("pynvml", "nvidia")


class TestHPU(BackendConformance):
    backend = "hpu"
    vendor_modules = ("habana_frameworks",)


class TestXPU(BackendConformance):
    backend = "xpu"
    vendor_modules = ("intel_extension_for_pytorch", "oneccl_bindings_for_pytorch")


class TestUniExecutor(ExecutorConformance):
    executor = "uni"


class TestMpExecutor(ExecutorConformance):
    executor = "mp"


class TestExternalExecutor(ExecutorConformance):
    """Skips: it runs under torchrun only (tests/integration/test_external.py)."""

    executor = "external"
