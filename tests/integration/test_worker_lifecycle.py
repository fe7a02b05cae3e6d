"""Operating the workers, with real processes: the stall watchdog, stacks on demand and in
RpcTimeoutError, the shutdown grace and its escalation, the orderly end of workers whose
driver was killed, and signals forwarded to every worker.

Each rank that should look stuck sleeps in ``stuck_in_allreduce_wait``, a function the stacks
must name. Workers prove that their ``shutdown()`` ran by writing a marker file.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import psutil
import pytest
from processes import alive, kill_all, processes, wait_until

import hwlaunch
from hwlaunch.errors import ConfigError, PluginError, RpcTimeoutError
from hwlaunch.worker import Worker

# The worker extension and the functions sent to workers travel by value (spawn re-imports
# no test module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

METHODS = ["fork", "spawn"]
STUCK = "stuck_in_allreduce_wait"


def stuck_in_allreduce_wait(seconds: float) -> None:
    time.sleep(seconds)


def rank_one_stalls(worker: Worker, seconds: float) -> int:
    if worker.rank == 1:
        stuck_in_allreduce_wait(seconds)
    return worker.rank


class Lifecycle:
    """Mixed into the cpu worker: a shutdown that takes a while and leaves a marker, and a
    SIGUSR1 handler that leaves one too."""

    marker_dir = ""
    shutdown_seconds = 0.0

    def configure(self, marker_dir: str, shutdown_seconds: float = 0.0) -> int:
        self.marker_dir, self.shutdown_seconds = marker_dir, shutdown_seconds
        return os.getpid()

    def catch_sigusr1(self) -> None:
        rank, where = self.rank, self.marker_dir  # type: ignore[attr-defined]

        def note(signum: int, frame: Any) -> None:
            Path(where, f"sigusr1-{rank}").write_text(str(os.getpid()))

        signal.signal(signal.SIGUSR1, note)

    def handle_signal(self, signum: int) -> None:
        """forward_signals' hook: runs on the worker's main thread, also in a Ray actor."""
        name = signal.Signals(signum).name.lower()
        if self.marker_dir:
            Path(self.marker_dir, f"hook-{name}-{self.rank}").write_text(str(os.getpid()))  # type: ignore[attr-defined]

    def shutdown(self) -> None:
        time.sleep(self.shutdown_seconds)
        super().shutdown()  # type: ignore[misc]
        if self.marker_dir:
            Path(self.marker_dir, f"shutdown-{self.rank}").write_text(str(os.getpid()))  # type: ignore[attr-defined]


@pytest.fixture
def hwlaunch_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="hwlaunch")
    return caplog


def warnings_of(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


# -- settings ------------------------------------------------------------------------------
def test_operation_settings_carry_their_source(clean_env: Path, monkeypatch: Any) -> None:
    plan = hwlaunch.resolve(backend="cpu", world_size=2)
    assert (plan.rpc_warn_after, plan.shutdown_timeout, plan.forward_signals) == (60.0, 5.0, ())
    assert plan.decision("shutdown_timeout").source == "default"
    monkeypatch.setenv("HWLAUNCH_SHUTDOWN_TIMEOUT", "12")
    monkeypatch.setenv("HWLAUNCH_FORWARD_SIGNALS", "usr1, SIGTERM")
    plan = hwlaunch.resolve(backend="cpu", world_size=2, rpc_warn_after=0)
    assert plan.decision("shutdown_timeout").source == "env HWLAUNCH_SHUTDOWN_TIMEOUT"
    assert plan.shutdown_timeout == 12.0 and plan.rpc_warn_after == 0.0
    assert plan.forward_signals == ("SIGUSR1", "SIGTERM")
    (clean_env / "hwlaunch.toml").write_text("[backends.cpu]\nshutdown_timeout = 9\n")
    monkeypatch.delenv("HWLAUNCH_SHUTDOWN_TIMEOUT")
    plan = hwlaunch.resolve(backend="cpu", world_size=2)
    assert plan.shutdown_timeout == 9.0
    assert "hwlaunch.toml" in plan.decision("shutdown_timeout").source


def test_hpu_declares_a_longer_shutdown_grace(clean_env: Path) -> None:
    plan = hwlaunch.resolve(
        backend="hpu", world_size=2, assume={"hpu.available": True, "hpu.device_count": 2}
    )
    assert plan.shutdown_timeout == 30.0
    assert plan.decision("shutdown_timeout").source == "rule of backend hpu"


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        (
            "HWLAUNCH_RPC_WARN_AFTER",
            "soon",
            r"invalid rpc_warn_after 'soon' from env HWLAUNCH_RPC_WARN_AFTER",
        ),
        (
            "HWLAUNCH_SHUTDOWN_TIMEOUT",
            "0",
            r"invalid shutdown_timeout '0' from env HWLAUNCH_SHUTDOWN_TIMEOUT: must be >= 0.001",
        ),
        (
            "HWLAUNCH_FORWARD_SIGNALS",
            "SIGUSR3",
            r"'SIGUSR3' is not a signal hwlaunch forwards; did you mean 'SIGUSR2'\? \(allowed: SIGINT, .*SIGUSR1",
        ),
        ("HWLAUNCH_FORWARD_SIGNALS", "SIGKILL", r"'SIGKILL' is not a signal .*\(allowed:"),
    ],
)
def test_bad_operation_settings_name_value_and_source(
    clean_env: Path, monkeypatch: Any, variable: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=expected):
        hwlaunch.resolve(backend="cpu", world_size=2)


def test_backend_spec_shutdown_timeout_is_checked() -> None:
    from hwlaunch import BackendSpec, StartMethodRule

    with pytest.raises(PluginError, match=r"'shutdown_timeout': -1 must be seconds > 0"):
        BackendSpec(
            name="npu",
            device_type="npu",
            priority=1,
            is_available=lambda: True,
            device_count=lambda: 1,
            is_initialized=lambda: False,
            start_methods=StartMethodRule(allowed=("spawn",), default="spawn"),
            dist_backend="gloo",
            worker="x.y:Z",
            shutdown_timeout=-1,
        )


# -- the stall watchdog and stacks ---------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_stall_warning_names_the_silent_rank_and_its_function(
    clean_env: Path, hwlaunch_log: pytest.LogCaptureFixture, method: str
) -> None:
    with hwlaunch.launch(
        backend="cpu", world_size=2, start_method=method, rpc_warn_after=1
    ) as workers:
        assert workers.collective_rpc(rank_one_stalls, args=(4.0,)) == [0, 1]
    found = warnings_of(hwlaunch_log, "collective_rpc 'rank_one_stalls' has waited")
    assert len(found) >= 2, found  # at 1 s, then again at 2 s: the call went on
    first = found[0]
    assert "for ranks [1]" in first and "--- stack of rank 1 ---" in first
    assert f"in {STUCK}" in first and "--- stack of rank 0 ---" not in first
    assert "rpc_warn_after from resolve(rpc_warn_after=)" in first
    assert "the next warning comes at 2s" in first


def test_no_stall_warning_when_turned_off(
    clean_env: Path, hwlaunch_log: pytest.LogCaptureFixture
) -> None:
    with hwlaunch.launch(backend="cpu", world_size=2, rpc_warn_after=0) as workers:
        assert workers.collective_rpc(rank_one_stalls, args=(1.5,)) == [0, 1]
    assert warnings_of(hwlaunch_log, "has waited") == []


@pytest.mark.parametrize("method", METHODS)
def test_timeout_error_carries_the_stuck_ranks_stacks(clean_env: Path, method: str) -> None:
    workers = hwlaunch.launch(backend="cpu", world_size=2, start_method=method)
    try:
        with pytest.raises(RpcTimeoutError) as caught:
            workers.collective_rpc(rank_one_stalls, args=(60.0,), timeout=1.0)
    finally:
        workers.shutdown()
    error = caught.value
    assert error.ranks == [1] and list(error.stacks) == [1]
    assert f"in {STUCK}" in error.stacks[1] and 'Thread "MainThread"' in error.stacks[1]
    assert "--- stack of rank 1 ---" in str(error) and STUCK in str(error)
    again = pickle.loads(pickle.dumps(error))
    assert again.stacks == error.stacks and str(again) == str(error)


@pytest.mark.parametrize("method", METHODS)
def test_dump_stacks_on_demand_during_a_call(clean_env: Path, method: str) -> None:
    with hwlaunch.launch(
        backend="cpu", world_size=2, start_method=method, rpc_warn_after=0
    ) as workers:
        idle = workers.dump_stacks()
        assert sorted(idle) == [0, 1] and all("hwlaunch-death-pipe" in t for t in idle.values())
        pending = workers.collective_rpc(rank_one_stalls, args=(3.0,), non_block=True)
        wait_until(lambda: STUCK in workers.dump_stacks([1])[1], 20, "rank 1 in the call")
        assert STUCK not in workers.dump_stacks([0])[0]
        assert pending.result(timeout=30) == [0, 1]
        with pytest.raises(ValueError, match=r"dump_stacks\(ranks=\[2\]\): not ranks of this"):
            workers.dump_stacks([2])


# -- the shutdown grace --------------------------------------------------------------------
def test_slow_shutdown_finishes_under_a_larger_grace(
    clean_env: Path, tmp_path: Path, hwlaunch_log: pytest.LogCaptureFixture
) -> None:
    workers = hwlaunch.launch(
        backend="cpu", world_size=2, worker_extension=Lifecycle, shutdown_timeout=20
    )
    workers.collective_rpc("configure", args=(str(tmp_path), 6.0))
    workers.shutdown()
    assert sorted(p.name for p in tmp_path.glob("shutdown-*")) == ["shutdown-0", "shutdown-1"]
    assert warnings_of(hwlaunch_log, "shutdown_timeout") == []


def test_slow_shutdown_is_ended_under_the_default_grace(
    clean_env: Path, tmp_path: Path, hwlaunch_log: pytest.LogCaptureFixture
) -> None:
    workers = hwlaunch.launch(backend="cpu", world_size=2, worker_extension=Lifecycle)
    pids = workers.collective_rpc("configure", args=(str(tmp_path), 30.0))
    workers.shutdown()
    assert list(tmp_path.glob("shutdown-*")) == []
    assert alive(processes(pids)) == []
    for rank, pid in enumerate(pids):
        assert (
            f"worker rank {rank} (pid {pid}) did not finish its shutdown() within the 5s "
            "shutdown_timeout: SIGTERM"
        ) in hwlaunch_log.text


# -- the driver dies -----------------------------------------------------------------------
DRIVER = """
    import json, os, subprocess, sys, time
    from pathlib import Path
    import hwlaunch

    class LeavesMarker:
        def shutdown(self):
            super().shutdown()
            Path(sys.argv[2], f"shutdown-{self.rank}").write_text(str(os.getpid()))

    def start_a_child(worker):
        return os.getpid(), subprocess.Popen(["sleep", "600"]).pid

    if __name__ == "__main__":
        workers = hwlaunch.launch(
            backend="cpu", world_size=2, start_method=sys.argv[1], worker_extension=LeavesMarker
        )
        print(json.dumps(workers.collective_rpc(start_a_child)), flush=True)
        time.sleep(600)
