"""A plugin whose worker setup fails: the worker must not start, and the error names it."""

from __future__ import annotations

from hwlaunch import Worker, hookimpl


@hookimpl
def hwlaunch_worker_setup(worker: Worker) -> None:
    raise RuntimeError(f"cannot register the custom allocator on rank {worker.rank}")
