"""The mp executor with real worker processes, real signals and real parents, per start method.

Every test that starts workers checks, through psutil, that none of them is left afterwards, and
the fixtures kill what a failing test left behind. Nothing here sleeps to synchronise: a test
waits for evidence (a marker file, a process state) with a deadline.
"""

from __future__ import annotations

import ctypes
import dataclasses
import faulthandler
import gc
import hashlib
import json
import multiprocessing
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch  # imported here so that fork workers inherit it instead of importing it each
from processes import (
    alive,
    assert_emptied,
    kill_all,
    left_in,
    private_temp,
    processes,
    wait_until,
)

import hwlaunch
from hwlaunch import (
    Executor,
    MissingMainGuardError,
    Plan,
    RpcTimeoutError,
    Worker,
    WorkerDiedError,
    WorkerError,
    WorkerStartupError,
)

METHODS = ["fork", "spawn", "forkserver"]
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
PYTHON_BOOTSTRAP_ERROR = "An attempt has been made to start a new process before"
ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

pytestmark = pytest.mark.timeout(120)


# -- what the workers run ------------------------------------------------------------------
class Probe:
    """Worker extension used throughout: its methods are called by name."""

    rank: int

    def echo(self, value: Any, *, tag: str | None = None) -> tuple[int, Any, str | None]:
        return self.rank, value, tag

    def env(self, *names: str) -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in (*ENV_KEYS, *names)}

    def nap(self, seconds_by_rank: dict[int, float], marker_dir: str | None = None) -> int:
        """Sleep as long as this rank is told, after touching ``<marker_dir>/rank<N>``."""
        if marker_dir is not None:
            Path(marker_dir, f"rank{self.rank}").touch()
        time.sleep(seconds_by_rank.get(self.rank, 0.0))
        return self.rank

    def start_child(self) -> tuple[int, int | None]:
        """Start multiprocessing children (impossible in a daemonic process).

        Returns the first child's answer, and the exit code of a second one ended with
        SIGTERM (which must be -15: the worker's own SIGTERM handler is not inherited).
        """
        ctx = multiprocessing.get_context("fork")
        queue = ctx.SimpleQueue()
        child = ctx.Process(target=child_main, args=(queue, self.rank))
        child.start()
        answer = int(queue.get())
        child.join(60)
        assert child.exitcode == 0, child.exitcode
        sleeper = ctx.Process(target=child_main, args=(queue, self.rank, 60.0))
        sleeper.start()
        queue.get()  # it is running its own code now
        sleeper.terminate()
        sleeper.join(60)
        return answer, sleeper.exitcode

    def compile_and_run(self) -> tuple[list[float], list[int]]:
        """torch.compile (the default inductor backend) on a tiny function; also returns this
        worker's child processes then (inductor's compile workers, when it starts any)."""

        def f(x: torch.Tensor) -> torch.Tensor:
            return torch.sin(x) * 2 + self.rank

        compiled = torch.compile(f)
        x = torch.arange(6, dtype=torch.float32)
        out = compiled(x)
        torch.testing.assert_close(out, f(x))
        descendants = [p.pid for p in psutil.Process().children(recursive=True)]
        return out.tolist(), descendants


def child_main(queue: Any, rank: int, then_sleep: float = 0.0) -> None:
    queue.put(100 + rank)
    time.sleep(then_sleep)


def rank_and_pid(worker: Worker) -> tuple[int, int]:
    """A plain function of this module: cloudpickle sends it by reference."""
    return worker.rank, os.getpid()


def explode(worker: Worker, message: str) -> int:
    if worker.rank == 1:
        raise ValueError(message)
    return worker.rank


class FailOnRankTwo:
    """init_device fails on rank 2 once every rank has started and left its pid."""

    rank: int
    world_size: int

    def init_device(self) -> None:
        markers = Path(os.environ["HWL_TEST_MARKERS"])
        (markers / f"pid-{os.getpid()}").touch()
        if self.rank == 2:
            wait_until(
                lambda: len(list(markers.glob("pid-*"))) == self.world_size, 60, "every rank"
            )
            raise RuntimeError("rank 2 cannot initialize its device")
        super().init_device()  # type: ignore[misc]


# -- process helpers -----------------------------------------------------------------------


def resolve_clean(**kwargs: Any) -> Plan:
    """resolve() without HWLAUNCH_* variables or a config file of the working directory."""
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("HWLAUNCH_"):
                mp.delenv(name)
        mp.chdir(SCRIPTS)
        return hwlaunch.resolve(backend="cpu", **kwargs)


