"""The Acme NPU worker: one per rank, in its own process (mp), an actor (ray) or in-process (uni).

This module is imported only inside workers, so this is the place to import the vendor runtime.
"""

from __future__ import annotations

import os

from hwlaunch import Worker
from hwlaunch_acme import VISIBLE_VAR, ops


class AcmeWorker(Worker):
    """Binds one Acme NPU per local rank; collectives go through the plan's gloo backend."""

    acme_device: str | None = None  # the physical Acme NPU this worker bound, e.g. "3"

    def init_device(self) -> None:
        import torch

        if not ops.registrations():  # the plugin's hwlaunch_worker_setup runs before this
            raise RuntimeError("the Acme ops are not registered: hwlaunch_worker_setup did not run")
        # device_binding="job_wide": the executor sets ACME_VISIBLE_DEVICES for each worker to
        # the devices of this job ("0,1", or a subset of what the user made visible); this rank
        # takes entry device_index (its local rank). Without the variable (the uni executor runs
        # in the caller's process), it is the local rank.
        visible = [v.strip() for v in os.environ.get(VISIBLE_VAR, "").split(",") if v.strip()]
        index = self.device_index
        self.acme_device = visible[index] if index < len(visible) else str(index)
        # A real plugin: `import acme_runtime; acme_runtime.set_device(index)` and
        # `self.device = torch.device("acme", index)`. The emulation computes on the CPU.
        self.device = torch.device("cpu")

    # init_distributed() and shutdown() are inherited: the base class joins a torch.distributed
    # process group with the plan's dist_backend, and leaves it at shutdown. Override them when
    # your backend needs more (e.g. pass device_id=self.device to init_process_group).

    def ops_registered(self) -> int:
        """How many times this process registered the Acme ops (an RPC target)."""
        return ops.registrations()

    def bound_device(self) -> str | None:
        """Which Acme NPU this rank bound (an RPC target: executor.collective_rpc("bound_device"))."""
        return self.acme_device
