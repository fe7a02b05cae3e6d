"""Reliability figures of the mp executor: how fast faults are detected and cleaned up, and
what 200 launch/RPC/shutdown cycles leave behind.

    python benchmarks/reliability.py --out benchmarks/results/reliability.json

For each start method it injects real faults into real processes (a worker SIGKILLed during a
long RPC, one calling ``os._exit(3)``, one segfaulting through ctypes, an RPC past its timeout
(every rank asleep, or rank 1 holding the GIL in a C call, or stopped by SIGSTOP),
rank 2 of 4 failing to start, Ctrl-C in the parent, the parent itself SIGKILLed or SIGTERMed)
and measures, with medians over ``--reps`` repetitions, the time from the fault to the error the
caller sees and to the moment no worker process is left. Then it runs the 200 cycles of
tests/test_soak.py and reports resources before and after. It prints a markdown table and
writes every sample as JSON. Workers use the cpu backend with the gloo process group (world
size 2; 4 for the start-up failure).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import psutil

import hwlaunch
from hwlaunch import RpcTimeoutError, WorkerDiedError, WorkerStartupError
from hwlaunch.executor.mp import MultiprocExecutor
from hwlaunch.executor.mp._forkserver import running_servers

METHODS = ("fork", "forkserver", "spawn")
GONE_LIMIT = 15.0  # seconds to wait for processes to disappear before calling it a failure
RPC_TIMEOUT = 1.0
STAMP = "HWLAUNCH_BENCH_STAMP"  # file where a worker writes the time of its fault


# -- what runs in the workers (sent by value: this file is __main__) --------------------------
def fault(worker: hwlaunch.Worker, kind: str) -> None:
    """Rank 1 faults (after stamping the time); every other rank is busy in a long call, or
    for ``collective`` blocked in a barrier (native code) that waits for rank 1."""
    if kind == "collective" and worker.rank != 1:
        import torch.distributed as dist

        dist.barrier()
        return
    if worker.rank == 1 and kind == "gil":  # a C call that keeps the GIL: no thread of it runs
        ctypes.PyDLL(None).sleep(120)
    if worker.rank == 1 and kind == "stopped":
        os.kill(os.getpid(), signal.SIGSTOP)
    if worker.rank != 1 or kind in ("sleep", "sigkill", "collective", "gil", "stopped"):
        time.sleep(120)
        return
    Path(os.environ[STAMP]).write_text(repr(time.time()))
    if kind == "exit":
        os._exit(3)
    if kind == "segfault":
        ctypes.string_at(0)


class FailOnRank2:
    """A worker extension whose rank 2 cannot initialize its device."""

    rank: int

    def init_device(self) -> None:
        if self.rank == 2:
            Path(os.environ[STAMP]).write_text(repr(time.time()))
            raise RuntimeError("rank 2 cannot initialize its device")
        super().init_device()  # type: ignore[misc]


PARENT = """\
import json, sys, time
import hwlaunch

def busy(worker):
    time.sleep(600)

if __name__ == "__main__":
    plan = hwlaunch.resolve(backend="cpu", world_size=2, executor="mp", start_method=sys.argv[1])
    executor = hwlaunch.launch(plan)
    print(json.dumps(executor.pids), flush=True)
    executor.collective_rpc(busy)
