"""Worker: the base class that backend plugins subclass.

One Worker lives in each worker process (or in the caller's process for the uni executor, or
in a Ray actor). Its lifecycle is ``init_device()`` -> ``init_distributed()`` -> RPCs ->
``shutdown()``. Executors call methods on it by name through ``collective_rpc``.
"""

from __future__ import annotations

import os
from typing import Any

from hwlaunch.plan import Plan


class Worker:
    """A rank of the job: owns its device and its place in the ``torch.distributed`` group."""

    def __init__(
        self,
        *,
        rank: int,
        local_rank: int,
        world_size: int,
        plan: Plan,
        master_addr: str,
        master_port: int,
    ) -> None:
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.plan = plan
        self.master_addr = master_addr
        self.master_port = master_port
        self.device: Any = None

    def init_device(self) -> None:
        """Bind this worker to its device. The base class uses the host CPU."""
        import torch

        self.device = torch.device("cpu")

    def init_distributed(self) -> None:
        """Join the job's process group with the plan's communication backend."""
        import torch.distributed as dist

        if dist.is_initialized():
            return
        dist.init_process_group(
            backend=self.plan.dist_backend,
            init_method=f"tcp://{self.master_addr}:{self.master_port}",
            rank=self.rank,
            world_size=self.world_size,
        )

    def shutdown(self) -> None:
        """Leave the process group; called once before the worker exits."""
        import sys

        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    # -- built-in RPC targets -------------------------------------------------------------
    def ping(self) -> int:
        """Health check: answers with the worker's process id."""
        return os.getpid()

    def all_reduce_rank(self) -> int:
        """Sum every rank's id over the process group (expected: n*(n-1)/2)."""
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([self.rank], dtype=torch.int64, device=self.device)
        dist.all_reduce(tensor)
        return int(tensor.item())