class Launcher:
    """Starts executors for one test and guarantees that none of their workers survives it."""

    def __init__(self) -> None:
        self.started: list[tuple[Executor, list[psutil.Process]]] = []

    def __call__(
        self,
        method: str,
        world_size: int = 2,
        *,
        env: dict[str, str] | None = None,
        **launch_kwargs: Any,
    ) -> Executor:
        plan = resolve_clean(world_size=world_size, executor="mp", start_method=method)
        if env:
            plan = dataclasses.replace(plan, env={**plan.env, **env})
        executor = hwlaunch.launch(plan, **launch_kwargs)
        self.started.append((executor, processes(executor.pids)))  # type: ignore[attr-defined]
        return executor

    def close(self) -> None:
        leftovers = []
        for executor, procs in self.started:
            executor.shutdown()
            leftovers += kill_all(procs)
        assert not leftovers, f"workers still running after shutdown: {leftovers}"


@pytest.fixture
def launch() -> Iterator[Launcher]:
    launcher = Launcher()
    yield launcher
    launcher.close()


@pytest.fixture(scope="module", params=METHODS)
def shared(request: pytest.FixtureRequest) -> Iterator[Executor]:
    """One executor of 3 workers per start method, for the tests that leave it usable."""
    launcher = Launcher()
    try:
        yield launcher(request.param, world_size=3, worker_extension=Probe)
    finally:
        launcher.close()


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    path = tmp_path / "markers"
    path.mkdir()
    return path


def run_script(args: list[str], cwd: Path, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


# -- 1. results, callables, methods, extensions, payloads -----------------------------------
def test_results_come_in_rank_order(shared: Executor) -> None:
    pids = shared.collective_rpc("ping")
    assert pids == shared.pids  # type: ignore[attr-defined]
    assert len(set(pids)) == 3 and os.getpid() not in pids
    assert shared.collective_rpc(rank_and_pid) == [(r, pids[r]) for r in range(3)]


def test_callables_travel_by_value(shared: Executor) -> None:
    offset = 40

    def closure(worker: Worker, extra: int, *, scale: int = 1) -> int:
        return (worker.rank + offset + extra) * scale

    assert shared.collective_rpc(lambda w: w.rank * 10) == [0, 10, 20]
    assert shared.collective_rpc(closure, args=(2,), kwargs={"scale": 3}) == [126, 129, 132]


def test_named_methods_with_kwargs(shared: Executor) -> None:
    got = shared.collective_rpc("echo", args=("x",), kwargs={"tag": "t"})
    assert got == [(0, "x", "t"), (1, "x", "t"), (2, "x", "t")]
    with pytest.raises(WorkerError) as info:
        shared.collective_rpc("no_such_method")
    assert info.value.exc_type == "AttributeError"
    assert "no public method 'no_such_method'" in info.value.message


def test_megabyte_payload_round_trip(shared: Executor) -> None:
    payload = os.urandom(1 << 20)
    replies = shared.collective_rpc("echo", args=(payload,))
    assert [r[0] for r in replies] == [0, 1, 2]
    digest = hashlib.sha256(payload).hexdigest()
    assert all(hashlib.sha256(r[1]).hexdigest() == digest for r in replies)


@pytest.mark.parametrize("method", METHODS)
def test_worker_extension_by_import_path(
    method: str, launch: Launcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(SCRIPTS))
    executor = launch(method, worker_extension="hwl_ext:Greeter", init_distributed=False)
    got = executor.collective_rpc("greet", args=("ada",), kwargs={"punctuation": "?"})
    assert got == ["hello ada from rank 0?", "hello ada from rank 1?"]


# -- 2. exceptions in a worker -------------------------------------------------------------
def test_worker_exception_is_reported_and_executor_stays_usable(shared: Executor) -> None:
    pids = shared.pids  # type: ignore[attr-defined]
    with pytest.raises(WorkerError) as info:
        shared.collective_rpc(explode, args=("kaboom",))
    err = info.value
    assert (err.rank, err.exc_type, err.message) == (1, "ValueError", "kaboom")
    assert "in explode" in err.remote_traceback and "ValueError: kaboom" in err.remote_traceback
    assert "rank 1 raised ValueError: kaboom" in str(err)
    assert shared.collective_rpc("ping") == pids


# -- 3. a worker dies during an RPC --------------------------------------------------------
def _fault(kind: str) -> Callable[[Worker, str], None]:
    """Both ranks enter and touch ``rank<N>``; then rank 1 meets its fault (sigkill: the test's)
    and, just before it, writes the time (CLOCK_MONOTONIC is machine-wide) to ``fault-at``."""

    def fault(worker: Worker, marker_dir: str) -> None:
        markers = Path(marker_dir)
        (markers / f"rank{worker.rank}").touch()
        if worker.rank == 1 and kind != "sigkill":
            while not (markers / "rank0").exists():
                time.sleep(0.005)
            (markers / "fault-at").write_text(repr(time.monotonic()))
            if kind == "exit3":
                os._exit(3)
            faulthandler.disable()  # a fork worker inherits pytest's: no dump on the terminal
            ctypes.string_at(0)
        time.sleep(60)

    return fault


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    ("kind", "exitcode", "text"),
    [
        ("sigkill", -signal.SIGKILL, "SIGKILL"),
        ("exit3", 3, "exited with code 3"),
        ("segfault", -signal.SIGSEGV, "SIGSEGV"),
    ],
)
def test_worker_death_fails_the_rpc_at_once(
    method: str, kind: str, exitcode: int, text: str, launch: Launcher, markers: Path
) -> None:
    executor = launch(method, init_distributed=False)
    pids = executor.pids  # type: ignore[attr-defined]
    procs = processes(pids)

    def killer() -> None:
        wait_until(lambda: len(list(markers.iterdir())) == 2, 60, "both ranks in the RPC")
        (markers / "fault-at").write_text(repr(time.monotonic()))
        os.kill(pids[1], signal.SIGKILL)

    if kind == "sigkill":
        threading.Thread(target=killer, daemon=True).start()
    with pytest.raises(WorkerDiedError) as info:
        executor.collective_rpc(_fault(kind), args=(str(markers),), timeout=90)
    detected = time.monotonic() - float((markers / "fault-at").read_text())
    print(f"figure: {method} {kind}: WorkerDiedError {detected * 1000:.0f} ms after the fault")
    err = info.value
    assert (err.rank, err.pid, err.exitcode) == (1, pids[1], exitcode)
    assert text in str(err)
    assert detected < 1.0  # the RPC itself would have taken 60 s
    assert alive(procs) == []  # the error is raised once the others are shut down
    start = time.monotonic()
    for _ in range(3):
        with pytest.raises(WorkerDiedError) as again:
            executor.collective_rpc("ping")
        assert again.value.rank == 1
    with pytest.raises(WorkerDiedError):
        executor.check_health()
    assert time.monotonic() - start < 0.5