"""


# -- helpers -----------------------------------------------------------------------------------
def launch(method: str, world_size: int = 2, **options: Any) -> MultiprocExecutor:
    plan = hwlaunch.resolve(
        backend="cpu", world_size=world_size, executor="mp", start_method=method
    )
    executor = hwlaunch.launch(plan, **options)
    assert isinstance(executor, MultiprocExecutor)
    return executor


def alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: list[int]) -> float:
    """``time.time()`` when none of ``pids`` runs any more (a zombie counts as gone)."""
    deadline = time.monotonic() + GONE_LIMIT
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {[p for p in pids if alive(p)]} outlived the fault")
        time.sleep(0.002)
    return time.time()


def helper_handles() -> dict[int, int]:
    """hwlaunch's fork servers (one per worker environment) and the standard library's resource
    tracker (per parent, not per launch): their pids, each with the descriptor this process
    keeps to it."""
    found = {}
    servers = [(server, "_forkserver_pid", "_forkserver_alive_fd") for server in running_servers()]
    for helper, pid_attr, fd_attr in (
        *servers,
        (resource_tracker._resource_tracker, "_pid", "_fd"),
    ):
        pid, fd = getattr(helper, pid_attr, None), getattr(helper, fd_attr, None)
        if isinstance(pid, int) and isinstance(fd, int):
            found[pid] = fd
    return found


def helpers() -> set[int]:
    return set(helper_handles())


def our_workers() -> list[int]:
    return [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in helpers()]


def stamped(path: Path) -> float:
    return float(path.read_text())


# -- the faults --------------------------------------------------------------------------------
Sample = dict[str, float]


def worker_fault(method: str, kind: str, stamp: Path) -> Sample:
    executor = launch(method)
    pids = [p for p in executor.pids if p is not None]
    if kind in ("sigkill", "collective"):

        def kill() -> None:
            stamp.write_text(repr(time.time()))
            os.kill(pids[1], signal.SIGKILL)

        threading.Timer(0.5, kill).start()
    try:
        executor.collective_rpc(fault, args=(kind,), timeout=60)
    except WorkerDiedError:
        raised = time.time()
    else:
        raise AssertionError(f"{kind}: no WorkerDiedError")
    gone = wait_gone(pids)
    executor.shutdown()
    start = stamped(stamp)
    return {"detect_s": raised - start, "all_gone_s": gone - start}


def rpc_timeout(method: str, stamp: Path, kind: str = "sleep") -> Sample:
    """Every rank busy past the timeout; with ``kind`` gil or stopped, rank 1 cannot answer
    for its stack (its stack comes from py-spy, read from outside the process)."""
    executor = launch(method)
    pids = [p for p in executor.pids if p is not None]
    start = time.time()
    try:
        executor.collective_rpc(fault, args=(kind,), timeout=RPC_TIMEOUT)
    except RpcTimeoutError as exc:
        raised = time.time()
        read = "in fault" in exc.stacks.get(1, "")  # where rank 1 was; else a line saying why
    else:
        raise AssertionError("no RpcTimeoutError")
    gone = wait_gone(pids)
    executor.shutdown()
    return {
        "past_timeout_s": raised - start - RPC_TIMEOUT,
        "all_gone_s": gone - start - RPC_TIMEOUT,
        "stack_read": float(read),
    }


def startup_failure(method: str, stamp: Path) -> Sample:
    try:
        launch(method, world_size=4, worker_extension=FailOnRank2)
    except WorkerStartupError as exc:
        raised = time.time()
        assert exc.rank == 2, exc
    else:
        raise AssertionError("no WorkerStartupError")
    left = our_workers()
    gone = wait_gone(left) if left else raised
    start = stamped(stamp)
    return {"detect_s": raised - start, "all_gone_s": gone - start, "left_at_raise": len(left)}


def keyboard_interrupt(method: str, stamp: Path) -> Sample:
    executor = launch(method)
    pids = [p for p in executor.pids if p is not None]
    sent: list[float] = []

    def interrupt() -> None:
        sent.append(time.time())
        os.kill(os.getpid(), signal.SIGINT)

    # A shell starts background jobs with SIGINT ignored, and Python then keeps it ignored:
    # Ctrl-C's handler is installed here, as in an interactive program.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.5, interrupt).start()
        try:
            executor.collective_rpc(fault, args=("sleep",), timeout=60)
        except KeyboardInterrupt:
            raised = time.time()
        else:
            raise AssertionError("no KeyboardInterrupt")
    finally:
        signal.signal(signal.SIGINT, previous)
    gone = wait_gone(pids)
    executor.shutdown()
    return {"detect_s": raised - sent[0], "all_gone_s": gone - sent[0]}


def two_threads(method: str, stamp: Path) -> Sample:
    calls = 50
    executor = launch(method)
    with executor:
        expected = executor.pids
        wrong: list[object] = []

        def caller() -> None:
            for _ in range(calls):
                got = executor.collective_rpc("ping", timeout=60)
                if got != expected:
                    wrong.append(got)

        threads = [threading.Thread(target=caller) for _ in range(2)]
        start = time.time()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        took = time.time() - start
        assert not any(t.is_alive() for t in threads), "deadlock: a caller never returned"
        assert not wrong, wrong
    return {"per_call_s": took / (2 * calls), "total_s": took}


def parent_killed(method: str, sig: signal.Signals) -> Sample:
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "parent.py"
        script.write_text(PARENT)
        parent = subprocess.Popen(
            [sys.executable, str(script), method], stdout=subprocess.PIPE, text=True
        )
        try:
            assert parent.stdout is not None
            pids: list[int] = json.loads(parent.stdout.readline())
            time.sleep(0.5)  # inside the long RPC
            descendants = [p.pid for p in psutil.Process(parent.pid).children(recursive=True)]
            start = time.time()
            parent.send_signal(sig)
            workers_gone = wait_gone(pids)
            all_gone = wait_gone(descendants)
        finally:
            parent.kill()
            parent.wait()
    return {"workers_gone_s": workers_gone - start, "descendants_gone_s": all_gone - start}


# -- 200 cycles --------------------------------------------------------------------------------
def soak_schedule(cycles: int = 200) -> list[tuple[str, bool]]:
    """tests/test_soak.py's mix: fork, every tenth with the process group, 8 forkserver, 2 spawn."""
    plan = [("fork", i % 10 == 5) for i in range(cycles)]
    for i in range(100, 108):
        plan[i] = ("forkserver", i == 104)
    for i in (150, 151):
        plan[i] = ("spawn", False)
    return plan


