"""What per-rank output costs: 100,000 printed lines from 2 hwlaunch workers, beside the same
prints from a plain multiprocessing child, in one run.

    python benchmarks/print_overhead.py [--lines 100000] [--rounds 7]

The driver runs with its stdout on a file (as a job's log would be), and both contenders print
into it: the hwlaunch workers through their pipes, each line prefixed by the driver
(``[rank0 pid=1234] ``), the plain child (``multiprocessing``, fork) straight to the inherited
descriptor, unprefixed. A round is timed from the request to print until the file holds every
byte: ``collective_rpc`` with half the lines on each of the 2 workers, or a message to the
waiting child with all of them. The workers and the child are started before the rounds, the
two contenders alternate, and the medians are compared. Prints a markdown table; the target is
a ratio of at most 1.5.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Any

TEXT = "step {i}: loss 0.1234 lr 3e-4 tokens/s 12345"
CASES = {
    "plain": "plain multiprocessing child (1)",
    "plain2": "plain multiprocessing children (2), half each",
    "hwlaunch": "hwlaunch workers (2), half each, prefixed",
}


def print_lines(first: int, count: int) -> int:
    """The prints both contenders make; returns the bytes written."""
    written = 0
    for i in range(first, first + count):
        line = TEXT.format(i=i)
        print(line)
        written += len(line) + 1
    sys.stdout.flush()
    return written


def worker_prints(worker: Any, per_rank: int) -> tuple[int, int]:
    return print_lines(worker.rank * per_rank, per_rank), os.getpid()


def plain_child(conn: Connection) -> None:
    while (count := conn.recv()) is not None:
        conn.send(print_lines(0, count))


def wait_for_size(size: int) -> None:
    """Until this process's stdout (a file) holds ``size`` bytes."""
    while os.fstat(1).st_size < size:
        time.sleep(0.0002)


def inner(lines: int, rounds: int) -> dict[str, list[float]]:
    """The measuring driver: its stdout is the file both contenders write to."""
    import hwlaunch
    from hwlaunch.console import format_prefix

    ctx = multiprocessing.get_context("fork")
    pipes = [ctx.Pipe() for _ in range(3)]  # one child for "plain", two for "plain2"
    children = [ctx.Process(target=plain_child, args=(there,)) for _, there in pipes]
    for child in children:
        child.start()  # before the executor's threads exist
    times: dict[str, list[float]] = {case: [] for case in CASES}
    plan = hwlaunch.resolve(backend="cpu", world_size=2, start_method="fork")
    with hwlaunch.launch(plan, init_distributed=False) as ex:
        prefix = [
            len(format_prefix(plan.console_prefix, rank=r, local_rank=r, pid=pid,
                              backend="cpu", node="").encode())
            for r, pid in enumerate(ex.pids)
        ]  # fmt: skip
        for n in range(rounds):
            for case in CASES if n % 2 == 0 else reversed(CASES):
                sys.stdout.flush()
                before = os.fstat(1).st_size
                start = time.perf_counter()
                if case == "hwlaunch":
                    done = ex.collective_rpc(worker_prints, args=(lines // 2,), timeout=600)
                    size = sum(b + (lines // 2) * prefix[r] for r, (b, _) in enumerate(done))
                else:
                    mine = pipes[:1] if case == "plain" else pipes[1:]
                    for here, _ in mine:
                        here.send(lines // len(mine))
                    size = sum(here.recv() for here, _ in mine)
                wait_for_size(before + size)
                times[case].append(time.perf_counter() - start)
    for (here, _), child in zip(pipes, children, strict=True):
        here.send(None)
        child.join()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        json.dump(inner(args.lines, args.rounds), sys.stderr)
        return
    with tempfile.TemporaryFile() as out:
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--inner",
                f"--lines={args.lines}",
                f"--rounds={args.rounds}",
            ],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        sys.exit(done.stderr)
    times = json.loads(done.stderr.strip().splitlines()[-1])
    medians = {case: statistics.median(times[case]) for case in CASES}
    print(f"{args.lines:,} printed lines into a file, median of {args.rounds} interleaved rounds\n")
    print("| contender | median (ms) | lines/s | ratio to 1 plain child |")
    print("|---|---|---|---|")
    for case, name in CASES.items():
        value = medians[case]
        ratio = value / medians["plain"]
        print(f"| {name} | {value * 1e3:.1f} | {args.lines / value:,.0f} | {ratio:.2f} |")
    ratio = medians["hwlaunch"] / medians["plain"]
    target = "meets" if ratio <= 1.5 else "misses"
    beside = medians["hwlaunch"] / medians["plain2"]
    print(
        f"\nratio {ratio:.2f}: {target} the target of at most 1.5 ({beside:.2f} to 2 plain children)"
    )


if __name__ == "__main__":
    main()
