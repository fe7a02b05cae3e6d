"""The Intel XPU worker: one XPU per local rank, xccl (or oneCCL's ccl) collectives."""

from __future__ import annotations

import importlib.util

from hwlaunch import Worker


class XPUWorker(Worker):
    def init_device(self) -> None:
        import torch

        if self.process_group_backend() == "ccl":
            import oneccl_bindings_for_pytorch  # noqa: F401  (registers the ccl backend)
        torch.xpu.set_device(self.device_index)
        self.device = torch.device("xpu", self.device_index)

    def process_group_backend(self) -> str:
        """oneCCL's ``ccl`` where its bindings are installed on this node, else torch's xccl."""
        if importlib.util.find_spec("oneccl_bindings_for_pytorch") is not None:
            return "ccl"
        return self.plan.dist_backend
