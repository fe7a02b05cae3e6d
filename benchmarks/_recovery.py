"""Recovery figures for benchmarks/reliability.py: restarts and process-tree cleanup.

- Restart: 4 mp workers with ``max_restarts=1``; rank 1 is SIGKILLed while idle, and the time
  runs until the all-reduce check passes on the new group (a call that meets the old group
  raises ``WorkerDiedError(restarted=True)`` and is retried). With and without a replayed
  setup call that sleeps 0.5 s, for fork and forkserver, interleaved rep by rep; a fresh
  launch of 4 workers with the all-reduce check is measured alongside, for the ratio.
- Parent SIGKILL: tests/scripts/tree_parent.py, 4 workers that each start 2 ``Popen`` sleeps
  and a 2-process ``multiprocessing.Pool``; survivors 3 s after the parent's SIGKILL.
- 100 kill/restart cycles in one parent: processes, descriptors, threads and this parent's
  ``/dev/shm`` entries before and after.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

import hwlaunch
from hwlaunch import WorkerDiedError

SCRIPTS = Path(__file__).resolve().parent.parent / "tests" / "scripts"
SETUP_SLEEP = 0.5


def nap(worker: hwlaunch.Worker, seconds: float) -> None:
    """The replayed setup call (a model load stands in)."""
    time.sleep(seconds)


def _plan(method: str, world_size: int, max_restarts: int) -> hwlaunch.Plan:
    return hwlaunch.resolve(
        backend="cpu",
        world_size=world_size,
        executor="mp",
        start_method=method,
        max_restarts=max_restarts,
    )


def restart_once(method: str, setup: bool) -> float:
    """Seconds from the SIGKILL of rank 1 of 4 until the new group's all-reduce passes."""
    with hwlaunch.launch(_plan(method, 4, 1)) as executor:
        if setup:
            executor.collective_rpc(nap, args=(SETUP_SLEEP,), setup=True)
        assert executor.collective_rpc("all_reduce_rank") == [6] * 4
        victim = executor.pids[1]
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        while True:
            try:
                result = executor.collective_rpc("all_reduce_rank", timeout=60)
                break
            except WorkerDiedError as exc:
                if not exc.restarted:
                    raise
        took = time.monotonic() - killed
        assert result == [6] * 4 and executor.restarts == 1  # type: ignore[attr-defined]
        return took


def fresh_launch(method: str) -> float:
    start = time.monotonic()
    with hwlaunch.launch(_plan(method, 4, 0)) as executor:
        assert executor.collective_rpc("all_reduce_rank") == [6] * 4
        return time.monotonic() - start


def restart_figures(reps: int, methods: tuple[str, ...] = ("fork", "forkserver")) -> dict[str, Any]:
    samples: dict[str, list[float]] = {}
    for _ in range(reps):
        for method in methods:
            for label, setup in (("no setup call", False), ("replayed 0.5 s setup", True)):
                name = f"{method}: restart, {label}"
                samples.setdefault(name, []).append(restart_once(method, setup))
            name = f"{method}: fresh launch of 4 + all-reduce (reference)"
            samples.setdefault(name, []).append(fresh_launch(method))
    return {
        k: {"median": statistics.median(v), "max": max(v), "samples": v} for k, v in samples.items()
    }


def parent_sigkill_survivors(method: str, world_size: int = 4) -> dict[str, Any]:
    """Run tree_parent.py, SIGKILL it, count its workers' descendants alive 3 s later."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "tree_parent.py"), method, "idle", str(world_size)],
        cwd=SCRIPTS,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 300)
    if not ready:
        proc.kill()
        raise RuntimeError("tree_parent.py did not report")
    report = json.loads(proc.stdout.readline())
    procs = []
    for pid in [*report["workers"], *report["descendants"]]:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(3.0)  # the figure is "survivors after 3 s"
    survivors = [p for p in procs if _running(p)]
    for p in survivors:  # leave nothing behind for the next measurement
        with contextlib.suppress(psutil.Error):
            p.kill()
    return {"descendants": len(report["descendants"]), "survivors": len(survivors)}


def _running(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _our_shm() -> int:
    """/dev/shm entries that belong to this parent: mapped by it, or named with its pid."""
    mapped = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/maps").read_text().splitlines():
            if "/dev/shm/" in line:
                mapped.add(line.split("/dev/shm/", 1)[1].split(" ")[0])
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return 0
    return sum(1 for n in names if n in mapped or str(os.getpid()) in n)


def _resources(helpers: set[int]) -> dict[str, int]:
    me = psutil.Process()
    return {
        "child processes": len([p for p in me.children(recursive=True) if p.pid not in helpers]),
        "open file descriptors": me.num_fds(),
        "Python threads": threading.active_count(),
        "OS threads": me.num_threads(),
        "/dev/shm entries": _our_shm(),
    }


def kill_restart_cycles(cycles: int, helpers: Any) -> dict[str, Any]:
    """One executor (fork, 4 workers, a setup call), SIGKILL a worker ``cycles`` times."""
    with hwlaunch.launch(_plan("fork", 4, cycles)) as executor:
        executor.collective_rpc(nap, args=(0.0,), setup=True)
        executor.collective_rpc("all_reduce_rank")
        before = _resources(helpers())
        times = []
        for cycle in range(cycles):
            victim = executor.pids[cycle % 4]
            killed = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            while True:
                try:
                    executor.collective_rpc("all_reduce_rank", timeout=60)
                    break
                except WorkerDiedError as exc:
                    if not exc.restarted:
                        raise
            times.append(time.monotonic() - killed)
            if cycle == 9:
                tenth = _resources(helpers())
        after = _resources(helpers())
        restarts = executor.restarts  # type: ignore[attr-defined]
    return {
        "cycles": cycles,
        "restarts": restarts,
        "before": before,
        "after_10": tenth if cycles >= 10 else None,
        "after": after,
        "after_shutdown": _resources(helpers()),
        "restart_s_median": statistics.median(times),
    }