# -- 4. timeouts ---------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_rpc_timeout_names_method_and_silent_ranks(method: str, launch: Launcher) -> None:
    executor = launch(method, worker_extension=Probe, init_distributed=False)
    procs = processes(executor.pids)  # type: ignore[attr-defined]
    start = time.monotonic()
    with pytest.raises(RpcTimeoutError) as info:
        executor.collective_rpc("nap", args=({1: 60.0},), timeout=1.0)
    took = time.monotonic() - start
    print(f"figure: {method} timeout of 1 s raised and cleaned up after {took:.2f} s")
    err = info.value
    assert (err.method, err.ranks, err.timeout) == ("nap", [1], 1.0)
    assert "'nap'" in str(err) and "[1]" in str(err)
    assert took < 5.0
    assert alive(procs) == []
    with pytest.raises(hwlaunch.ExecutorClosedError, match="shut down"):
        executor.collective_rpc("ping")


# -- 5. start-up failures ------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_startup_error_when_extension_import_fails(
    method: str, launch: Launcher, markers: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(SCRIPTS))
    with pytest.raises(WorkerStartupError) as info:
        launch(method, env={"HWL_TEST_MARKERS": str(markers)}, worker_extension="hwl_ext_broken:X")
    err = info.value
    assert "RuntimeError: hwl_ext_broken fails at import on purpose" in err.reason
    assert "hwl_ext_broken.py" in err.remote_traceback
    pids = [int(p.name.removeprefix("pid-")) for p in markers.iterdir()]
    assert err.rank in (0, 1) and len(pids) == 2
    gone_in = wait_until(lambda: alive(processes(pids)) == [], 3, "the workers to end")
    assert gone_in < 0.5  # the error is raised after the clean-up, so they are already gone


