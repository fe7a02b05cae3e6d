"""The Intel XPU worker: one XPU per local rank, xccl (or oneCCL's ccl) collectives."""

from __future__ import annotations

from hwlaunch import Worker


class XPUWorker(Worker):
    def init_device(self) -> None:
        import torch

        if self.plan.dist_backend == "ccl":
            import oneccl_bindings_for_pytorch  # noqa: F401  (registers the ccl backend)
        torch.xpu.set_device(self.device_index)
        self.device = torch.device("xpu", self.device_index)
