"""One side of ``named_noop.py``: the named no-op to N mp workers (fork, shm channel), in the
hwlaunch that this interpreter imports; prints the medians of its rounds as JSON.

    _named_child.py ROUNDS CALLS pin|free [WORKERS]
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch  # noqa: F401  (the parent has torch, as an engine has)
from _contenders import channel_executor, pin_apart  # benchmarks/ on sys.path

import hwlaunch


class Ping:
    def ping(self) -> None:
        return None


def main() -> None:
    rounds, calls, pin = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "pin"
    workers = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    executor = channel_executor(Ping, n=workers)
    try:
        if pin:
            pin_apart(executor)
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
