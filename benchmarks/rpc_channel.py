"""collective_rpc through the shared-memory channel against the pipe channel, side by side.

    python benchmarks/rpc_channel.py [--rounds 7] [--method fork] [--out FILE.json]

In one parent (torch imported first, as an engine has), interleaved round by round so that a
burst of load from elsewhere hits every contender alike:

- a raw ``multiprocessing.Pipe`` round trip to 2 child processes (bytes out, bytes back): the
  floor any pipe-based RPC pays;
- a no-op ``collective_rpc`` to 2 workers with ``rpc_channel="shm"`` and ``"pipe"``;
- a no-op ``collective_rpc`` to 8 workers with ``shm`` (scaling; meaningful only with at least 8
  free cores, the core count is printed);
- a 1 MiB echo (1 MiB out to each worker, 1 MiB back from each) with ``shm`` and ``pipe``;
- the CPU time of 2 idle ``shm`` workers over 5 s, starting after the spin window.

Between two contenders the parent waits out the spin window, so that workers still polling
after one contender's calls do not take CPU from the next. Prints a markdown table (medians and
ratios) and writes every sample as JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

MIB = 1024 * 1024
CALLS = {"noop": 400, "1MiB": 40}
IDLE_SECONDS = 5.0


class Echo:
    """worker_extension: a named method that returns its argument."""

    def echo(self, data: bytes) -> bytes:
        return data


def pipe_echo(conn: Connection, other_end: Connection) -> None:
    """Raw Pipe floor: send back what arrives."""
    other_end.close()
    while True:
        try:
            conn.send_bytes(conn.recv_bytes())
        except (EOFError, OSError):
            return


def measure(rounds: int, method: str, spin_setting: float | None) -> dict[str, Any]:
    import psutil
    import torch  # noqa: F401

    import hwlaunch

    small, large = b"x" * 16, os.urandom(MIB)
    ctx = multiprocessing.get_context("fork")
    ends, children = [], []
    for _ in range(2):
        parent_end, child_end = ctx.Pipe()
        child = ctx.Process(target=pipe_echo, args=(child_end, parent_end))
        child.start()
        child_end.close()
        ends.append(parent_end)
        children.append(child)

    def launch(channel: str, n: int) -> Any:
        return hwlaunch.launch(
            backend="cpu",
            executor="mp",
            world_size=n,
            start_method=method,
            rpc_channel=channel,
            rpc_spin=spin_setting,
            init_distributed=False,
            worker_extension=Echo,
        )

    shm2, pipe2, shm8 = launch("shm", 2), launch("pipe", 2), launch("shm", 8)
    spin = shm2.rpc_spin

    def raw(data: bytes) -> Callable[[], None]:
        def round_trip() -> None:
            for end in ends:
                end.send_bytes(data)
            for end in ends:
                end.recv_bytes()

        return round_trip

    cases: dict[str, Callable[[], Any]] = {
        "pipe-floor/noop": raw(small),
        "shm/noop": lambda: shm2.collective_rpc("ping"),
        "pipe/noop": lambda: pipe2.collective_rpc("ping"),
        "shm-8/noop": lambda: shm8.collective_rpc("ping"),
        "pipe-floor/1MiB": raw(large),
        "shm/1MiB": lambda: shm2.collective_rpc("echo", (large,)),
        "pipe/1MiB": lambda: pipe2.collective_rpc("echo", (large,)),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    try:
        for case in cases.values():  # warm-up
            case()
        for _ in range(rounds):
            for name, case in cases.items():
                time.sleep(spin + 0.02)  # the previous contender's workers stop polling
                count = CALLS[name.split("/")[1]]
                start = time.perf_counter()
                for _ in range(count):
                    case()
                samples[name].append((time.perf_counter() - start) / count)
        shm2.collective_rpc("ping")
        time.sleep(spin + 0.05)
        workers = [psutil.Process(pid) for pid in shm2.pids if pid is not None]
        before = [sum(w.cpu_times()[:2]) for w in workers]
        time.sleep(IDLE_SECONDS)
        idle = [
            (sum(w.cpu_times()[:2]) - b) / IDLE_SECONDS
            for w, b in zip(workers, before, strict=True)
        ]
    finally:
        for executor in (shm2, pipe2, shm8):
            executor.shutdown()
        for end in ends:
            end.close()
        for child in children:
            child.join(10)
    return {
        "method": method,
        "cpus": os.cpu_count(),
        "spin": spin,
        "samples": samples,
        "median": {k: statistics.median(v) for k, v in samples.items()},
        "idle_core_fraction": idle,
    }


def report(result: dict[str, Any]) -> str:
    med = result["median"]

    def us(key: str) -> str:
        return f"{med[key] * 1e6:.1f} µs"

    def ratio(key: str, base: str) -> str:
        return f"{med[key] / med[base]:.2f}x"

    lines = [
        f"collective_rpc, mp executor ({result['method']}), {result['cpus']} CPUs, "
        f"spin window {result['spin']:g} s; medians of {len(result['samples']['shm/noop'])} "
        "interleaved rounds",
        "",
        "| case | median | ratio |",
        "|---|---|---|",
        f"| raw Pipe round trip to 2 children (floor) | {us('pipe-floor/noop')} | 1.00x |",
        f"| no-op to 2 workers, shm | {us('shm/noop')} | {ratio('shm/noop', 'pipe-floor/noop')} "
        "of floor |",
        f"| no-op to 2 workers, pipe | {us('pipe/noop')} | "
        f"{ratio('pipe/noop', 'pipe-floor/noop')} of floor |",
        f"| no-op to 8 workers, shm | {us('shm-8/noop')} | {ratio('shm-8/noop', 'shm/noop')} "
        "of 2 workers |",
        f"| raw Pipe 1 MiB round trip to 2 children | {us('pipe-floor/1MiB')} | 1.00x |",
        f"| 1 MiB echo to 2 workers, shm | {us('shm/1MiB')} | {ratio('shm/1MiB', 'pipe/1MiB')} "
        "of pipe channel |",
        f"| 1 MiB echo to 2 workers, pipe | {us('pipe/1MiB')} | "
        f"{ratio('pipe/1MiB', 'pipe-floor/1MiB')} of floor |",
        "| idle shm worker CPU over 5 s (each) | "
        + ", ".join(f"{f * 100:.2f}%" for f in result["idle_core_fraction"])
        + " of a core | |",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--method", default="fork", choices=("fork", "spawn", "forkserver"))
    parser.add_argument("--spin", type=float, help="rpc_spin (default: the plan's)")
    parser.add_argument("--out", help="write every sample as JSON here")
    args = parser.parse_args()
    result = measure(args.rounds, args.method, args.spin)
    print(report(result))
    if args.out:
        with open(args.out, "w") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    sys.exit(main())
