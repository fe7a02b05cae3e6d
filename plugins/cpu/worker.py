"""The CPU worker: gloo collectives on host tensors."""

from __future__ import annotations

from hwlaunch import Worker


class CPUWorker(Worker):
    """The base Worker already does what the CPU needs: host tensors and gloo."""