"""


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[tuple[Path, list[psutil.Process]]]:
    """A driver program (a subprocess of its own); whatever it started is killed at the end."""
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(DRIVER))
    started: list[psutil.Process] = []
    yield script, started
    assert kill_all(started) == [], "processes outlived the driver"


@pytest.mark.parametrize("method", [*METHODS, "forkserver"])
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_workers_shut_down_when_the_driver_is_killed(
    clean_env: Path,
    tmp_path: Path,
    driver: tuple[Path, list[psutil.Process]],
    method: str,
    how: signal.Signals,
) -> None:
    script, started = driver
    markers = tmp_path / "markers"
    markers.mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(script), method, str(markers)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    report = json.loads(proc.stdout.readline())  # [[worker pid, its child's pid], ...]
    started += processes([pid for pair in report for pid in pair])
    proc.send_signal(how)
    assert proc.wait(30) == -how
    wait_until(lambda: not alive(started), 30, "the workers and their children to end")
    assert sorted(p.name for p in markers.iterdir()) == ["shutdown-0", "shutdown-1"]


# -- forwarded signals ---------------------------------------------------------------------
def test_forwarded_sigusr1_reaches_every_worker(clean_env: Path, tmp_path: Path) -> None:
    received: list[int] = []
    before = signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
    try:
        with hwlaunch.launch(
            backend="cpu", world_size=2, worker_extension=Lifecycle, forward_signals="SIGUSR1"
        ) as workers:
            workers.collective_rpc("configure", args=(str(tmp_path),))
            workers.collective_rpc("catch_sigusr1")
            os.kill(os.getpid(), signal.SIGUSR1)
            wait_until(lambda: len(list(tmp_path.glob("sigusr1-*"))) == 2, 20, "both workers")
            assert received == [signal.SIGUSR1]  # the program's own handler still runs
        assert signal.getsignal(signal.SIGUSR1) is not None
        assert signal.getsignal(signal.SIGUSR1).__name__ == "<lambda>"  # type: ignore[union-attr]
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_a_forwarded_signal_calls_the_workers_handle_signal(
    clean_env: Path, tmp_path: Path
) -> None:
    """A worker that defines handle_signal needs no handler of its own; one without it
    would die of SIGUSR1's default action, as a worker without a handler does."""
    before = signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    try:
        with hwlaunch.launch(
            backend="cpu", world_size=2, worker_extension=Lifecycle, forward_signals="SIGUSR1"
        ) as workers:
            pids = workers.collective_rpc("configure", args=(str(tmp_path),))
            os.kill(os.getpid(), signal.SIGUSR1)
            wait_until(lambda: len(list(tmp_path.glob("hook-*"))) == 2, 20, "both hooks")
            assert workers.collective_rpc("ping") == pids  # both still serve calls
        assert sorted(p.read_text() for p in tmp_path.glob("hook-sigusr1-*")) == sorted(
            str(pid) for pid in pids
        )
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_a_restarting_executor_watches_stacks_and_forwards_too(
    clean_env: Path, tmp_path: Path, hwlaunch_log: pytest.LogCaptureFixture
) -> None:
    """With max_restarts the calls, stacks and signals go to the current group."""
    received: list[int] = []
    before = signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
    try:
        with hwlaunch.launch(
            backend="cpu",
            world_size=2,
            worker_extension=Lifecycle,
            max_restarts=1,
            rpc_warn_after=1,
            forward_signals="SIGUSR1",
        ) as workers:
            workers.collective_rpc("configure", args=(str(tmp_path),))
            workers.collective_rpc("catch_sigusr1")
            assert workers.collective_rpc(rank_one_stalls, args=(2.5,)) == [0, 1]
            os.kill(os.getpid(), signal.SIGUSR1)
            wait_until(lambda: len(list(tmp_path.glob("sigusr1-*"))) == 2, 20, "both workers")
            assert sorted(workers.dump_stacks()) == [0, 1]
        first = warnings_of(hwlaunch_log, "collective_rpc 'rank_one_stalls' has waited")[0]
        assert "for ranks [1]" in first and f"in {STUCK}" in first
        assert received == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_forward_signals_needs_the_main_thread(clean_env: Path) -> None:
    found: list[BaseException] = []

    def launch_here() -> None:
        try:
            hwlaunch.launch(backend="cpu", world_size=2, forward_signals="SIGUSR1").shutdown()
        except BaseException as exc:
            found.append(exc)

    thread = threading.Thread(target=launch_here)
    thread.start()
    thread.join(60)
    assert len(found) == 1 and isinstance(found[0], ConfigError)
    assert "forward_signals SIGUSR1 needs launch() in the main thread" in str(found[0])


