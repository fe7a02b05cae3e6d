"""collective_rpc through the shared-memory channel against the pipe channel, side by side.

    python benchmarks/rpc_channel.py [--rounds 7] [--method fork] [--spin 0] [--out FILE.json]

In one parent (torch imported first, as an engine has), interleaved round by round so that a
burst of load from elsewhere hits every contender alike:

- a raw ``multiprocessing.Pipe`` round trip to 2 child processes (bytes out, bytes back): the
  floor any pipe-based RPC pays;
- a no-op ``collective_rpc`` to 2 workers with ``rpc_channel="shm"`` (the default spin window
  for this machine, and ``--spin``, 0 unless told: every wait blocks) and with ``"pipe"``;
- a no-op ``collective_rpc`` to 8 workers with ``shm`` (scaling; meaningful only with at least 9
  free CPUs, the CPU count is printed);
- a 1 MiB echo (1 MiB out to each worker, 1 MiB back from each) with ``shm`` and ``pipe``;
- the CPU time of 2 idle ``shm`` workers over 5 s, starting after the spin window.

The contenders run in a new random order each round (seeded), so that none always follows
the same other one. Every call is timed on its own; the table shows the median per call (robust to the bursts of
load of a shared machine), ratios of medians, and the mean. Between two contenders the parent
waits out the spin window, so that workers still polling after one contender's calls do not
take CPU from the next. ``--out`` writes every sample as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from _contenders import Echo, pipe_round_trip, start_pipe_echoes  # benchmarks/ on sys.path

MIB = 1024 * 1024
CALLS = {"noop": 300, "1MiB": 20}  # per contender and round
IDLE_SECONDS = 5.0


def measure(rounds: int, method: str, spin: float) -> dict[str, Any]:
    import psutil
    import torch  # noqa: F401

    import hwlaunch

    small, large = b"x" * 16, os.urandom(MIB)
    ends, children = start_pipe_echoes(2)

    def launch(channel: str, n: int, rpc_spin: float | None = None) -> Any:
        return hwlaunch.launch(
            backend="cpu",
            executor="mp",
            world_size=n,
            start_method=method,
            rpc_channel=channel,
            rpc_spin=rpc_spin,
            init_distributed=False,
            worker_extension=Echo,
        )

    executors = {
        "shm": launch("shm", 2),
        "shm-spin": launch("shm", 2, spin),
        "pipe": launch("pipe", 2),
        "shm-8": launch("shm", 8),
    }
    default_spin = executors["shm"].rpc_spin
    window = max(spin, default_spin or 0.0)  # the longest any contender's workers poll

    def rpc(name: str, *args: Any) -> Callable[[], Any]:
        executor = executors[name]
        return lambda: executor.collective_rpc(*args)

    cases: dict[str, Callable[[], Any]] = {"pipe-floor/noop": pipe_round_trip(ends, small)}
    for name in executors:
        cases[f"{name}/noop"] = rpc(name, "ping")
    cases["pipe-floor/1MiB"] = pipe_round_trip(ends, large)
    for name in ("shm", "shm-spin", "pipe"):
        cases[f"{name}/1MiB"] = rpc(name, "echo", (large,))
    samples: dict[str, list[float]] = {name: [] for name in cases}
    try:
        for case in cases.values():  # warm-up
            case()
        order = list(cases.items())
        shuffle = random.Random(0).shuffle
        for _ in range(rounds):
            shuffle(order)  # no contender always runs right after the same other one
            for name, case in order:
                time.sleep(window + 0.02)  # the previous contender's workers stop polling
                times = samples[name]
                for _ in range(CALLS[name.split("/")[1]]):
                    start = time.perf_counter()
                    case()
                    times.append(time.perf_counter() - start)
        idle = {}
        for name in ("shm", "shm-spin"):
            executors[name].collective_rpc("ping")
            time.sleep(window + 0.05)
            workers = [psutil.Process(pid) for pid in executors[name].pids if pid is not None]
            before = [sum(w.cpu_times()[:2]) for w in workers]
            time.sleep(IDLE_SECONDS)
            idle[name] = [
                (sum(w.cpu_times()[:2]) - b) / IDLE_SECONDS
                for w, b in zip(workers, before, strict=True)
            ]
    finally:
        for executor in executors.values():
            executor.shutdown()
        for end in ends:
            end.close()
        for child in children:
            child.join(10)
    return {
        "method": method,
        "cpus": len(os.sched_getaffinity(0)),
        "load_average": os.getloadavg(),
        "default_spin": default_spin,
        "spin": spin,
        "rounds": rounds,
        "samples": samples,
        "median": {k: statistics.median(v) for k, v in samples.items()},
        "per_round_ratio": {
            "noop": per_round(samples["shm/noop"], samples["pipe-floor/noop"], rounds),
            "1MiB": per_round(samples["shm/1MiB"], samples["pipe/1MiB"], rounds),
        },
        "mean": {k: statistics.mean(v) for k, v in samples.items()},
        "idle_core_fraction": idle,
    }


def per_round(case: list[float], base: list[float], rounds: int) -> list[float]:
    """The ratio of the two medians within each round (the first sample of a round is its
    first call after the pause, so each round's calls are contiguous in the list)."""
    n, m = len(case) // rounds, len(base) // rounds
    return [
        statistics.median(case[i * n : (i + 1) * n]) / statistics.median(base[i * m : (i + 1) * m])
        for i in range(rounds)
    ]


def report(result: dict[str, Any]) -> str:
    med, mean = result["median"], result["mean"]

    def row(label: str, key: str, base: str, of: str) -> str:
        return (
            f"| {label} | {med[key] * 1e6:,.1f} µs | {med[key] / med[base]:.2f}x {of} | "
            f"{mean[key] * 1e6:,.1f} µs |"
        )

    spin, default = result["spin"], result["default_spin"]
    floor, floor_mib = "pipe-floor/noop", "pipe-floor/1MiB"
    idle = result["idle_core_fraction"]
    lines = [
        f"collective_rpc, mp executor ({result['method']}), {result['cpus']} CPUs, load average "
        f"{', '.join(f'{x:.1f}' for x in result['load_average'])} at the end; every call timed, "
        f"{result['rounds']} interleaved rounds; default spin window here: {default:g} s",
        "",
        "| case | median per call | ratio (medians) | mean per call |",
        "|---|---|---|---|",
        row("raw Pipe round trip to 2 children (floor)", floor, floor, "floor"),
        row(f"no-op to 2 workers, shm (spin {default:g} s)", "shm/noop", floor, "floor"),
        row(f"no-op to 2 workers, shm (spin {spin:g} s)", "shm-spin/noop", floor, "floor"),
        row("no-op to 2 workers, pipe channel", "pipe/noop", floor, "floor"),
        row("no-op to 8 workers, shm (default spin)", "shm-8/noop", "shm/noop", "2 workers"),
        row("raw Pipe 1 MiB round trip to 2 children", floor_mib, floor_mib, "floor"),
        row(f"1 MiB echo to 2 workers, shm (spin {default:g} s)", "shm/1MiB", "pipe/1MiB", "pipe"),
        row(
            f"1 MiB echo to 2 workers, shm (spin {spin:g} s)", "shm-spin/1MiB", "pipe/1MiB", "pipe"
        ),
        row("1 MiB echo to 2 workers, pipe channel", "pipe/1MiB", floor_mib, "floor"),
    ]
    per_round = result["per_round_ratio"]
    lines += [
        f"| per-round ratio, no-op shm (spin {default:g} s) / floor: lowest, highest | "
        f"{min(per_round['noop']):.2f}x, {max(per_round['noop']):.2f}x | | |",
        f"| per-round ratio, 1 MiB echo shm (spin {default:g} s) / pipe channel: lowest, highest | "
        f"{min(per_round['1MiB']):.2f}x, {max(per_round['1MiB']):.2f}x | | |",
    ]
    for name, label in (("shm", f"spin {default:g} s"), ("shm-spin", f"spin {spin:g} s")):
        lines.append(
            f"| idle shm worker CPU over {IDLE_SECONDS:g} s after the window ({label}) | "
            + ", ".join(f"{f * 100:.2f}%" for f in idle[name])
            + " of a core | | |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--method", default="fork", choices=("fork", "spawn", "forkserver"))
    parser.add_argument(
        "--spin", type=float, default=0.0, help="rpc_spin of the second shm contender"
    )
    parser.add_argument("--out", help="write every sample as JSON here")
    args = parser.parse_args()
    result = measure(args.rounds, args.method, args.spin)
    print(report(result))
    if args.out:
        with open(args.out, "w") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    sys.exit(main())
