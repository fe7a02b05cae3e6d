"""The Acme NPU worker: one per rank, in its own process (mp), an actor (ray) or in-process (uni).

This module is imported only inside workers, so this is the place to import the vendor runtime.
"""

from __future__ import annotations

import os

from hwlaunch import Worker
from hwlaunch_acme import VISIBLE_VAR


class AcmeWorker(Worker):
    """Binds one Acme NPU per local rank; collectives go through the plan's gloo backend."""

    acme_device: str | None = None  # the physical Acme NPU this worker bound, e.g. "3"

    def init_device(self) -> None:
        import torch

        # The executor sets ACME_VISIBLE_DEVICES for each worker to the devices of this job
        # ("0,1", or a subset of what the user made visible); this rank takes the local_rank-th.
        # Without the variable (the uni executor runs in the caller's process), it is local_rank.
        visible = [v.strip() for v in os.environ.get(VISIBLE_VAR, "").split(",") if v.strip()]
        self.acme_device = (
            visible[self.local_rank] if self.local_rank < len(visible) else str(self.local_rank)
        )
        # A real plugin: `import acme_runtime; acme_runtime.set_device(self.local_rank)` and
        # `self.device = torch.device("acme", self.local_rank)`. The emulation computes on the CPU.
        self.device = torch.device("cpu")

    # init_distributed() and shutdown() are inherited: the base class joins a torch.distributed
    # process group with the plan's dist_backend, and leaves it at shutdown. Override them when
    # your backend needs more (e.g. pass device_id=self.device to init_process_group).

    def bound_device(self) -> str | None:
        """Which Acme NPU this rank bound (an RPC target: executor.collective_rpc("bound_device"))."""
        return self.acme_device