@pytest.mark.parametrize("method", METHODS)
def test_startup_error_when_rank_two_of_four_fails(
    method: str, launch: Launcher, markers: Path
) -> None:
    start = time.monotonic()
    with pytest.raises(WorkerStartupError) as info:
        launch(
            method,
            world_size=4,
            worker_extension=FailOnRankTwo,
            env={"HWL_TEST_MARKERS": str(markers)},
        )
    print(
        f"figure: {method} start-up failure of rank 2/4 raised after {time.monotonic() - start:.2f} s"
    )
    err = info.value
    assert err.rank == 2
    assert "RuntimeError: rank 2 cannot initialize its device" in str(err)
    assert "in init_device" in err.remote_traceback
    pids = [int(p.name.removeprefix("pid-")) for p in markers.iterdir()]
    assert len(pids) == 4
    assert alive(processes(pids)) == []


def test_startup_death_without_exception_is_reported(launch: Launcher) -> None:
    class ExitsWhileStarting:
        rank: int

        def init_device(self) -> None:
            if self.rank == 1:
                os._exit(7)
            super().init_device()  # type: ignore[misc]

    with pytest.raises(WorkerStartupError) as info:
        launch("fork", worker_extension=ExitsWhileStarting, startup_timeout=60)
    assert info.value.rank == 1
    assert "exited with code 7" in str(info.value)


# -- 6. the parent dies; a launch from a short-lived thread --------------------------------
def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"no output within {timeout}s; stderr:\n{err}")
    return proc.stdout.readline()


@pytest.fixture
def busy_parent(
    markers: Path,
) -> Iterator[Callable[[str], tuple[subprocess.Popen[str], list[psutil.Process]]]]:
    """Runs scripts/busy_parent.py; returns it once both its workers are inside the long RPC."""
    started: list[tuple[subprocess.Popen[str], list[psutil.Process]]] = []

    def start(method: str) -> tuple[subprocess.Popen[str], list[psutil.Process]]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}
        env = private_temp(env, markers.parent / "temp")
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPTS / "busy_parent.py"), method, str(markers)],
            cwd=markers,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append((proc, []))
        info = json.loads(_read_line(proc, 90))
        workers = processes(info["workers"])
        started[-1] = (proc, workers)
        assert len(workers) == 2
        wait_until(lambda: len(list(markers.iterdir())) == 2, 60, "both workers in the RPC")
        return proc, workers

    yield start
    leftovers = []
    for proc, workers in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        leftovers += kill_all(workers)
    assert not leftovers, f"workers outlived their parent: {leftovers}"


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_parent_death_ends_every_worker(
    method: str, sig: signal.Signals, busy_parent: Any, markers: Path
) -> None:
    """The workers follow their parent, and nothing of it is left in its TMPDIR (a fork
    server's socket and multiprocessing's folder: the server removes them when it ends)."""
    proc, workers = busy_parent(method)
    os.kill(proc.pid, sig)
    assert proc.wait(10) == -sig
    took = wait_until(lambda: alive(workers) == [], 3.0, "the workers to follow their parent")
    print(f"figure: {method} parent {sig.name}: workers gone after {took * 1000:.0f} ms")
    assert_emptied(markers.parent / "temp", 5.0)  # the fork server ends after the workers


