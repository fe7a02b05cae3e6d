"""The CUDA worker: one GPU per local rank, NCCL collectives."""

from __future__ import annotations

from hwlaunch import Worker


class CUDAWorker(Worker):
    def init_device(self) -> None:
        import torch

        torch.cuda.set_device(self.local_rank)
        self.device = torch.device("cuda", self.local_rank)

    def init_distributed(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            return
        dist.init_process_group(
            backend=self.plan.dist_backend,
            init_method=f"tcp://{self.master_addr}:{self.master_port}",
            rank=self.rank,
            world_size=self.world_size,
            device_id=self.device,
        )
