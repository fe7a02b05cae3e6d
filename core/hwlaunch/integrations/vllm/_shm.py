"""vLLM's CPU all-reduce segments in ``/dev/shm``, removed when the job ends.

Why: vLLM's CPU communicator keeps a shared-memory segment per rank and group, named after the
job's rendezvous (``VLLM_DIST_IDENT``, the file store's name), through a C++ manager that
removes nothing when its process ends by ``os._exit`` (as multiprocessing's children do). Each
rank removes the job's segments as it shuts down (a driver that was killed included), and
the driver removes them again when its executor shuts down (a rank that was killed included).
Where vLLM's own server kills the engine core and its workers at once (``--shutdown-timeout
0``: SIGKILL to the whole tree), none of them can: ``hwlaunch serve-vllm`` then removes the
segments that appeared while it ran and that no process maps any more (``orphans``).
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["job_segments", "orphans", "remove_segments", "segments_ident", "unlink"]

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


def job_segments() -> set[str]:
    """The names of every vLLM CPU all-reduce segment in ``/dev/shm`` now."""
    if not os.path.isdir(SHM_DIR):
        return set()
    return {name for name in os.listdir(SHM_DIR) if "-cpushm_" in name}


def orphans(names: set[str]) -> list[str]:
    """Those of ``names`` that no live process maps (read from ``/proc/*/maps``): a segment
    another job still uses is never among them."""
    mapped: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with (
            contextlib.suppress(OSError),  # gone, or not ours to read
            open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps,
        ):
            mapped.update(
                line.rsplit("/dev/shm/", 1)[1].split(" (deleted)")[0].rstrip("\n")
                for line in maps
                if "/dev/shm/" in line
            )
    return sorted(names - mapped)


def unlink(names: list[str]) -> None:
    """Unlink these segments of ``/dev/shm``; ones already gone are fine."""
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, name))
