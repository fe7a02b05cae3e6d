"""What benchmarks/bench.py runs in a fresh interpreter: one measurement, printed as JSON.

    python benchmarks/_contenders.py ready --who hwlaunch --method forkserver --n 8 --launches 2
    python benchmarks/_contenders.py ready --who mp --method forkserver --n 8 --launches 2
    python benchmarks/_contenders.py ready --who torch --n 8
    python benchmarks/_contenders.py ready --who ray --n 8 --launches 3
    python benchmarks/_contenders.py rpc --rounds 7
    python benchmarks/_contenders.py resolve --calls 2000

The last line of stdout is ``BENCH-JSON {...}``. spawn and forkserver children re-run this
file's module level as ``__mp_main__`` (as they would any main script), so it imports next to
nothing: every import is inside the function that needs it, and the parent imports torch first,
outside the timing, as an inference engine would have done before starting its workers.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import multiprocessing.process
    from collections.abc import Callable
    from multiprocessing.connection import Connection

MARK = "BENCH-JSON "
MIB = 1024 * 1024
# Ray: every service on the loopback interface, no usage report.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


# -- helpers ------------------------------------------------------------------------------------
def env_with_version(directory: str | None) -> dict[str, str]:
    """This process's environment, with ``directory`` (where another version's ``hwlaunch``
    package lies) first on ``PYTHONPATH``, for a child that runs that version."""
    env = dict(os.environ)
    if directory:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [directory, env.get("PYTHONPATH")]))
    return env


def pss_kib(pid: int) -> int:
    """Proportional set size of one process: shared pages count divided by their sharers."""
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    raise RuntimeError(f"no Pss line for pid {pid}")


def median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def emit(result: dict[str, Any]) -> None:
    import json

    print(MARK + json.dumps(result), flush=True)


def ray_init() -> Any:
    """A private local Ray instance on 127.0.0.1, quiet, without the dashboard."""
    import logging

    import ray

    ray.init(
        address="local",
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    return ray


def ray_probe_class(ray: Any) -> Any:
    """An actor that is ready like a hwlaunch worker: torch and the worker class imported.

    Defined inside a function so that Ray ships it by value (workers need not import this file).
    ``num_cpus=0``: eight actors fit on a two-core machine, as hwlaunch's eight processes do.
    """

    @ray.remote(num_cpus=0)
    class Probe:
        def __init__(self) -> None:
            import torch  # noqa: F401

            from hwlaunch.plugins.cpu.worker import CPUWorker  # noqa: F401

        def ping(self) -> int:
            return os.getpid()

        def echo(self, data: bytes) -> bytes:
            return data

    return Probe


def channel_executor(
    extension: type, *, channel: str = "shm", n: int = 1, method: str = "fork"
) -> Any:
    """hwlaunch's mp executor with ``n`` cpu workers and no process group, as the channel
    benchmarks use it (public API only: it runs against other versions of hwlaunch too)."""
    import hwlaunch

    return hwlaunch.launch(
        backend="cpu",
        executor="mp",
        world_size=n,
        start_method=method,
        rpc_channel=channel,
        init_distributed=False,
        worker_extension=extension,
    )


def pin_apart(executor: Any) -> None:
    """The calling thread on one CPU, the executor's first worker on another: where the
    scheduler places the two is then not part of a figure."""
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[0]})
    os.sched_setaffinity(executor.pids[0], {cpus[-1]})


class Echo:
    """worker_extension for the RPC benchmark: a named method that returns its argument."""

    def echo(self, data: bytes) -> bytes:
        return data


def torch_child(index: int, queue: Any, stop: Any) -> None:
    """torch.multiprocessing worker: import what a hwlaunch worker imports, say ready, idle."""
    import torch  # noqa: F401

    from hwlaunch.plugins.cpu.worker import CPUWorker  # noqa: F401

    queue.put(index)
    stop.wait()


def pipe_echo(conn: Connection, other_end: Connection, *, unpickle: bool) -> None:
    """Raw Pipe floor: send back what arrives (optionally through pickle, as an RPC would)."""
    other_end.close()  # the parent's end, inherited through fork: EOF must reach us
    while True:
        try:
            if unpickle:
                conn.send(conn.recv())
            else:
                conn.send_bytes(conn.recv_bytes())
        except (EOFError, OSError):
            return


def start_pipe_echoes(
    n: int, *, unpickle: bool = False
) -> tuple[list[Connection], list[multiprocessing.process.BaseProcess]]:
    """``n`` forked children that echo what arrives on their pipe: the parent's pipe ends and
    the children (close the ends, then join the children, to stop them)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    ends, children = [], []
    for _ in range(n):
        parent_end, child_end = ctx.Pipe()
        child = ctx.Process(
            target=pipe_echo, args=(child_end, parent_end), kwargs={"unpickle": unpickle}
        )
        child.start()
        child_end.close()
        ends.append(parent_end)
        children.append(child)
    return ends, children


