"""What a vLLM job leaves on the machine, removed when it ends: vLLM's CPU all-reduce segments
in ``/dev/shm``, the file its ranks met through (a file store's ``vllm_dist_<id>``), and the
ipc socket files of its groups' broadcast queues.

Why: vLLM's CPU communicator keeps a shared-memory segment per rank and group, named after the
job's rendezvous (``VLLM_DIST_IDENT``, the file store's name), through a C++ manager that
removes nothing when its process ends by ``os._exit`` (as multiprocessing's children do). Each
rank removes the job's segments as it shuts down (a driver that was killed included), and
the driver removes them again when its executor shuts down (a rank that was killed included).
Where vLLM's own server kills the engine core and its workers at once (``--shutdown-timeout
0``: SIGKILL to the whole tree), none of them can: ``hwlaunch serve-vllm`` then removes the
segments that appeared while it ran and that no process maps any more (``orphans``).

The file store's file is torch's to remove, once the last process that opened it destroys its
store: ranks that end by ``os._exit`` never do. Each rank removes it once its groups have ended
(nothing reads the store after that), and the driver again at its executor's shutdown.
vLLM's broadcast queues (``shm_broadcast.MessageQueue``) bind zmq ipc sockets under
``VLLM_RPC_BASE_PATH`` and never unlink them: the rank that bound them does, once its groups
have ended.
"""

from __future__ import annotations

import contextlib
import os

__all__ = [
    "job_segments",
    "orphans",
    "remove_rendezvous_file",
    "remove_segments",
    "segments_ident",
    "unlink",
    "unlink_sockets",
]

SHM_DIR = "/dev/shm"


def remove_segments(ident: str | None) -> None:
    """Unlink the job's ``<ident>-...-cpushm_<n>`` segments; ones already gone are fine."""
    if not ident or not os.path.isdir(SHM_DIR):
        return
    for name in os.listdir(SHM_DIR):
        if name.startswith(f"{ident}-") and "-cpushm" in name:
            with contextlib.suppress(FileNotFoundError):  # another rank was first
                os.unlink(os.path.join(SHM_DIR, name))


def remove_rendezvous_file(init_method: str | None) -> None:
    """Unlink a file store's file (``file://PATH``); a TCP rendezvous leaves none."""
    if init_method and init_method.startswith("file://"):
        with contextlib.suppress(FileNotFoundError):  # another rank, or torch, was first
            os.unlink(init_method.removeprefix("file://"))


def unlink_sockets(paths: list[str]) -> None:
    """Unlink ipc socket files whose sockets are closed; ones already gone are fine."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


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
