"""No world size the machine cannot hold: real limits, real processes.

``resolve()`` refuses a world size beyond the tasks, descriptors or memory this machine has
room for, before anything is allocated, naming the limit (``hwlaunch.planning.room``); a
worker whose process cannot be started for lack of room is a ``WorkerStartupError`` naming
it, with every worker started before it stopped.

The process limit is a real one: a pids cgroup (``pids.max``) that the driver runs in, as a
container's ``--pids-limit`` is (as root, where the cgroup filesystem can be written; skipped
elsewhere). The descriptor limit is the driver's own ``RLIMIT_NOFILE``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import hwlaunch
from hwlaunch.errors import ConfigError
from hwlaunch.planning.room import RANK_DRIVER_FDS, RANK_TASKS

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("clean_env")]


@pytest.mark.parametrize("world_size", [10**9, 10**23])
def test_a_world_size_no_machine_holds_is_refused_before_anything_is_allocated(
    world_size: int,
) -> None:
    began = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        hwlaunch.resolve(backend="cpu", world_size=world_size, executor="mp")
    assert time.monotonic() - began < 30  # refused, not built
    message = str(caught.value)
    assert f"world_size {world_size} (from resolve(world_size=)) does not fit" in message
    assert "Fix: world_size <= " in message
    assert any(name in message for name in ("pid_max", "pids.max", "RLIMIT_", "MemAvailable"))


def test_the_cli_refuses_it_with_exit_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hwlaunch.cli", "resolve", "--backend", "cpu", "-n", "1000000000"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("hwlaunch: error: world_size 1000000000 (from --world-size)")
    assert "Traceback" not in done.stderr


def test_ray_places_any_size_the_rule_leaves_it_to_ray() -> None:
    """A Ray plan is not held to this machine's limits (Ray checks its cluster's size)."""
    plan = hwlaunch.resolve(backend="cpu", world_size=10**6, executor="ray")
    assert plan.world_size == 10**6


def test_descriptor_limit_is_named(tmp_path: Path) -> None:
    script = tmp_path / "few_fds.py"
    script.write_text(
        textwrap.dedent(
            """\
            import resource, sys
            import hwlaunch
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
            try:
                hwlaunch.resolve(backend="cpu", world_size=8, executor="mp")
            except hwlaunch.ConfigError as exc:
                print(exc)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert "does not fit on this machine" in done.stdout, (done.stdout, done.stderr)
    assert "RLIMIT_NOFILE of this process (ulimit -n: 64" in done.stdout
    assert "8 workers need 72 file descriptors" in done.stdout


def test_what_the_rule_counts_per_worker_is_what_a_worker_takes() -> None:
    """The per-worker figures are a floor of what a real launch takes, so a refusal is never
    wrong: the driver's descriptors and each worker's tasks, counted on real workers."""
    counts = {}
    for size in (2, 4):
        before = len(os.listdir("/proc/self/fd"))
        with hwlaunch.launch(
            backend="cpu", world_size=size, start_method="fork", init_distributed=False
        ) as executor:
            counts[size] = len(os.listdir("/proc/self/fd")) - before
            tasks = [psutil.Process(pid).num_threads() for pid in executor.pids if pid]
        assert min(tasks) >= RANK_TASKS, tasks
    assert (counts[4] - counts[2]) / 2 >= RANK_DRIVER_FDS, counts


# -- a real process limit: a pids cgroup ---------------------------------------------------------
def _pids_hierarchy() -> Path | None:
    """Where the cgroup v1 pids controller is mounted, if this process may make groups in it."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[2] == "cgroup" and "pids" in fields[3].split(","):
            root = Path(fields[1])
            return root if os.access(root, os.W_OK) else None
    return None


@contextlib.contextmanager
def pids_cgroup(limit: int) -> Iterator[Path]:
    root = _pids_hierarchy()
    if root is None:
        pytest.skip("no writable cgroup v1 pids hierarchy (needs root)")
    group = root / f"hwlaunch-test-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()
    try:
        (group / "pids.max").write_text(str(limit))
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        deadline = time.monotonic() + 30
        while True:
            try:
                group.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


DRIVER = """\
import json, subprocess, sys, time
import hwlaunch
from hwlaunch.planning.room import probe_room


def main(method, world_size, leave):
    try:
        plan = hwlaunch.resolve(
            backend="cpu", world_size=world_size, executor="mp", start_method=method
        )
    except hwlaunch.ConfigError as exc:
        return {"resolve": str(exc)}
    sleepers = []
    while probe_room().tasks.free > leave:  # other programs take the room after the plan
        sleepers.append(subprocess.Popen(["sleep", "600"]))
    result = {"sleepers": [p.pid for p in sleepers]}
    try:
        hwlaunch.launch(plan, init_distributed=False).shutdown()
        result["launched"] = True
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))), flush=True)
    time.sleep(600)
"""


def run_driver(group: Path, tmp_path: Path, *args: str) -> tuple[dict[str, object], list[str]]:
    """The driver in ``group``; its JSON line, and every process left in the group then but
    the driver, the processes it started to take the room, and its helpers."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)

    def enter() -> None:
        (group / "cgroup.procs").write_text(str(os.getpid()))

    driver = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        preexec_fn=enter,
    )
    try:
        assert driver.stdout is not None
        result = json.loads(driver.stdout.readline())
        time.sleep(0.5)  # what the error left behind has had time to go
        sleepers = result.get("sleepers", [])
        assert isinstance(sleepers, list)
        pids = [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
        others = [pid for pid in pids if pid != driver.pid and pid not in sleepers]
        left = _described([pid for pid in others if not _helper(pid, driver.pid)])
    finally:
        driver.kill()
        driver.wait()
    return result, left


def _described(pids: list[int]) -> list[str]:
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            found.append(f"{pid} (parent {proc.ppid()}, {proc.status()}): {proc.cmdline()}")
    return found


def _helper(pid: int, driver: int) -> bool:
    """One of the driver's helpers, started once per driver and kept for its next launch: the
    standard library's resource tracker (spawn) and hwlaunch's fork server, its children."""
    try:
        proc = psutil.Process(pid)
        command = " ".join(proc.cmdline())
        parent = proc.ppid()
    except psutil.Error:
        return True  # gone
    helper = "resource_tracker" in command or "forkserver import main" in command
    return helper and parent == driver


def test_a_process_limit_is_named_at_resolve(tmp_path: Path) -> None:
    with pids_cgroup(40) as group:
        result, left = run_driver(group, tmp_path, "fork", "20", "0")
    message = str(result["resolve"])
    assert "world_size 20 (from resolve(world_size=)) does not fit on this machine" in message
    assert "20 workers need 60 tasks (3 tasks each" in message
    assert f"the cgroup's pids.max ({group}/pids.max: 40," in message
    assert left == []


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
@pytest.mark.parametrize("leave", [0, 5])
def test_a_start_that_runs_out_of_processes_names_the_limit_and_leaves_nothing(
    tmp_path: Path, method: str, leave: int
) -> None:
    """The room runs out between the plan and the start: the first worker cannot be forked
    (``leave`` 0), or one or two start and the next cannot (5)."""
    with pids_cgroup(120) as group:
        result, left = run_driver(group, tmp_path, method, "4", str(leave))
    error = str(result.get("error"))
    assert error.startswith("WorkerStartupError: worker rank "), result
    assert "pids.max" in error and "no room for more processes or threads" in error, error
    assert left == [], f"processes left in the group after the error: {left}"
