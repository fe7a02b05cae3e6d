"""vLLM's CPU all-reduce segments in ``/dev/shm``, removed when the job ends.

Why: vLLM's CPU communicator keeps a shared-memory segment per rank and group, named after the
job's rendezvous (``VLLM_DIST_IDENT``, the file store's name), through a C++ manager that
removes nothing when its process ends by ``os._exit`` (as multiprocessing's children do). Each
rank removes the job's segments as it shuts down (a driver that was killed included), and
the driver removes them again when its executor shuts down (a rank that was killed included).
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["remove_segments", "segments_ident"]

SHM_DIR = "/dev/shm"


def remove_segments(ident: str | None) -> None:
    """Unlink the job's ``<ident>-...-cpushm_<n>`` segments; ones already gone are fine."""
    if not ident or not os.path.isdir(SHM_DIR):
        return
    for name in os.listdir(SHM_DIR):
        if name.startswith(f"{ident}-") and "-cpushm" in name:
            with contextlib.suppress(FileNotFoundError):  # another rank was first
                os.unlink(os.path.join(SHM_DIR, name))


def segments_ident(init_method: str) -> str:
    """The ``VLLM_DIST_IDENT`` vLLM's CPU worker derives from the job's rendezvous: a file
    store's file name, or a TCP rendezvous's port."""
    if init_method.startswith("file://"):
        return os.path.basename(init_method.removeprefix("file://"))
    return init_method.split(":")[-1]