def test_no_handler_is_installed_unless_asked(clean_env: Path) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    with hwlaunch.launch(backend="cpu", world_size=2):
        assert {s: signal.getsignal(s) for s in before} == before


# -- uni (last of the in-process tests: its worker imports torch in this process, whose
# thread pools make a later fork fall back to forkserver) ---------------------------------
def test_uni_dump_stacks_shows_the_worker_thread(clean_env: Path) -> None:
    before = signal.getsignal(signal.SIGUSR1)
    plan = hwlaunch.resolve(backend="cpu", world_size=1, executor="uni", forward_signals="USR1")
    with hwlaunch.launch(plan) as workers:
        assert signal.getsignal(signal.SIGUSR1) == before  # its worker is this process
        assert any("forward_signals SIGUSR1 is not used" in w for w in workers.warnings)
        pending = workers.collective_rpc(
            lambda worker: stuck_in_allreduce_wait(2.0), non_block=True
        )
        wait_until(lambda: STUCK in workers.dump_stacks()[0], 10, "the worker thread in the call")
        assert 'Thread "hwlaunch-uni-worker"' in workers.dump_stacks()[0]
        pending.result(timeout=10)


def test_uni_logs_a_shutdown_past_its_grace(
    clean_env: Path, tmp_path: Path, hwlaunch_log: pytest.LogCaptureFixture
) -> None:
    workers = hwlaunch.launch(
        backend="cpu", world_size=1, executor="uni", worker_extension=Lifecycle, shutdown_timeout=1
    )
    workers.collective_rpc("configure", args=(str(tmp_path), 3.0))
    workers.shutdown()
    assert (
        f"worker rank 0 (in this process, pid {os.getpid()}) did not finish its shutdown() "
        "within the 1s shutdown_timeout"
    ) in hwlaunch_log.text
    wait_until(lambda: (tmp_path / "shutdown-0").exists(), 20, "the worker thread's shutdown")