def pipe_round_trip(ends: list[Connection], data: bytes) -> Callable[[], None]:
    """The raw Pipe floor: ``data`` out to every child, then its echo back from each."""

    def round_trip() -> None:
        for end in ends:
            end.send_bytes(data)
        for end in ends:
            end.recv_bytes()

    return round_trip


# -- time to ready (and memory) ---------------------------------------------------------------
def first_rpc(worker: Any) -> int:
    """A hwlaunch worker's first RPC in the time to ready: torch imported, as the other
    contenders' workers have it (a CPU worker that is never asked for a tensor or a process
    group does not import torch itself; a fork worker inherits it, a fork server preloads it)."""
    import torch  # noqa: F401

    return os.getpid()


def ready_hwlaunch(
    method: str, n: int, launches: int, pss: bool, interleave: str | None
) -> dict[str, Any]:
    """``launches`` launches with ``method``; before each one after the first, a launch with
    ``interleave`` (if given), so that the later launches of both methods meet the same load."""
    import torch  # noqa: F401  (the parent has torch, as an engine has)

    import hwlaunch
    from hwlaunch.executor.mp import MultiprocExecutor

    result: dict[str, Any] = {"times": [], "interleaved": [], "shutdown": [], "warnings": []}
    result["pss"] = {}

    def launch(start_method: str, measure_pss: bool) -> float:
        start = time.perf_counter()
        executor = hwlaunch.launch(
            backend="cpu", world_size=n, start_method=start_method, init_distributed=False
        )
        executor.collective_rpc(first_rpc)
        elapsed = time.perf_counter() - start
        assert isinstance(executor, MultiprocExecutor)
        result["warnings"] += executor.warnings
        if measure_pss:
            time.sleep(0.5)  # idle workers
            pids = [pid for pid in executor.pids if pid is not None]
            result["pss"] = {"workers_kib": sum(pss_kib(pid) for pid in pids), "server_kib": 0}
            if start_method == "forkserver":
                import psutil

                server = psutil.Process(pids[0]).ppid()  # the fork server these workers came from
                result["pss"]["server_kib"] = pss_kib(server)
        start = time.perf_counter()
        executor.shutdown()
        result["shutdown"].append(time.perf_counter() - start)
        return elapsed

    for index in range(launches):
        if index and interleave:
            result["interleaved"].append(launch(interleave, False))
        result["times"].append(launch(method, pss and index == launches - 1))
    return result


def ready_torch(n: int, launches: int) -> dict[str, Any]:
    import importlib

    import torch.multiprocessing as tmp

    # (typed Any: torch's stubs do not export it, and a function named spawn hides the module)
    start_processes: Any = importlib.import_module("torch.multiprocessing.spawn").start_processes
    ctx = tmp.get_context("spawn")
    times: list[float] = []
    for _ in range(launches):
        queue, stop = ctx.SimpleQueue(), ctx.Event()
        start = time.perf_counter()
        context = start_processes(
            torch_child, args=(queue, stop), nprocs=n, join=False, start_method="spawn"
        )
        for _ in range(n):
            queue.get()
        times.append(time.perf_counter() - start)
        stop.set()
        while not context.join(timeout=30):
            pass
    return {"times": times}


def ready_mp(method: str, n: int, launches: int, interleave: str | None) -> dict[str, Any]:
    """multiprocessing alone, for reference: processes that import what a worker imports and
    say ready through a queue (the fork server with the same preload as hwlaunch's); launches
    with ``interleave`` alternate with the later ones, as in ready_hwlaunch."""
    import multiprocessing

    import torch  # noqa: F401

    # What a hwlaunch parent has imported too (fork workers inherit it, as they do there).
    from hwlaunch.plugins.cpu.worker import CPUWorker  # noqa: F401

    multiprocessing.get_context("forkserver").set_forkserver_preload(
        ["torch", "hwlaunch.plugins.cpu.worker"]
    )

    def launch(start_method: str) -> float:
        ctx: Any = multiprocessing.get_context(start_method)
        queue, stop = ctx.SimpleQueue(), ctx.Event()
        start = time.perf_counter()
        processes = [ctx.Process(target=torch_child, args=(i, queue, stop)) for i in range(n)]
        for process in processes:
            process.start()
        for _ in range(n):
            queue.get()
        elapsed = time.perf_counter() - start
        stop.set()
        for process in processes:
            process.join()
        return elapsed

    times: list[float] = []
    interleaved: list[float] = []
    for index in range(launches):
        if index and interleave:
            interleaved.append(launch(interleave))
        times.append(launch(method))
    return {"times": times, "interleaved": interleaved}


def ready_ray(n: int, launches: int) -> dict[str, Any]:
    """The first launch is cold (``import ray`` and ``ray.init`` included), the rest warm."""
    import torch  # noqa: F401

    times: list[float] = []
    start = time.perf_counter()
    ray = ray_init()
    init = time.perf_counter() - start
    probe = ray_probe_class(ray)
    try:
        for launch in range(launches):
            if launch:
                start = time.perf_counter()
            actors = [probe.remote() for _ in range(n)]
            ray.get([actor.ping.remote() for actor in actors])
            times.append(time.perf_counter() - start)
            for actor in actors:
                ray.kill(actor)
            time.sleep(1.0)  # let the killed actors' processes go before the next launch
    finally:
        ray.shutdown()
    return {"times": times, "init": init}