@dataclass(frozen=True)
class Resources:
    children: int
    fds: int
    threads: int
    os_threads: int
    shm: int

    @classmethod
    def now(cls, exclude: frozenset[int] = frozenset()) -> Resources:
        """Counts now; ``exclude``: processes (and their descriptors here) not to count."""
        me = psutil.Process()
        helper_fds = {fd for pid, fd in helper_handles().items() if pid in exclude}
        return cls(
            children=len([p for p in me.children(recursive=True) if p.pid not in exclude]),
            fds=len(set(os.listdir("/proc/self/fd")) - {str(fd) for fd in helper_fds}),
            threads=threading.active_count(),
            os_threads=me.num_threads(),
            shm=len(os.listdir("/dev/shm")),
        )


def soak() -> dict[str, Any]:
    before = Resources.now()
    before_helpers = frozenset(helpers())
    times: dict[str, list[float]] = {}
    for method, init_distributed in soak_schedule():
        start = time.monotonic()
        with launch(method, init_distributed=init_distributed) as executor:
            executor.collective_rpc("ping", timeout=120)
            if init_distributed:
                executor.collective_rpc("all_reduce_rank", timeout=120)
        key = method + (" + process group" if init_distributed else "")
        times.setdefault(key, []).append(time.monotonic() - start)
    return {
        "before": asdict(before),
        "after": asdict(Resources.now()),
        "stdlib_helpers_before": sorted(before_helpers),
        "stdlib_helpers_after": sorted(helpers()),
        "cycle_s": {k: {"n": len(v), "median": statistics.median(v)} for k, v in times.items()},
    }


