"""What the CPU thread budget buys: 2 workers stepping together, with and without it.

    python benchmarks/thread_budget.py [--rounds 7] [--steps 20] [--size 256] [--out FILE.json]

Two cpu workers (mp, fork, gloo process group) each run a tensor-parallel-like step: a
``size x size`` float32 matmul, then an ``all_reduce`` of its result, ``--steps`` times per
call. Contenders, interleaved round by round (a new random order each round, seeded), so that a
burst of load from elsewhere hits both alike:

- ``budget``: the plan's default, each worker's share of the CPUs this process may use
  (``cpu_threads`` = CPUs / 2);
- ``no budget``: ``cpu_threads`` = the CPU count, what every worker ran before the budget existed
  (torch's own default: one intra-op thread per CPU, in each worker).

A round times one call on every worker (the slowest worker's time: the step is as slow as its
slowest rank). The table shows the median per step of each contender over the rounds and the
ratio of the medians; ``--out`` writes every sample as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from typing import Any


def steps(worker: Any, count: int, size: int) -> float:
    """``count`` matmul + all_reduce steps in this worker; seconds they took."""
    import torch
    import torch.distributed as dist

    a = torch.randn(size, size)
    b = torch.randn(size, size)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(count):
        c = a @ b
        dist.all_reduce(c)
    return time.perf_counter() - start


def measure(rounds: int, count: int, size: int) -> dict[str, Any]:
    import hwlaunch

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    contenders = {"budget": None, "no budget": cpus}
    executors = {
        name: hwlaunch.launch(
            backend="cpu", executor="mp", world_size=2, start_method="fork", cpu_threads=threads
        )
        for name, threads in contenders.items()
    }
    threads = {name: ex.plan.cpu_threads for name, ex in executors.items()}
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    order = random.Random(0)
    try:
        for ex in executors.values():
            ex.collective_rpc(steps, args=(2, size))  # warm-up: pools, gloo buffers
        for _ in range(rounds):
            names = list(contenders)
            order.shuffle(names)
            for name in names:
                seconds = executors[name].collective_rpc(steps, args=(count, size))
                samples[name].append(max(seconds) / count)
    finally:
        for ex in executors.values():
            ex.shutdown()
    return {"cpus": cpus, "threads": threads, "size": size, "steps": count, "samples": samples}


def table(result: dict[str, Any]) -> str:
    medians = {name: statistics.median(s) for name, s in result["samples"].items()}
    lines = [
        f"{result['cpus']} CPUs, 2 workers, {result['size']}x{result['size']} matmul + "
        f"all_reduce, median ms per step over {len(result['samples']['budget'])} rounds",
        f"{'contender':<12} {'cpu_threads':>11} {'ms/step':>9}",
    ]
    for name, median in medians.items():
        lines.append(f"{name:<12} {result['threads'][name]:>11} {median * 1000:>9.2f}")
    ratio = medians["no budget"] / medians["budget"]
    lines.append(f"no budget / budget: {ratio:.2f}x")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--out", help="write every sample as JSON to this file")
    args = parser.parse_args()
    result = measure(args.rounds, args.steps, args.size)
    print(table(result))
    if args.out:
        with open(args.out, "w") as file:
            json.dump(result, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
