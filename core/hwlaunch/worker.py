"""Worker: the base class that backend plugins subclass.

One Worker lives in each worker process (or in the caller's process for the uni executor, or
in a Ray actor). Its lifecycle is ``init_device()`` -> ``init_distributed()`` -> RPCs ->
``shutdown()``. Executors call methods on it by name through ``collective_rpc``.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from hwlaunch.plan import Plan

__all__ = ["Worker"]

_HOST_CPU = object()  # Worker.init_device's device, until torch.device("cpu") is asked for


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
        self._device: Any = None
        self.setup_plugins: list[str] = []  # plugins whose hwlaunch_worker_setup ran, in order

    @property
    def device_index(self) -> int:
        """The index of this worker's device among those it sees.

        Started by hwlaunch: 0 under the ``per_worker`` binding (it sees only its own), else
        its local rank. Started by a launcher (an executor that adopts its ranks: ``external``), hwlaunch set no
        visibility: see :func:`launcher_device_index`.
        """
        if self.plan.ranks_from_launcher:
            return launcher_device_index(
                self.local_rank, self.plan.device_control_env_var, os.environ
            )
        return 0 if self.plan.device_binding == "per_worker" else self.local_rank

    @property
    def device(self) -> Any:
        """The device ``init_device`` bound (None before it ran). The base class's is
        ``torch.device("cpu")``, made when first asked for: a worker that never uses torch
        does not import it (a second or more of CPU in a fresh process)."""
        if self._device is _HOST_CPU:
            import torch

            self._device = torch.device("cpu")
        return self._device

    @device.setter
    def device(self, device: Any) -> None:
        self._device = device

    def init_device(self) -> None:
        """Bind this worker to its device. The base class uses the host CPU."""
        self._device = _HOST_CPU

    def init_distributed(self) -> None:
        """Join the job's process group with the plan's communication backend."""
        import torch.distributed as dist

        if dist.is_initialized():
            return
        dist.init_process_group(
            backend=self.process_group_backend(),
            store=self.rendezvous_store(),
            rank=self.rank,
            world_size=self.world_size,
            **self.process_group_options(),
        )

    def process_group_backend(self) -> str:
        """The ``torch.distributed`` backend to join with: the plan's, unless the worker knows
        better from inside its process (XPU: oneCCL's ``ccl`` when it is installed)."""
        return self.plan.dist_backend

    def process_group_options(self) -> dict[str, Any]:
        """Extra keywords for ``init_process_group`` (CUDA binds the group to its device)."""
        return {}

    def rendezvous_store(self) -> Any:
        """The job's ``torch.distributed.TCPStore`` at MASTER_ADDR:MASTER_PORT, hosted by rank 0.

        Why not ``init_method="tcp://ADDR:PORT"``: torch's store then listens on every interface
        (``::``) whatever ADDR says, so anyone on the network could reach it. Rank 0 binds the
        listening socket to MASTER_ADDR itself (127.0.0.1 for one node) and hands it over.
        """
        from torch.distributed import TCPStore  # type: ignore[attr-defined]  # re-exported

        if self.rank != 0:
            return TCPStore(self.master_addr, self.master_port, self.world_size, is_master=False)
        family = socket.AF_INET6 if ":" in self.master_addr else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.master_addr, self.master_port))
            sock.listen(max(self.world_size, 128))
            return TCPStore(
                self.master_addr,
                self.master_port,
                self.world_size,
                is_master=True,
                master_listen_fd=sock.detach(),  # the store owns (and closes) the socket now
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


def launcher_device_index(local_rank: int, visibility_var: str | None, environ: Any) -> int:
    """The device of a rank that a launcher started, among the devices it sees.

    The launcher, not hwlaunch, decided what the process sees. When it sees every device of
    its node (torchrun, or srun without GPU binding: the visibility variable unset, or listing
    more devices than the local rank), the rank takes its local rank. When the launcher gave
    the task devices of its own (``srun --gpus-per-task=1`` sets ``CUDA_VISIBLE_DEVICES`` to
    the task's GPU), it lists no more devices than the local rank, and the rank takes the
    first: index 0.
    """
    visible = environ.get(visibility_var) if visibility_var else None
    if visible is None:
        return local_rank
    count = len([device for device in visible.split(",") if device.strip()])
    return local_rank if count > local_rank else 0