def tree_state() -> dict[str, object]:
    """The commit measured, and which files of the package differed from it."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return done.stdout

    changed = git("status", "--porcelain", "--", "core", "plugins").splitlines()
    return {"commit": git("rev-parse", "HEAD").strip(), "uncommitted": [ln[3:] for ln in changed]}


# -- the report --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    metric: str  # the figure shown in the table
    run: Callable[[str, Path], Sample]


FAULTS = (
    Fault(
        "worker SIGKILLed during a long RPC",
        "WorkerDiedError (killed by signal SIGKILL); the other worker is shut down",
        "detect_s",
        lambda m, s: worker_fault(m, "sigkill", s),
    ),
    Fault(
        "worker SIGKILLed while the others wait in a collective",
        "WorkerDiedError (killed by signal SIGKILL); the others, blocked in native code, are "
        "shut down",
        "detect_s",
        lambda m, s: worker_fault(m, "collective", s),
    ),
    Fault(
        "worker calls os._exit(3) in an RPC",
        "WorkerDiedError (exited with code 3); the other worker is shut down",
        "detect_s",
        lambda m, s: worker_fault(m, "exit", s),
    ),
    Fault(
        "worker segfaults (ctypes) in an RPC",
        "WorkerDiedError (killed by signal SIGSEGV); the other worker is shut down",
        "detect_s",
        lambda m, s: worker_fault(m, "segfault", s),
    ),
    Fault(
        f"RPC hangs (timeout={RPC_TIMEOUT:g}s)",
        "RpcTimeoutError naming the ranks; the executor shuts down",
        "past_timeout_s",
        rpc_timeout,
    ),
    Fault(
        f"RPC hangs, rank 1 holds the GIL in a C call (timeout={RPC_TIMEOUT:g}s)",
        "RpcTimeoutError with rank 1's stack (py-spy); SIGTERM, SIGKILL 0.1 s later if need be",
        "past_timeout_s",
        lambda m, s: rpc_timeout(m, s, "gil"),
    ),
    Fault(
        f"RPC hangs, rank 1 stopped by SIGSTOP (timeout={RPC_TIMEOUT:g}s)",
        "RpcTimeoutError with rank 1's stack (py-spy); SIGTERM, then SIGCONT",
        "past_timeout_s",
        lambda m, s: rpc_timeout(m, s, "stopped"),
    ),
    Fault(
        "rank 2 of 4 fails to initialize",
        "WorkerStartupError(rank 2) with its traceback; ranks 0, 1, 3 are gone when it is raised",
        "detect_s",
        startup_failure,
    ),
    Fault(
        "Ctrl-C (SIGINT) in the parent during a long RPC",
        "KeyboardInterrupt propagates; the executor shuts down first",
        "detect_s",
        keyboard_interrupt,
    ),
    Fault(
        "two threads call collective_rpc at once",
        "both get correct results (calls are serialized); no deadlock",
        "per_call_s",
        two_threads,
    ),
    Fault(
        "parent SIGKILLed while workers are busy",
        "every worker exits (death pipe + PR_SET_PDEATHSIG)",
        "workers_gone_s",
        lambda m, s: parent_killed(m, signal.SIGKILL),
    ),
    Fault(
        "parent SIGTERMed while workers are busy",
        "every worker exits (death pipe + PR_SET_PDEATHSIG)",
        "workers_gone_s",
        lambda m, s: parent_killed(m, signal.SIGTERM),
    ),
)


def summarize(samples: list[Sample]) -> dict[str, dict[str, float]]:
    keys = sorted({k for s in samples for k in s})
    return {
        k: {
            "median": statistics.median(s[k] for s in samples),
            "max": max(s[k] for s in samples),
        }
        for k in keys
    }


def fmt(seconds: float) -> str:
    if seconds < 0.01:
        return f"{seconds * 1000:.2f} ms"
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def bound(summary: dict[str, dict[str, float]], metric: str) -> str:
    main = summary[metric]
    text = f"{metric.removesuffix('_s').replace('_', ' ')}: {fmt(main['median'])} (max {fmt(main['max'])})"
    gone = summary.get("all_gone_s") or summary.get("descendants_gone_s")
    if gone is not None and metric not in ("all_gone_s", "descendants_gone_s"):
        label = "all gone" if "all_gone_s" in summary else "all descendants gone"
        text += f"; {label}: {fmt(gone['median'])} (max {fmt(gone['max'])})"
    return text


def stacks_read(samples: list[Sample]) -> str:
    """``; rank 1's stack in N of M``, for the faults that read it."""
    read = [s["stack_read"] for s in samples if "stack_read" in s]
    return f"; rank 1's stack in {sum(read):.0f} of {len(read)}" if read else ""