@pytest.mark.parametrize("method", METHODS)
def test_keyboard_interrupt_shuts_down_and_propagates(
    method: str, busy_parent: Any, markers: Path
) -> None:
    proc, workers = busy_parent(method)
    start = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    returncode = proc.wait(15)
    print(f"figure: {method} SIGINT: parent exited after {time.monotonic() - start:.2f} s")
    out, err = proc.communicate()
    assert returncode == -signal.SIGINT, err  # Python's exit for an uncaught KeyboardInterrupt
    assert "KeyboardInterrupt" in err
    report = json.loads(out.strip().splitlines()[-1])
    assert report == {"interrupted": True, "alive_after_interrupt": []}
    assert alive(workers) == []
    assert left_in(markers.parent / "temp") == []


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("mode", ["return", "return-while-busy"])
def test_program_end_without_shutdown_leaves_no_worker(
    method: str, mode: str, markers: Path
) -> None:
    """The finalizer at interpreter exit shuts the workers down, even mid-RPC, and the exit
    does not hang in multiprocessing's join of non-daemonic children."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "busy_parent.py"), method, str(markers), mode],
        cwd=markers,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        workers = processes(json.loads(_read_line(proc, 90))["workers"])
        if mode == "return-while-busy":
            assert json.loads(_read_line(proc, 60)) == {"returning": True}
        start = time.monotonic()
        assert proc.wait(15) == 0, proc.communicate()[1]
        print(f"figure: {method} {mode}: program exit took {time.monotonic() - start:.2f} s")
        assert alive(workers) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_garbage_collected_executor_shuts_down(launch: Launcher) -> None:
    executor = launch("fork", init_distributed=False)
    procs = processes(executor.pids)  # type: ignore[attr-defined]
    launch.started.clear()  # forget it here too, so that nothing holds it
    del executor
    gc.collect()
    assert alive(procs) == []


@pytest.mark.parametrize("method", METHODS)
def test_launch_from_short_lived_thread(method: str, launch: Launcher) -> None:
    box: dict[str, Any] = {}

    def launch_here() -> None:
        box["tid"] = threading.get_native_id()
        box["executor"] = launch(method, init_distributed=False)

    thread = threading.Thread(target=launch_here)
    thread.start()
    thread.join(90)
    executor = box["executor"]
    # PR_SET_PDEATHSIG would fire when the kernel ends the launching thread: wait for that.
    wait_until(lambda: not Path(f"/proc/self/task/{box['tid']}").exists(), 10, "thread exit")
    assert executor.collective_rpc("ping") == executor.pids
    executor.check_health()
    assert executor.collective_rpc("ping") == executor.pids


# -- 7. workers may have children ----------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_worker_can_start_its_own_process(method: str, launch: Launcher) -> None:
    executor = launch(method, worker_extension=Probe, init_distributed=False)
    assert executor.collective_rpc("start_child") == [(100, -15), (101, -15)]


def _start_child_in(queue: Any) -> None:
    probe = Probe()
    probe.rank = 0
    try:
        queue.put(probe.start_child())
    except BaseException as exc:
        queue.put(f"{type(exc).__name__}: {exc}")


def test_control_a_daemonic_process_cannot_start_children() -> None:
    """What the test above would meet in a daemonic worker (so it tests something real)."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    daemon = ctx.Process(target=_start_child_in, args=(queue,), daemon=True)
    daemon.start()
    try:
        answer = queue.get(timeout=30)
        assert answer == "AssertionError: daemonic processes are not allowed to have children"
    finally:
        daemon.join(10)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", ["spawn"])
def test_worker_can_torch_compile(method: str, launch: Launcher) -> None:
    executor = launch(method, world_size=2, worker_extension=Probe, init_distributed=False)
    start = time.monotonic()
    results = executor.collective_rpc("compile_and_run", timeout=240)
    print(
        f"figure: torch.compile in 2 {method} workers took {time.monotonic() - start:.1f} s; worker children: {[pids for _, pids in results]}"
    )
    expected = torch.sin(torch.arange(6, dtype=torch.float32)) * 2
    for rank, (values, _) in enumerate(results):
        torch.testing.assert_close(torch.tensor(values), expected + rank)
    descendants = processes(pid for _, pids in results for pid in pids)
    executor.shutdown()
    wait_until(lambda: alive(descendants) == [], 10, "the compile workers to end")