# -- Ray -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One local Ray instance (loopback only) for the Ray tests; ended with the module."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.ray
def test_ray_actors_stall_warning_and_timeout_stacks(
    clean_env: Path, local_ray: None, hwlaunch_log: pytest.LogCaptureFixture
) -> None:
    plan = hwlaunch.resolve(backend="cpu", world_size=2, executor="ray", rpc_warn_after=1)
    workers = hwlaunch.launch(plan)
    try:
        assert workers.collective_rpc(rank_one_stalls, args=(3.0,)) == [0, 1]
        first = warnings_of(hwlaunch_log, "collective_rpc 'rank_one_stalls' has waited")[0]
        assert "for ranks [1]" in first and f"in {STUCK}" in first
        pending = workers.collective_rpc(rank_one_stalls, args=(3.0,), non_block=True)
        wait_until(lambda: STUCK in workers.dump_stacks([1])[1], 20, "rank 1 in the call")
        assert pending.result(timeout=30) == [0, 1]
        with pytest.raises(RpcTimeoutError) as caught:
            workers.collective_rpc(rank_one_stalls, args=(60.0,), timeout=2.0)
        assert list(caught.value.stacks) == [1] and STUCK in caught.value.stacks[1]
    finally:
        workers.shutdown()


@pytest.mark.ray
def test_ray_actors_get_forwarded_signals_while_a_call_runs(
    clean_env: Path, local_ray: None, tmp_path: Path
) -> None:
    """The handler runs on the actor's main thread while rank 1 is busy in a call on another."""
    before = signal.signal(signal.SIGUSR2, lambda signum, frame: None)
    workers = hwlaunch.launch(
        backend="cpu",
        world_size=2,
        executor="ray",
        worker_extension=Lifecycle,
        forward_signals="SIGUSR2",
    )
    try:
        assert not any("forward_signals" in w for w in workers.warnings)
        pids = workers.collective_rpc("configure", args=(str(tmp_path),))
        pending = workers.collective_rpc(rank_one_stalls, args=(5.0,), non_block=True)
        wait_until(lambda: STUCK in workers.dump_stacks([1])[1], 20, "rank 1 in the call")
        os.kill(os.getpid(), signal.SIGUSR2)
        wait_until(lambda: len(list(tmp_path.glob("hook-sigusr2-*"))) == 2, 20, "both actors")
        assert not pending.done()  # rank 1 got it in the middle of its call
        assert sorted(p.read_text() for p in tmp_path.glob("hook-*")) == sorted(map(str, pids))
        assert pending.result(timeout=30) == [0, 1]
    finally:
        workers.shutdown()
        signal.signal(signal.SIGUSR2, before)
    assert signal.getsignal(signal.SIGUSR2) is not None