def recovery(reps: int, cycles: int) -> dict[str, Any]:
    """The figures of benchmarks/_recovery.py, printed as markdown tables."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _recovery

    restarts = _recovery.restart_figures(reps)
    print("| kill 1 of 4 workers, max_restarts=1 | until the all-reduce passes (median, max) |")
    print("| --- | --- |")
    for name, fig in restarts.items():
        print(f"| {name} | {fmt(fig['median'])} ({fmt(fig['max'])}) |")
    trees: dict[str, Any] = {}
    for method in METHODS:
        runs = [_recovery.parent_sigkill_survivors(method) for _ in range(reps)]
        trees[method] = runs
    print("\n| parent SIGKILL, 4 workers x (2 Popen + 2-process Pool) | survivors after 3 s |")
    print("| --- | --- |")
    for method, runs in trees.items():
        counts = ", ".join(f"{r['survivors']} of {r['descendants']}" for r in runs)
        print(f"| {method} | {counts} |")
    cycled = _recovery.kill_restart_cycles(cycles, helpers)
    print(f"\n| resource | before | after 10 | after {cycles} kill/restart cycles |")
    print("| --- | --- | --- | --- |")
    for key, value in cycled["before"].items():
        tenth = cycled["after_10"][key] if cycled["after_10"] else "-"
        print(f"| {key} | {value} | {tenth} | {cycled['after'][key]} |")
    print(f"restart (fork, 4 workers) median over the cycles: {fmt(cycled['restart_s_median'])}")
    return {"restart": restarts, "parent_sigkill": trees, "kill_restart_cycles": cycled}


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/reliability.json"))
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each fault")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--skip-soak", action="store_true", help="skip the 200 cycles")
    parser.add_argument(
        "--recovery-only",
        action="store_true",
        help="only the recovery figures (restarts, process-tree cleanup, kill/restart cycles)",
    )
    parser.add_argument("--cycles", type=int, default=100, help="kill/restart cycles")
    parser.add_argument(
        "--only",
        metavar="TEXT",
        help="only the faults whose name holds TEXT ('' for all; no 200 cycles, no recovery)",
    )
    return parser.parse_args()


def fault_row(item: Fault, method: str, reps: int, stamp: Path) -> dict[str, Any]:
    """``reps`` runs of one fault under one start method; a failed run is reported, not hidden."""
    samples: list[Sample] = []
    failures: list[str] = []
    for _ in range(reps):
        stamp.unlink(missing_ok=True)
        try:
            samples.append(item.run(method, stamp))
        except Exception as exc:  # reported in the table, not hidden
            failures.append(f"{type(exc).__name__}: {exc}".splitlines()[0])
            for pid in our_workers():  # leave nothing behind for the next one
                psutil.Process(pid).kill()
    summary = summarize(samples) if samples else {}
    text = bound(summary, item.metric) + stacks_read(samples) if samples else "no sample"
    if failures:
        text += f"; FAILED {len(failures)} of {reps}: {failures[0]}"
    return {
        "fault": item.name,
        "start_method": method,
        "what_happens": item.what,
        "measured_bound": text,
        "summary": summary,
        "samples": samples,
        "failures": failures,
    }


def fault_rows(methods: list[str], reps: int, only: str | None = None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        stamp = Path(folder) / "fault-time"
        os.environ[STAMP] = str(stamp)
        for method in methods:
            for item in (f for f in FAULTS if only is None or only in f.name):
                rows.append(fault_row(item, method, reps, stamp))
                print(f"{item.name} [{method}]: {rows[-1]['measured_bound']}", file=sys.stderr)
    return rows


def print_faults(rows: list[dict[str, Any]], reps: int, soaked: dict[str, Any] | None) -> None:
    print("| fault | start method | what happens | measured bound (median over "
          f"{reps}, max) |")  # fmt: skip
    print("| --- | --- | --- | --- |")
    for row in rows:
        print(
            f"| {row['fault']} | {row['start_method']} | {row['what_happens']} | "
            f"{row['measured_bound']} |"
        )
    if soaked is not None:
        before, after = soaked["before"], soaked["after"]
        counts = ", ".join(f"{k} {before[k]} -> {after[k]}" for k in before)
        cycles = ", ".join(
            f"{k}: {fmt(v['median'])} x{v['n']}" for k, v in soaked["cycle_s"].items()
        )
        helpers_before, helpers_after = (
            soaked["stdlib_helpers_before"],
            soaked["stdlib_helpers_after"],
        )
        print(
            f"| 200 launch/RPC/shutdown cycles | mixed | before -> after: {counts} "
            f"(children: the stdlib fork server and resource tracker, {len(helpers_before)} "
            f"-> {len(helpers_after)}) | per cycle: {cycles} |"
        )


def write(out: Path, result: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def main() -> None:
    args = arguments()
    import torch  # the parent has torch loaded, as a real one does: fork workers share it

    if args.recovery_only:
        write(args.out, {"tree": tree_state(), "recovery": recovery(args.reps, args.cycles)})
        return
    # The cycles first, so that "before" is a parent that never launched anything.
    soaked = None if args.skip_soak or args.only is not None else soak()
    rows = fault_rows(args.methods, args.reps, args.only)
    result: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "hwlaunch": hwlaunch.__version__,
            "note": "shared with other jobs: figures include their load",
        },
        "tree": tree_state(),
        "reps": args.reps,
        "faults": rows,
    }
    if soaked is not None:
        result["soak_200_cycles"] = soaked
    if args.only is None:
        result["recovery"] = recovery(args.reps, args.cycles)
    print_faults(rows, args.reps, soaked)
    write(args.out, result)


if __name__ == "__main__":
    main()
