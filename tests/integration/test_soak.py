"""200 launch/RPC/shutdown cycles in one parent leak no process, descriptor, thread or shm entry.

The cycles mix what a long-lived parent (a server that restarts its engine) does: mostly fork
without a process group (fast, so that 200 fit in CI), every tenth with the gloo process group
and an all-reduce, some with forkserver and two with spawn (each spawn worker imports torch, a
few seconds on a small machine). The RPC channel alternates: shared memory that blocks at once,
shared memory that polls first, and pipes; every cycle also makes a non-blocking call. Resources are measured three times: before the first launch,
after a warm-up of ten cycles and after the last cycle. From warm-up to the end nothing may grow
at all; from the start, the only growth allowed is the per-parent helpers, the fork server
(hwlaunch's, one per worker environment) and multiprocessing's resource tracker (one process and
one descriptor each, started once).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from multiprocessing import resource_tracker
from pathlib import Path

import psutil
import pytest
import torch  # noqa: F401  imported before forking, as a real parent does: fork workers share it

import hwlaunch
from hwlaunch.executor.mp import MultiprocExecutor
from hwlaunch.executor.mp._forkserver import running_servers

pytestmark = pytest.mark.slow

CYCLES = 200
WARM_UP = 10
WORLD_SIZE = 2


CHANNELS: list[tuple[str, float | None]] = [("shm", 0.0), ("shm", 0.01), ("pipe", None)]


def schedule() -> list[tuple[str, bool, tuple[str, float | None]]]:
    """(start method, init_distributed, (rpc_channel, rpc_spin)) for each cycle."""
    methods = [("fork", i % 10 == 5) for i in range(CYCLES)]
    for i in range(100, 108):
        methods[i] = ("forkserver", i == 104)
    for i in (150, 151):
        methods[i] = ("spawn", False)
    return [(m, d, CHANNELS[i % len(CHANNELS)]) for i, (m, d) in enumerate(methods)]


def own_os_threads() -> int:
    """This process's OS threads that Python or torch started: those named like the main
    thread. Native thread pools of other libraries name theirs (gRPC's ``event_engine`` and
    ``grpc_global_tim``, left in this process by the Ray tests, grow and shrink on their own)."""
    main = Path("/proc/self/comm").read_text()
    count = 0
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            count += Path(f"/proc/self/task/{task}/comm").read_text() == main
    return count


def settled(earlier: Resources, timeout: float = 5.0) -> Resources:
    """Resources now, once threads that were ending have ended: an OS thread outlives its
    Python ``Thread`` object by a moment. A leak stays; a thread on its way out does not."""
    deadline = time.monotonic() + timeout
    while True:
        now = Resources.now()
        if not now.grew_from(earlier) or time.monotonic() >= deadline:
            return now
        time.sleep(0.05)


@dataclass(frozen=True)
class Resources:
    children: frozenset[int]
    fds: frozenset[int]
    threads: int
    os_threads: int
    shm: frozenset[str]

    @classmethod
    def now(cls) -> Resources:
        me = psutil.Process()
        return cls(
            children=frozenset(p.pid for p in me.children(recursive=True)),
            fds=frozenset(int(fd) for fd in os.listdir("/proc/self/fd")),
            threads=threading.active_count(),
            os_threads=own_os_threads(),
            # Other programs on the machine make /dev/shm entries too: count only this process's.
            shm=frozenset(n for n in os.listdir("/dev/shm") if str(os.getpid()) in n),
        )

    def without(self, pids: set[int], fds: set[int]) -> Resources:
        return Resources(
            self.children - pids, self.fds - fds, self.threads, self.os_threads, self.shm
        )

    def grew_from(self, earlier: Resources) -> list[str]:
        """What there is more of than ``earlier`` (a thread that ended meanwhile is no leak)."""
        grown = [
            f"{name}: {sorted(getattr(self, name) - getattr(earlier, name))}"
            for name in ("children", "fds", "shm")
            if getattr(self, name) - getattr(earlier, name)
        ]
        grown += [
            f"{name}: {getattr(earlier, name)} -> {getattr(self, name)}"
            for name in ("threads", "os_threads")
            if getattr(self, name) > getattr(earlier, name)
        ]
        return grown


def multiprocessing_helpers() -> tuple[set[int], set[int]]:
    """The fork servers' and resource tracker's pids, and the descriptors this process keeps
    to them: per-parent helpers (a fork server per worker environment), never per launch."""
    pids: set[int] = set()
    fds: set[int] = set()
    servers = [(server, "_forkserver_pid", "_forkserver_alive_fd") for server in running_servers()]
    for helper, pid_attr, fd_attr in (
        *servers,
        (resource_tracker._resource_tracker, "_pid", "_fd"),
    ):
        pid, fd = getattr(helper, pid_attr, None), getattr(helper, fd_attr, None)
        if isinstance(pid, int) and isinstance(fd, int):
            pids.add(pid)
            fds.add(fd)
    return pids, fds


def cycle(method: str, init_distributed: bool, channel: tuple[str, float | None]) -> None:
    plan = hwlaunch.resolve(
        backend="cpu",
        world_size=WORLD_SIZE,
        executor="mp",
        start_method=method,
        rpc_channel=channel[0],
        rpc_spin=channel[1],
    )
    executor = hwlaunch.launch(plan, init_distributed=init_distributed)
    assert isinstance(executor, MultiprocExecutor)
    with executor:
        pids = executor.collective_rpc("ping", timeout=120)
        assert pids == executor.pids and len(set(pids)) == WORLD_SIZE
        later = executor.collective_rpc("ping", timeout=120, non_block=True)
        assert later.result(120) == pids
        if init_distributed:
            assert executor.collective_rpc("all_reduce_rank", timeout=120) == [1, 1]
    alive = [pid for pid in pids if psutil.pid_exists(pid)]
    assert not alive, f"cycle {method}: workers {alive} outlived shutdown"


def background_calls_ended(timeout: float = 10.0) -> None:
    """The threads of non-blocking calls (the queue's, the reply collector) end once idle."""
    deadline = time.monotonic() + timeout
    while any(t.name in ("hwlaunch-rpc", "hwlaunch-collect") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the non-blocking call thread did not end"
        time.sleep(0.005)


def test_200_cycles_leak_nothing(clean_env: object) -> None:
    before = Resources.now()
    plan = schedule()
    for number, (method, init_distributed, channel) in enumerate(plan):
        if number == WARM_UP:
            warm = Resources.now()
        cycle(method, init_distributed, channel)
    background_calls_ended()
    after = settled(warm)
    helper_pids, helper_fds = multiprocessing_helpers()
    report = f"before={before}\nwarm={warm}\nafter={after}\nhelpers={helper_pids} {helper_fds}"
    steady = after.without(helper_pids, helper_fds)
    assert not steady.grew_from(warm.without(helper_pids, helper_fds)), report
    assert not steady.grew_from(before.without(helper_pids, helper_fds)), report
    assert len(helper_pids - before.children) <= 2, report  # fork server + tracker, once
    assert {m for m, _, _ in plan} == {"fork", "forkserver", "spawn"}
