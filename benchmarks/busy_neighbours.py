"""A no-op to one worker next to CPU-bound processes: the shm channel's polling giving way.

    python benchmarks/busy_neighbours.py [--busy 6] [--calls 2000] [--runs 5]
                                         [--baseline DIR]

Each run is a fresh parent: one fork worker (shm channel, the default spin window), ``--busy``
processes spinning in ``while True: pass`` on the same CPUs, then ``--calls`` no-op calls
(``echo`` of an empty byte string), each timed; printed, the median of each run. With
``--baseline DIR`` (a directory holding another version's ``hwlaunch`` package), a run of
that version alternates with each run of this one, so that both meet the machine alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _contenders import env_with_version  # benchmarks/ on sys.path

HERE = Path(__file__).resolve().parent


def one_run(busy: int, calls: int) -> float:
    """The median of ``calls`` no-ops, in µs, with ``busy`` spinning processes alongside."""
    sys.path.insert(0, str(HERE))
    from _contenders import Echo, channel_executor

    executor = channel_executor(Echo)
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        time.sleep(0.5)  # every spinning process is running
        times = []
        for _ in range(calls):
            start = time.perf_counter_ns()
            executor.collective_rpc("echo", (b"",))
            times.append(time.perf_counter_ns() - start)
    finally:
        for process in spinning:
            process.kill()
            process.wait()
        executor.shutdown()
    return statistics.median(times) / 1000


def _fresh_parent(pythonpath: str | None, busy: int, calls: int) -> float:
    env = env_with_version(pythonpath)
    done = subprocess.run(
        [sys.executable, __file__, "--child", "--busy", str(busy), "--calls", str(calls)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return float(done.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=6)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", metavar="DIR")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(f"{one_run(args.busy, args.calls):.1f}")
        return
    versions = {"this": None} | ({"baseline": args.baseline} if args.baseline else {})
    medians: dict[str, list[float]] = {name: [] for name in versions}
    for _ in range(args.runs):
        for name, path in versions.items():
            medians[name].append(_fresh_parent(path, args.busy, args.calls))
    print(f"no-op to one worker next to {args.busy} busy processes, {os.cpu_count()} CPUs:")
    for name, values in medians.items():
        runs = ", ".join(f"{value:.1f}" for value in values)
        print(f"  {name}: median of runs {statistics.median(values):.1f} µs (runs: {runs} µs)")


if __name__ == "__main__":
    main()
