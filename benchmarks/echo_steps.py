"""Where a 1 MiB echo through the shm channel spends its time, step by step, on both sides.

    python benchmarks/echo_steps.py [--kind bytes|tensor] [--calls 300] [--pin]

One fork worker; the channel's and the worker's steps are wrapped to record a timestamp
(``time.perf_counter_ns``, one clock for both processes) as they begin and end: the parent's
encoding, its write into shared memory, the worker's decoding up to the call, the call, the
flush of its output, its encoding and its write, and the parent's decoding. Printed: the
median of each timestamp from the call's start, over the calls whose steps came in the usual
order, and the time from the step before. The wrapping itself adds well under a microsecond
per step. ``--pin`` puts the parent and the worker on CPUs of their own.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from _contenders import Echo, channel_executor, pin_apart  # benchmarks/ on sys.path

import hwlaunch.executor._runtime as runtime
import hwlaunch.executor.mp._child as child
import hwlaunch.executor.mp._shm_channel as shm
import hwlaunch.executor.transport._wire as wire

STAMPS: list[tuple[str, int]] = []  # (step and > or <, nanoseconds); the worker has its own copy


def _wrap(owner: Any, name: str, step: str) -> None:
    inner: Callable[..., Any] = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        STAMPS.append((step + ">", time.perf_counter_ns()))
        try:
            return inner(*args, **kwargs)
        finally:
            STAMPS.append((step + "<", time.perf_counter_ns()))

    setattr(owner, name, timed)


def _instrument() -> None:
    """Before the launch: the fork worker inherits the wrapped functions."""
    _wrap(shm.ShmChannel, "send", "parent write")
    _wrap(shm.ShmChannel, "_decode", "parent decode")
    _wrap(shm.ShmEndpoint, "recv", "worker take")
    _wrap(shm.ShmEndpoint, "send", "worker write")
    _wrap(runtime, "call", "worker call")
    _wrap(child, "flush_output", "worker flush")
    _wrap(wire, "_dump", "encode")


def _worker_stamps(worker: Any) -> list[tuple[str, int]]:
    return list(sys.modules[__name__].STAMPS)


def _by_call(stamps: list[tuple[str, int]]) -> list[list[tuple[str, int]]]:
    calls: list[list[tuple[str, int]]] = []
    for step, at in sorted(stamps, key=lambda stamp: stamp[1]):
        if step == "call>":
            calls.append([])
        if calls:
            calls[-1].append((step, at))
    return [c for c in calls if c and c[-1][0] == "call<"]


def report(stamps: list[tuple[str, int]]) -> None:
    """The medians of the calls whose steps came in the most common order."""
    orders: dict[tuple[str, ...], list[list[int]]] = {}
    for steps in _by_call(stamps):
        start = steps[0][1]
        orders.setdefault(tuple(s for s, _ in steps), []).append([t - start for _, t in steps])
    order, rows = max(orders.items(), key=lambda item: len(item[1]))
    print(f"{len(rows)} calls in this order, of {sum(len(r) for r in orders.values())}")
    before = 0.0
    for index, step in enumerate(order):
        at = statistics.median(row[index] for row in rows) / 1000
        print(f"  {step:16s} {at:8.1f} µs  (+{at - before:6.1f})")
        before = at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("bytes", "tensor"), default="bytes")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--pin", action="store_true")
    args = parser.parse_args()
    _instrument()
    executor = channel_executor(Echo)
    try:
        if args.pin:
            pin_apart(executor)
        mib = 1024 * 1024
        data = os.urandom(mib) if args.kind == "bytes" else torch.rand(mib // 4)
        for _ in range(200):
            executor.collective_rpc("echo", (data,))
        executor.collective_rpc(lambda worker: sys.modules[__name__].STAMPS.clear())
        STAMPS.clear()
        for _ in range(args.calls):
            STAMPS.append(("call>", time.perf_counter_ns()))
            executor.collective_rpc("echo", (data,))
            STAMPS.append(("call<", time.perf_counter_ns()))
        mine = list(STAMPS)
        report(mine + executor.collective_rpc(_worker_stamps)[0])
    finally:
        executor.shutdown()


if __name__ == "__main__":
    main()
