"""Process helpers shared by the tests that watch real worker processes and their children."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``predicate`` until true; return the seconds it took, fail after ``timeout``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.005)
    return time.monotonic() - start


def running(proc: psutil.Process) -> bool:
    """Alive and not a zombie (a reparented zombie may wait for a reaper that never comes)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def processes(pids: Iterable[int | None]) -> list[psutil.Process]:
    """The live processes among ``pids`` (None and vanished pids skipped)."""
    found = []
    for pid in pids:
        if pid is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                found.append(psutil.Process(pid))
    return found


def alive(procs: Iterable[psutil.Process]) -> list[int]:
    """The pids among ``procs`` still running."""
    return [p.pid for p in procs if running(p)]


def kill_all(procs: Iterable[psutil.Process]) -> list[int]:
    """Kill whatever is still running (a failed test's leftovers); return their pids."""
    left = alive(procs)
    for proc in procs:
        if running(proc):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
    return left


def run_json_script(
    script: Path,
    *args: str,
    drop_env: tuple[str, ...] = ("HWLAUNCH_",),
    timeout: float = 180,
) -> dict[str, Any]:
    """Run ``script`` in a fresh interpreter, in its own directory and without the variables
    that start with ``drop_env``; return the JSON object it printed last on stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop_env)}
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        cwd=script.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def mp_launch(worker_extension: type, **options: Any) -> Any:
    """cpu workers under the mp executor, without a process group: 2 of them over the shm
    channel unless ``options`` (``hwlaunch.launch`` keywords) say otherwise."""
    import hwlaunch

    settings: dict[str, Any] = {
        "backend": "cpu",
        "executor": "mp",
        "world_size": 2,
        "rpc_channel": "shm",
        "init_distributed": False,
    }
    return hwlaunch.launch(worker_extension=worker_extension, **(settings | options))


def channel_memory(pid: int, parent: int) -> tuple[int, int]:
    """How many mappings and descriptors process ``pid`` has of the memory files of
    ``parent``'s shm channels (``hwlaunch-<parent>-rpc``, its spill files included)."""
    mark = f"hwlaunch-{parent}-rpc"
    maps = Path(f"/proc/{pid}/maps").read_text().count(mark)
    links = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            links += mark in os.readlink(f"/proc/{pid}/fd/{fd}")
    return maps, links


def takes_turns(addresses: list[int]) -> bool:
    """Whether consecutive messages' ``addresses`` alternate between exactly two places (the
    shm channel's *alternate areas*)."""
    return len(set(addresses)) == 2 and len(set(addresses[0::2])) == len(set(addresses[1::2])) == 1


def shm_entries(pid: int) -> list[str]:
    """What a parent of this pid would have named in /dev/shm (others' entries are not ours)."""
    return [name for name in os.listdir("/dev/shm") if f"hwlaunch-{pid}" in name]


def private_temp(env: dict[str, str], folder: Path) -> dict[str, str]:
    """``env`` with ``folder`` (created) as TMPDIR: a parent program's temporary files
    (multiprocessing's folder, a fork server's socket) go there, where a test sees any left."""
    folder.mkdir(exist_ok=True)
    return env | {"TMPDIR": str(folder)}


def left_in(folder: Path) -> list[str]:
    """Everything under ``folder``, relative to it."""
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def assert_emptied(folder: Path, timeout: float) -> None:
    """Wait until nothing is left under ``folder``; fail naming what is."""
    with contextlib.suppress(AssertionError):
        wait_until(lambda: left_in(folder) == [], timeout, f"{folder} to empty")
    assert left_in(folder) == [], f"left in {folder}"


@contextlib.contextmanager
def parent_program(
    command: list[str], **popen: Any
) -> Iterator[tuple[subprocess.Popen[str], list[psutil.Process]]]:
    """A parent program whose first line on stdout is ``{"workers": [pid, ...]}``: yields the
    process and its workers; whatever of them still runs at the end is killed."""
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    )
    workers: list[psutil.Process] = []
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        workers = processes(json.loads(line)["workers"])
        yield proc, workers
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        kill_all(workers)
