"""The CUDA worker: one GPU per local rank, NCCL collectives."""

from __future__ import annotations

from typing import Any

from hwlaunch import Worker


class CUDAWorker(Worker):
    def init_device(self) -> None:
        import torch

        torch.cuda.set_device(self.device_index)
        self.device = torch.device("cuda", self.device_index)

    def process_group_options(self) -> dict[str, Any]:
        return {"device_id": self.device}  # eager NCCL init, bound to this worker's GPU
