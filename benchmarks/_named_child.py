"""One side of ``named_noop.py``: the named no-op to one mp worker (fork, shm channel), in the
hwlaunch that this interpreter imports; prints the medians of its rounds as JSON."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch  # noqa: F401  (the parent has torch, as an engine has)

import hwlaunch


class Ping:
    def ping(self) -> None:
        return None


def main() -> None:
    rounds, calls, pin = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "pin"
    executor = hwlaunch.launch(
        backend="cpu",
        executor="mp",
        world_size=1,
        start_method="fork",
        rpc_channel="shm",
        init_distributed=False,
        worker_extension=Ping,
    )
    try:
        if pin:  # the parent on one CPU, the worker on another: no scheduler placement
            cpus = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cpus[0]})
            os.sched_setaffinity(executor.pids[0], {cpus[-1]})
        for _ in range(1000):
            executor.collective_rpc("ping")
        medians = []
        for _ in range(rounds):
            times = []
            for _ in range(calls):
                began = time.perf_counter()
                executor.collective_rpc("ping")
                times.append(time.perf_counter() - began)
            medians.append(statistics.median(times))
        print(json.dumps({"version": hwlaunch.__file__, "medians": medians}))
    finally:
        executor.shutdown()


if __name__ == "__main__":
    main()
