"""Process titles, so that ``ps`` and ``top`` tell workers apart: ``hwlaunch cpu rank0``.

Two names exist on Linux. The command line (``ps -f``, ``top -c``, ``/proc/<pid>/cmdline``)
can be rewritten only by the setproctitle package, used when it is installed. The kernel's
name of the process (``ps``, ``top``, ``/proc/<pid>/comm``) is at most 15 bytes and is always
set, through ``/proc/self/comm`` (the process, whichever thread writes it); ``hwl cpu rank0``
fits, with the rank kept even for a long backend name.
"""

from __future__ import annotations

import contextlib
import importlib

__all__ = ["kernel_name", "set_title", "title"]

COMM_LIMIT = 15  # bytes of a Linux process name (TASK_COMM_LEN - 1)


def title(backend: str, rank: int) -> str:
    return f"hwlaunch {backend} rank{rank}"


def kernel_name(backend: str, rank: int) -> str:
    """The 15-byte name: ``hwl <backend> rank<R>``, the backend cut to make the rank fit."""
    tail = f" rank{rank}"
    room = max(COMM_LIMIT - len("hwl ") - len(tail), 1)
    return f"hwl {backend[:room]}{tail}"[:COMM_LIMIT]


def set_title(backend: str, rank: int) -> None:
    """Name this process after its rank (an mp worker; Ray titles its actors itself)."""
    with contextlib.suppress(ImportError):
        importlib.import_module("setproctitle").setproctitle(title(backend, rank))
    # After setproctitle, which sets the kernel name to its title's first 15 bytes.
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(kernel_name(backend, rank))
