"""The raw shared-memory floor of a 1 MiB round trip, batch by batch, in three placements.

    python benchmarks/floor_modes.py [--batches 20] [--size-mib 1]

Before trusting the payload ratios of ``rpc_channel.py`` on a machine, see whether its floor
is steady: a parent and a forked child (``_floor.py``) copy the payload in and out through an
``mmap``, in batches of 50 timed round trips (after 20 that are not timed) with a pause of
0.1 s between batches, as the benchmark's turns have. Printed, each batch's median, in µs, with
the parent and the child pinned to different CPUs (``apart``), both pinned to the first CPU
(``same``), and both left to the scheduler (``scheduler``). On some days a 2-CPU VM runs every
batch apart either at a copy's speed or several times slower, while pinned to one CPU it stays
steady: the ratios of that day are then ratios to a floor that jumps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _floor import Floor  # benchmarks/ on sys.path

MIB = 1024 * 1024


def batch_medians(floor: Floor, data: bytes, batches: int) -> list[float]:
    out = []
    for _ in range(batches):
        call = floor.begin(data)
        for _ in range(20):
            call()
        times = []
        for _ in range(50):
            began = time.perf_counter()
            call()
            times.append(time.perf_counter() - began)
        floor.end()
        out.append(statistics.median(times) * 1e6)
        time.sleep(0.1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--size-mib", type=int, default=1)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    data = os.urandom(args.size_mib * MIB)
    floor = Floor(len(data))
    try:
        placements = {
            "apart": ({cpus[0]}, {cpus[-1]}),
            "same": ({cpus[0]}, {cpus[0]}),
            "scheduler": (set(cpus), set(cpus)),
        }
        for name, (parent, child) in placements.items():
            os.sched_setaffinity(0, parent)
            os.sched_setaffinity(floor.pid, child)
            medians = batch_medians(floor, data, args.batches)
            print(f"{name:9s} " + " ".join(f"{m:.0f}" for m in medians))
    finally:
        os.sched_setaffinity(0, set(cpus))
        floor.close()


if __name__ == "__main__":
    main()
