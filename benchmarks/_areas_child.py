"""One side of ``alternate_areas.py``: 1 MiB calls to one mp worker (fork, shm channel) in the
hwlaunch that this interpreter imports; prints the median of each pattern as JSON."""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil
import torch
from _contenders import channel_executor, pin_apart  # benchmarks/ on sys.path

import hwlaunch

MIB = 1024 * 1024
WARM, TIMED = 30, 15  # calls per turn: untimed, then timed


class Patterns:
    """worker_extension: an echo, an argument read through, a result kept and returned."""

    def echo(self, value: Any) -> Any:
        return value

    def read(self, tensor: torch.Tensor) -> float:
        return float(np.add.reduce(tensor.numpy()))  # numpy: no torch thread pool

    def result(self, seed: int) -> torch.Tensor:
        kept = getattr(self, "kept", None)
        if kept is None:
            kept = self.kept = torch.from_numpy(
                np.random.default_rng(seed).random(MIB // 4, np.float32)
            )
        return kept


def calls(executor: Any) -> dict[str, Callable[[], Any]]:
    data = os.urandom(MIB)
    tensor = torch.from_numpy(np.frombuffer(os.urandom(MIB), dtype=np.float32).copy())

    def result_read() -> None:
        (value,) = executor.collective_rpc("result", (1,))
        np.add.reduce(value.numpy())

    return {
        "bytes echo": lambda: executor.collective_rpc("echo", (data,)),
        "tensor echo": lambda: executor.collective_rpc("echo", (tensor,)),
        "argument read by the worker": lambda: executor.collective_rpc("read", (tensor,)),
        "result read by the caller": result_read,
        "result dropped unread": lambda: executor.collective_rpc("result", (1,)),
    }


def main() -> None:
    rounds, pin = int(sys.argv[1]), sys.argv[2] == "pin"
    executor = channel_executor(Patterns)
    try:
        if pin:
            pin_apart(executor)
        cases = calls(executor)
        samples: dict[str, list[float]] = {name: [] for name in cases}
        order, together = list(cases), 0
        me, worker = psutil.Process(), psutil.Process(executor.pids[0])
        for turn in range(rounds):
            random.Random(turn).shuffle(order)
            for name in order:
                call = cases[name]
                for _ in range(WARM):
                    call()
                for _ in range(TIMED):
                    began = time.perf_counter()
                    call()
                    samples[name].append(time.perf_counter() - began)
                together += me.cpu_num() == worker.cpu_num()  # the CPU each last ran on
        medians = {name: statistics.median(times) for name, times in samples.items()}
        shared = together / (rounds * len(cases))
        print(json.dumps({"version": hwlaunch.__file__, "medians": medians, "shared": shared}))
    finally:
        executor.shutdown()


if __name__ == "__main__":
    main()
