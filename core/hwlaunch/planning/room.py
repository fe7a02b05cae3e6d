"""How many workers this machine has room for: the limits probed (facts), and the rule that
refuses a world size beyond them before anything is allocated.

An executor that starts a local process per rank (``ExecutorSpec.start_method``) needs, per
worker, tasks of the kernel (the worker's main thread and hwlaunch's two threads in it: its
death pipe and its stack thread), descriptors in the driver (the worker's call, stack and
output pipes, its sentinel), and, with the shm channel, the worker's two reply areas of shared
memory. The limits are read where the kernel keeps them:

- tasks (processes and threads): the cgroup's ``pids.max`` (a container's ``--pids-limit``),
  each level of the hierarchy up to its root; ``RLIMIT_NPROC`` (``ulimit -u``) of the user,
  which the kernel does not apply to root; ``kernel.threads-max`` and ``kernel.pid_max``;
- descriptors: this process's ``RLIMIT_NOFILE`` (``ulimit -n``);
- memory: ``MemAvailable``, and the cgroup's ``memory.max`` (``memory.limit_in_bytes``).

Probing reads ``/proc`` and ``/sys`` only (no process is started); counting a user's tasks for
``RLIMIT_NPROC`` reads every process's status, so it is done only where that limit applies.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import psutil

from hwlaunch.channels import SHM_REPLY_BYTES
from hwlaunch.errors import ConfigError
from hwlaunch.executor_spec import ExecutorSpec
from hwlaunch.runtime_facts import Limit, Room

__all__ = ["RANK_DRIVER_FDS", "RANK_TASKS", "check_room", "probe_room"]

RANK_TASKS = 3  # a worker's main thread, its death-pipe thread and its stack thread
RANK_DRIVER_FDS = 9  # the driver's ends of a worker's pipes, and its process sentinel
RANK_SHM_BYTES = 2 * SHM_REPLY_BYTES  # a worker's two reply areas in the shm channel


# -- facts ---------------------------------------------------------------------------------------
def probe_room() -> Room:
    """What this process may still start now: tasks, descriptors, memory (each the tightest
    limit that applies, and its name)."""
    return Room(tasks=_tightest(_task_limits()), fds=_fds(), memory=_tightest(_memory_limits()))


def _tightest(limits: list[Limit]) -> Limit | None:
    return min(limits, key=lambda limit: limit.free) if limits else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, ValueError):
        return None


def _number(text: str | None) -> int | None:
    return int(text) if text is not None and text.isascii() and text.isdigit() else None


def _task_limits() -> list[Limit]:
    found = [*_cgroup_limits("pids", "pids.max", "pids.current", "tasks")]
    kernel = [_number(_read(Path(f"/proc/sys/kernel/{k}"))) for k in ("threads-max", "pid_max")]
    loadavg = (_read(Path("/proc/loadavg")) or "").split()
    in_use = _number(loadavg[3].partition("/")[2]) if len(loadavg) > 3 else None
    bounds = [k for k in kernel if k is not None]
    if bounds and in_use is not None:
        found.append(
            Limit(
                min(bounds) - in_use,
                f"kernel.threads-max / kernel.pid_max ({min(bounds)} tasks on this machine, "
                f"{in_use} in use)",
            )
        )
    nproc = _nproc()
    return found + ([nproc] if nproc is not None else [])


def _nproc() -> Limit | None:
    """``RLIMIT_NPROC`` of the real user, where the kernel applies it (not to root)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft == resource.RLIM_INFINITY or os.geteuid() == 0:
        return None
    uid, used = os.getuid(), 0
    for proc in psutil.process_iter(["uids", "num_threads"]):
        uids, threads = proc.info["uids"], proc.info["num_threads"]
        if uids is not None and uids.real == uid and threads:
            used += int(threads)
    return Limit(soft - used, f"RLIMIT_NPROC of uid {uid} (ulimit -u: {soft}, {used} tasks in use)")


def _fds() -> Limit | None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        return None
    hard_text = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    return Limit(
        soft - used,
        f"RLIMIT_NOFILE of this process (ulimit -n: {soft}; its hard limit {hard_text}; "
        f"{used} open)",
    )


