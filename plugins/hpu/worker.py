"""The Gaudi worker: habana_frameworks is imported here, inside the worker process only."""

from __future__ import annotations

from hwlaunch import Worker


class HPUWorker(Worker):
    def init_device(self) -> None:
        import habana_frameworks.torch  # noqa: F401  (registers the hpu device and hccl)
        import torch

        self.device = torch.device("hpu")