# -- collective RPC round trips ---------------------------------------------------------------
def pickled_round_trip(ends: list[Connection], data: bytes) -> Callable[[], None]:
    """The Pipe + pickle path: a pickled ``("echo", data)`` out to every child, back from each."""

    def round_trip() -> None:
        for end in ends:
            end.send(("echo", data))
        for end in ends:
            end.recv()

    return round_trip


def ray_cases(large: bytes) -> tuple[Any, dict[str, Callable[[], Any]]]:
    """A private Ray instance with 2 probe actors, and the no-op and 1 MB calls on them."""
    ray = ray_init()
    probe = ray_probe_class(ray)
    actors = [probe.remote() for _ in range(2)]
    ray.get([actor.ping.remote() for actor in actors])
    return ray, {
        "ray/noop": lambda: ray.get([actor.ping.remote() for actor in actors]),
        "ray/1MB": lambda: ray.get([actor.echo.remote(large) for actor in actors]),
    }


def time_interleaved(cases: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Mean seconds per call of each case, one sample per round; interleaved, so that a burst
    of load hits every contender alike (Ray, slower, makes a tenth of the calls)."""
    calls = {"noop": 400, "1MB": 40}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for case in cases.values():  # warm-up
        case()
    for _ in range(rounds):
        for name, case in cases.items():
            count = calls[name.split("/")[1]] // (10 if name.startswith("ray") else 1)
            start = time.perf_counter()
            for _ in range(count):
                case()
            samples[name].append((time.perf_counter() - start) / count)
    return samples


def rpc(rounds: int, with_ray: bool) -> dict[str, Any]:
    """Round trips to 2 workers: raw Pipe (with and without pickle), hwlaunch, Ray."""
    import torch  # noqa: F401

    import hwlaunch

    small, large = b"x" * 16, os.urandom(MIB)
    floors: dict[str, list[Connection]] = {}
    children = []
    for name, unpickle in (("pipe", False), ("pipe+pickle", True)):
        floors[name], started = start_pipe_echoes(2, unpickle=unpickle)
        children += started
    executor = hwlaunch.launch(
        backend="cpu",
        world_size=2,
        start_method="fork",
        init_distributed=False,
        worker_extension=Echo,
    )
    cases: dict[str, Callable[[], Any]] = {
        "pipe/noop": pipe_round_trip(floors["pipe"], small),
        "pipe/1MB": pipe_round_trip(floors["pipe"], large),
        "pipe+pickle/noop": pickled_round_trip(floors["pipe+pickle"], small),
        "pipe+pickle/1MB": pickled_round_trip(floors["pipe+pickle"], large),
        "hwlaunch/noop": lambda: executor.collective_rpc("ping"),
        "hwlaunch/1MB": lambda: executor.collective_rpc("echo", (large,)),
    }
    ray: Any = None
    try:
        if with_ray:
            ray, more = ray_cases(large)
            cases |= more
        samples = time_interleaved(cases, rounds)
    finally:
        executor.shutdown()
        for ends in floors.values():
            for end in ends:
                end.close()
        for child in children:
            child.join(10)
        if ray is not None:
            ray.shutdown()
    return {"samples": samples, "median": {k: median(v) for k, v in samples.items()}}


# -- resolve() in-process ---------------------------------------------------------------------
def resolve_calls(calls: int) -> dict[str, Any]:
    import hwlaunch

    start = time.perf_counter()
    hwlaunch.resolve()
    first = time.perf_counter() - start
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        hwlaunch.resolve()
        times.append(time.perf_counter() - start)
    return {"first": first, "median": median(times), "calls": calls}


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    ready = sub.add_parser("ready")
    ready.add_argument("--who", choices=("hwlaunch", "mp", "torch", "ray"), required=True)
    ready.add_argument("--method", choices=("fork", "spawn", "forkserver"), default="fork")
    ready.add_argument("--n", type=int, required=True)
    ready.add_argument("--launches", type=int, default=1)
    ready.add_argument("--pss", action="store_true")
    ready.add_argument("--interleave", choices=("fork", "spawn", "forkserver"))
    rpc_parser = sub.add_parser("rpc")
    rpc_parser.add_argument("--rounds", type=int, default=7)
    rpc_parser.add_argument("--no-ray", action="store_true")
    resolve_parser = sub.add_parser("resolve")
    resolve_parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    if args.what == "ready":
        if args.who == "hwlaunch":
            emit(ready_hwlaunch(args.method, args.n, args.launches, args.pss, args.interleave))
        elif args.who == "mp":
            emit(ready_mp(args.method, args.n, args.launches, args.interleave))
        elif args.who == "torch":
            emit(ready_torch(args.n, args.launches))
        else:
            emit(ready_ray(args.n, args.launches))
    elif args.what == "rpc":
        emit(rpc(args.rounds, not args.no_ray))
    else:
        emit(resolve_calls(args.calls))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