# -- 8. a script without a main guard ------------------------------------------------------
def _launch_line() -> int:
    lines = (SCRIPTS / "unguarded_launch.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if "# the launch line" in line)


def test_unguarded_script_gets_fork_by_default(tmp_path: Path) -> None:
    proc = run_script([str(SCRIPTS / "unguarded_launch.py")], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert PYTHON_BOOTSTRAP_ERROR not in proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["start_method"] == "fork"
    assert report["ranks"] == [0, 1]
    status, file, line = report["main_guard"]
    assert (status, Path(file).name, line) == ("unguarded", "unguarded_launch.py", _launch_line())


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_unguarded_script_with_spawn_family_gets_missing_main_guard(
    method: str, tmp_path: Path
) -> None:
    proc = run_script(
        [str(SCRIPTS / "unguarded_launch.py"), json.dumps({"start_method": method})], cwd=tmp_path
    )
    assert proc.returncode == 1
    assert MissingMainGuardError.__name__ in proc.stderr
    assert f"unguarded_launch.py:{_launch_line()}" in proc.stderr
    assert PYTHON_BOOTSTRAP_ERROR not in proc.stderr
    assert "finished its bootstrapping phase" not in proc.stderr


# -- 9. shutdown ---------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_shutdown_is_idempotent_and_runs_on_context_exit(method: str, launch: Launcher) -> None:
    with launch(method, init_distributed=False) as executor:
        procs = processes(executor.pids)  # type: ignore[attr-defined]
        assert executor.collective_rpc("ping") == executor.pids  # type: ignore[attr-defined]
    assert alive(procs) == []
    executor.shutdown()
    executor.shutdown()
    with pytest.raises(hwlaunch.ExecutorClosedError, match="shut down"):
        executor.collective_rpc("ping")


@pytest.mark.parametrize("method", METHODS)
def test_shutdown_never_hangs_on_a_stuck_rpc(method: str, launch: Launcher, markers: Path) -> None:
    executor = launch(method, worker_extension=Probe, init_distributed=False)
    procs = processes(executor.pids)  # type: ignore[attr-defined]
    outcome: list[BaseException] = []

    def stuck() -> None:
        try:
            executor.collective_rpc("nap", args=({0: 600.0, 1: 600.0}, str(markers)))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=stuck, daemon=True)
    thread.start()
    wait_until(lambda: len(list(markers.iterdir())) == 2, 60, "both ranks in the RPC")
    start = time.monotonic()
    executor.shutdown()
    took = time.monotonic() - start
    print(f"figure: {method} shutdown with an RPC stuck in sleep(600): {took:.2f} s")
    assert took < 10.0
    assert alive(procs) == []
    thread.join(10)
    assert not thread.is_alive()
    assert isinstance(outcome[0], hwlaunch.ExecutorClosedError) and "shut down" in str(outcome[0])


# -- 10. concurrent callers ----------------------------------------------------------------
def test_two_threads_calling_at_once(shared: Executor) -> None:
    barrier = threading.Barrier(2)
    results: dict[str, list[list[Any]]] = {"a": [], "b": []}

    def caller(name: str) -> None:
        barrier.wait()
        for i in range(20):
            results[name].append(shared.collective_rpc("echo", args=((name, i),)))

    threads = [threading.Thread(target=caller, args=(n,)) for n in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads)
    for name, replies in results.items():
        assert replies == [[(r, (name, i), None) for r in range(3)] for i in range(20)]


# -- 11. environment -----------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_worker_environment_and_parent_untouched(
    method: str, launch: Launcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    if method == "forkserver":  # make sure the fork server predates the variable set below
        launch(method, init_distributed=False).shutdown()
    monkeypatch.setenv("HWL_SET_BY_PARENT", "late")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    # Unset, as in a fresh program (an earlier test's launch may have set it before the fix).
    monkeypatch.setattr(multiprocessing.context._default_context, "_actual_context", None)
    before_env = dict(os.environ)
    before_method = multiprocessing.get_start_method(allow_none=True)
    executor = launch(method, env={"HWL_PLAN_VAR": "from-plan"}, worker_extension=Probe)
    assert dict(os.environ) == before_env
    assert multiprocessing.get_start_method(allow_none=True) == before_method
    names = ("HWL_PLAN_VAR", "HWL_SET_BY_PARENT", "GLOO_SOCKET_IFNAME")
    envs = executor.collective_rpc("env", args=names)
    port = envs[0]["MASTER_PORT"]
    assert port is not None and port.isdigit()
    for rank, env in enumerate(envs):
        assert env == {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "HWL_PLAN_VAR": "from-plan",
            "HWL_SET_BY_PARENT": "late",
            "GLOO_SOCKET_IFNAME": "lo",  # one node: gloo stays on loopback
        }
    assert "HWL_PLAN_VAR" not in os.environ


def test_a_spawned_worker_imports_torch_only_when_it_uses_it(launch: Launcher) -> None:
    """The cpu worker binds ``torch.device("cpu")`` when first asked for it: a spawned worker
    that runs no torch code never imports torch (seconds of CPU per process), and one that
    does gets the device and the plan's thread budget (from OMP_NUM_THREADS at its import)."""
    executor = launch("spawn", init_distributed=False)
    threads = executor.plan.cpu_threads  # the node's CPUs shared out: 1 on 2 CPUs
    assert threads is not None
    assert executor.collective_rpc(lambda w: "torch" in sys.modules) == [False, False]

    def use_torch(worker: Any) -> tuple[str, int, str]:
        import torch

        made = torch.ones(2, device=worker.device)
        return str(worker.device), torch.get_num_threads(), str(made.device)

    assert executor.collective_rpc(use_torch) == [("cpu", threads, "cpu")] * 2
    assert executor.collective_rpc(lambda w: w.device is w.device) == [True, True]


# -- 12. the process group -----------------------------------------------------------------
def test_all_reduce_rank_over_gloo(shared: Executor) -> None:
    assert shared.plan.dist_backend == "gloo"
    n = shared.world_size
    assert shared.collective_rpc("all_reduce_rank") == [n * (n - 1) // 2] * n