def _memory_limits() -> list[Limit]:
    found = [
        *_cgroup_limits("memory", "memory.max", "memory.current", "bytes"),
        *_cgroup_limits("memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "bytes"),
    ]
    available = psutil.virtual_memory().available
    found.append(Limit(available, f"MemAvailable ({_gib(available)} available)"))
    return found


def _gib(n: float) -> str:
    """Bytes for people: GiB from one GiB up, MiB below."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _cgroup_limits(controller: str, limit: str, current: str, unit: str) -> list[Limit]:
    """Each level, from this process's cgroup up to the root, that sets ``limit``: cgroup v2
    (``0::/path``) and v1 (``N:controller:/path``)."""
    found = []
    for mount, folder in _cgroup_folders(controller):
        for level in (folder, *folder.parents):
            if len(level.parts) < len(mount.parts):
                break
            most, now = _number(_read(level / limit)), _number(_read(level / current))
            if most is None or now is None or most >= 2**62:  # "max", or v1's "no limit"
                continue
            shown: Callable[[int], str] = _gib if unit == "bytes" else str
            found.append(
                Limit(
                    most - now,
                    f"the cgroup's {limit} ({level / limit}: {shown(most)}, {shown(now)} in use)",
                )
            )
    return found


def _cgroup_folders(controller: str) -> list[tuple[Path, Path]]:
    """This process's cgroup folders that may hold ``controller``'s files, each with where its
    hierarchy is mounted: the v2 (unified) one, and the v1 one of that controller."""
    mounts = _cgroup_mounts()
    folders = []
    for line in (_read(Path("/proc/self/cgroup")) or "").splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        key = "" if controllers == "" else controller
        if key in mounts and (key == "" or controller in controllers.split(",")):
            folder = mounts[key] / path.lstrip("/")
            if folder.is_dir():
                folders.append((mounts[key], folder))
    return folders


@lru_cache(maxsize=1)
def _cgroup_mounts() -> dict[str, Path]:
    """Where each cgroup hierarchy is mounted: ``""`` for v2, else the v1 controllers read
    here (mount points stay put for the life of a process: read once)."""
    mounts: dict[str, Path] = {}
    for line in (_read(Path("/proc/self/mounts")) or "").splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        if fields[2] == "cgroup2":
            mounts.setdefault("", Path(fields[1]))
        elif fields[2] == "cgroup":
            for option in set(fields[3].split(",")) & {"pids", "memory"}:
                mounts.setdefault(option, Path(fields[1]))
    return mounts


# -- the rule ------------------------------------------------------------------------------------
def check_room(
    executor: ExecutorSpec,
    world_size: int,
    world_source: str,
    rpc_channel: str | None,
    room: Room,
) -> None:
    """Refuse a world size that an executor starting a process per rank cannot start here:
    more workers than the tasks, descriptors or memory left, naming the limit and the fix."""
    if not executor.start_method:
        return
    needs: list[tuple[int, Limit | None, Callable[[int], str], str]] = [
        (RANK_TASKS, room.tasks, _tasks, "the worker's main thread and hwlaunch's two threads"),
        (RANK_DRIVER_FDS, room.fds, _fds_text, "the driver's ends of the worker's pipes"),
    ]
    if executor.rpc_channel and rpc_channel == "shm":
        needs.append((RANK_SHM_BYTES, room.memory, _shared, "the worker's two reply areas"))
    for each, limit, text, why in needs:
        if limit is not None and world_size * each > limit.free:
            raise ConfigError(
                f"world_size {world_size} (from {world_source}) does not fit on this machine: "
                f"{world_size} workers need {text(world_size * each)} ({text(each)} each: "
                f"{why}), and {limit.name} leaves {text(max(limit.free, 0))}. Fix: world_size "
                f"<= {max(limit.free // each, 0)}, or raise that limit, or use executor 'ray' "
                "to place the workers on more machines"
            )


def _tasks(n: int) -> str:
    return f"{n} tasks"


def _fds_text(n: int) -> str:
    return f"{n} file descriptors"


def _shared(n: int) -> str:
    return f"{_gib(n)} of shared memory"
