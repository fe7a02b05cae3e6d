"""What the stall watchdog costs a collective_rpc: the same no-op call with it and without it.

    python benchmarks/watchdog.py [--rounds 7] [--calls 500]

Two mp executors (fork, 2 cpu workers each, the default shm channel) in one parent, one with
``rpc_warn_after=60`` (the default: a watchdog thread per executor, two writes of one tuple
per call) and one with ``rpc_warn_after=0`` (no watchdog). Rounds alternate which goes first,
so that a burst of load from elsewhere hits both alike. Every call is timed on its own; the
table shows the median per call and the ratio of the medians; the difference is within the
noise of a shared machine, so the watchdog's own part of a call (``begin`` and ``end``) is
timed apart, with ``timeit``, on an idle watchdog of this process.
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit

import hwlaunch
from hwlaunch.executor._watchdog import Watchdog


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
    watchdog = Watchdog(60.0, owner.stalled)
    try:
        seconds = timeit.timeit(lambda: (watchdog.begin("ping"), watchdog.end()), number=calls)
    finally:
        watchdog.stop()
    return seconds / calls * 1e9


class _Quiet:
    """What the watchdog reports to (it holds its method weakly, as it does an executor's)."""

    def stalled(self, label: str, waited: float, next_after: float) -> str:
        return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
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
        for round_number in range(args.rounds):
            order = list(executors)[:: 1 if round_number % 2 == 0 else -1]
            for name in order:
                timed_calls(executors[name], 50)  # warm: the workers' spin window begins
                samples[name] += timed_calls(executors[name], args.calls)
    finally:
        for executor in executors.values():
            executor.shutdown()
    medians = {name: statistics.median(values) for name, values in samples.items()}
    off = medians["watchdog off (rpc_warn_after=0)"]
    print(f"no-op collective_rpc to 2 workers, {args.rounds} rounds x {args.calls} calls")
    print("| contender | median per call | ratio to off |")
    print("|---|---|---|")
    for name, median in medians.items():
        print(f"| {name} | {median * 1e6:.1f} µs | {median / off:.2f}x |")
    print(f"the watchdog's part of each call (begin + end): {own_part_ns():.0f} ns")


if __name__ == "__main__":
    main()
