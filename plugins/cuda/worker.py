"""The CUDA worker: one GPU per local rank, NCCL collectives."""

from __future__ import annotations

from typing import Any

from hwlaunch import Worker


class CUDAWorker(Worker):
    def init_device(self) -> None:
        import torch

        torch.cuda.set_device(self.local_rank)
        self.device = torch.device("cuda", self.local_rank)

    def process_group_options(self) -> dict[str, Any]:
        return {"device_id": self.device}  # eager NCCL init, bound to this worker's GPU
