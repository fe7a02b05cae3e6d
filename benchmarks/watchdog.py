"""The stall watchdog: what it costs a collective_rpc, and how late its warnings come.

    python benchmarks/watchdog.py [--rounds 7] [--calls 500] [--reps 3]

Cost: two mp executors (fork, 2 cpu workers each, the default shm channel) in one parent, one
with ``rpc_warn_after=60`` (the default: a watchdog thread per executor, a lock taken twice per
call) and one with ``rpc_warn_after=0`` (no watchdog). Rounds alternate which goes first, so
that a burst of load from elsewhere hits both alike. Every call is timed on its own; the table
shows the median per call and the ratio of the medians; the difference is within the noise of
a shared machine, so the watchdog's own part of a call (``begin`` and ``end``) is timed apart,
with ``timeit``, on an idle watchdog of this process.

On time: with ``rpc_warn_after=1``, rank 1 of 2 (fork) stays silent for 4.5 s, three ways:
holding the GIL in a C call (``ctypes.PyDLL``: neither its stack thread nor a signal handler
runs), stopped (SIGSTOP, then SIGCONT from the driver at 4.5 s), or asleep in native code with
the GIL released. Each warning is due at 1, 2 and 4 s; the table shows how late each came
(median and worst over ``--reps`` calls), where its stacks came from, and the warnings that
came after the call returned or named no rank (the promise: none).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import statistics
import sys
import threading
import time
import timeit
from typing import Any

import cloudpickle

import hwlaunch
from hwlaunch.executor._watchdog import Watchdog

cloudpickle.register_pickle_by_value(sys.modules[__name__])
SILENT_FOR = 4.5
DUE = (1.0, 2.0, 4.0)


def timed_calls(executor: hwlaunch.Executor, calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        executor.collective_rpc("ping")
        samples.append(time.perf_counter() - start)
    return samples


def own_part_ns(calls: int = 200_000) -> float:
    """Nanoseconds per call that the caller's thread spends on the watchdog."""
    owner = _Quiet()
    watchdog = Watchdog(60.0, owner.silent, owner.stacks, "default")
    try:
        seconds = timeit.timeit(lambda: (watchdog.begin("ping"), watchdog.end()), number=calls)
    finally:
        watchdog.stop()
    return seconds / calls * 1e9


class _Quiet:
    """What the watchdog asks (it holds these methods weakly, as it does an executor's)."""

    def silent(self) -> list[int]:
        return []

    def stacks(self, ranks: list[int], timeout: float) -> dict[int, str]:
        return {}


def cost(rounds: int, calls: int) -> None:
    contenders = {
        "watchdog on (rpc_warn_after=60)": {"rpc_warn_after": 60},
        "watchdog off (rpc_warn_after=0)": {"rpc_warn_after": 0},
    }
    executors = {
        name: hwlaunch.launch(backend="cpu", world_size=2, start_method="fork", **options)
        for name, options in contenders.items()
    }
    samples: dict[str, list[float]] = {name: [] for name in executors}
    try:
        for round_number in range(rounds):
            order = list(executors)[:: 1 if round_number % 2 == 0 else -1]
            for name in order:
                timed_calls(executors[name], 50)  # warm: the workers' spin window begins
                samples[name] += timed_calls(executors[name], calls)
    finally:
        for executor in executors.values():
            executor.shutdown()
    medians = {name: statistics.median(values) for name, values in samples.items()}
    off = medians["watchdog off (rpc_warn_after=0)"]
    print(f"no-op collective_rpc to 2 workers, {rounds} rounds x {calls} calls")
    print("| contender | median per call | ratio to off |")
    print("|---|---|---|")
    for name, median in medians.items():
        print(f"| {name} | {median * 1e6:.1f} µs | {median / off:.2f}x |")
    print(f"the watchdog's part of each call (begin + end): {own_part_ns():.0f} ns")


# -- on time -------------------------------------------------------------------------------------
def silent(worker: Any, how: str) -> int:
    """Rank 1 stays silent for SILENT_FOR seconds, ``how``."""
    if worker.rank == 1:
        if how == "holds the GIL in a C call":
            ctypes.PyDLL(None).usleep(int(SILENT_FOR * 1e6))
        elif how == "stopped (SIGSTOP)":
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            time.sleep(SILENT_FOR)
    return int(worker.rank)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def on_time(reps: int) -> None:
    handler = _Records()
    logger = logging.getLogger("hwlaunch")
    logger.addHandler(handler)
    logger.propagate = False
    rows = {}
    try:
        with hwlaunch.launch(
            backend="cpu", world_size=2, start_method="fork", rpc_warn_after=1
        ) as executor:
            pid = executor.pids[1]
            for how in ("holds the GIL in a C call", "stopped (SIGSTOP)", "asleep in native code"):
                rows[how] = [_one_call(executor, how, pid, handler) for _ in range(reps)]
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    print(
        f"\nstall warnings, rpc_warn_after=1, rank 1 of 2 silent for {SILENT_FOR:g}s ({reps} calls each)"
    )
    print(
        "| rank 1 | warnings per call | late (median, worst) | stacks from | after the call / no rank |"
    )
    print("|---|---|---|---|---|")
    for how, calls in rows.items():
        late = [x for call in calls for x in call["late"]]
        sources = sorted({s for call in calls for s in call["sources"]})
        print(
            f"| {how} | {', '.join(str(c['count']) for c in calls)} | "
            f"{statistics.median(late) * 1000:.0f} ms, {max(late) * 1000:.0f} ms | "
            f"{', '.join(sources)} | {sum(c['after'] for c in calls)} / "
            f"{sum(c['no_rank'] for c in calls)} |"
        )


def _one_call(executor: Any, how: str, pid: int | None, handler: _Records) -> dict[str, Any]:
    handler.records.clear()
    if how == "stopped (SIGSTOP)" and pid is not None:
        threading.Timer(SILENT_FOR, os.kill, (pid, signal.SIGCONT)).start()
    began = time.time()
    executor.collective_rpc(silent, args=(how,))
    returned = time.time()
    time.sleep(0.5)  # a warning made while the call ended would come now
    found = [r for r in handler.records if "has waited" in r.getMessage()]
    texts = [r.getMessage() for r in found]
    return {
        "count": len(found),
        "late": [r.created - began - due for r, due in zip(found, DUE, strict=False)],
        "sources": [_source(text) for text in texts],
        "after": sum(r.created > returned for r in found),
        "no_rank": sum("for ranks []" in t for t in texts),
    }


def _source(text: str) -> str:
    if "read by py-spy" in text:
        return "py-spy"
    return "none" if "no stack within" in text else "the rank itself"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--reps", type=int, default=3, help="silent calls of each kind")
    args = parser.parse_args()
    cost(args.rounds, args.calls)
    on_time(args.reps)


if __name__ == "__main__":
    main()
