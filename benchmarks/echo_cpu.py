"""The CPU cost of a 1 MiB echo through the shm channel, without processes or a scheduler.

    python benchmarks/echo_cpu.py [--rounds 40] [--baseline DIR] [--pairs 4]

Both sides of the channel run in this one process, on one CPU, one after the other: the
parent's encoding and write (``ShmChannel.send``), the worker's read, decoding, call, encoding
and write (``CallReader``, ``ShmEndpoint``), and the parent's read and decoding
(``ShmChannel.receive``), as a fork worker runs them, but with no wait, no wake-up and no other
process between them. Beside it, in the same rounds, the floor's work: the same bytes copied
into shared memory, out, into a reply area and out again. So the figure is
the data path's own cost, which the VM's placement of two processes (``floor_modes.py``)
does not move. Medians of ``--rounds`` rounds of 15 timed echoes (after 10 untimed) of each
kind, in a new order each round. ``--baseline DIR`` (another version's ``hwlaunch`` first on
``PYTHONPATH``) runs this in fresh processes, ``--pairs`` of each version in turn.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from _contenders import env_with_version  # benchmarks/ on sys.path

MIB = 1024 * 1024


class Echo:
    def echo(self, value: Any) -> Any:
        return value


def channel_echo(payload: Any) -> Callable[[], None]:
    """One echo of ``payload`` through a one-reader channel, both sides here."""
    from hwlaunch.executor._runtime import flush_output, outcome
    from hwlaunch.executor.mp._shm_channel import ShmChannel
    from hwlaunch.executor.transport._callables import CallReader
    from hwlaunch.executor.transport._messages import CALL, request_head
    from hwlaunch.executor.transport.codec import FRAMES, encoded

    channel = ShmChannel(1, spin=0.0)
    endpoint = channel.endpoint(0)
    reader, worker = CallReader(), Echo()

    def echo() -> None:
        head = request_head(CALL, 1, None)
        channel.send(FRAMES.encode_request(("echo", (payload,), {})), lambda: None, None, head)
        _, rpc_id, _, request = reader.next(endpoint)
        ok, value = outcome(worker, request, reader.take)  # type: ignore[arg-type]
        flush_output()
        reply = encoded(FRAMES.encode_reply, (rpc_id, ok, value))
        value = request = None
        endpoint.send(reply)
        replies, _ = channel.receive((0,), time.monotonic() + 10.0, (), FRAMES.decode_reply)
        assert replies and replies[0][1][2] is not None

    return echo


def floor_echo(data: bytes) -> Callable[[], None]:
    """The four copies of an echo, into and out of shared memory, and nothing else (into
    buffers made once, so that the allocator's page faults are not part of it)."""
    n = len(data)
    memory = memoryview(mmap.mmap(-1, 2 * n))
    taken, returned = bytearray(n), bytearray(n)

    def echo() -> None:
        memory[:n] = data
        taken[:] = memory[:n]
        memory[n:] = taken
        returned[:] = memory[n:]

    return echo


def measure(rounds: int) -> dict[str, float]:
    import torch

    cases = {
        "floor": floor_echo(os.urandom(MIB)),
        "bytes": channel_echo(os.urandom(MIB)),
        "tensor": channel_echo(torch.rand(MIB // 4)),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    order = list(cases)
    for turn in range(rounds):
        random.Random(turn).shuffle(order)
        for name in order:
            echo = cases[name]
            for _ in range(10):
                echo()
            for _ in range(15):
                began = time.perf_counter()
                echo()
                samples[name].append(time.perf_counter() - began)
    return {name: statistics.median(times) for name, times in samples.items()}


def report(label: str, medians: dict[str, float]) -> str:
    floor = medians["floor"]
    return f"{label}: " + ", ".join(
        f"{name} {value * 1e6:.1f} µs" + ("" if name == "floor" else f" (x{value / floor:.2f})")
        for name, value in medians.items()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--baseline", help="a directory holding another version's hwlaunch")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[-1]})
    if args.child:
        print(json.dumps(measure(args.rounds)))
        return
    if not args.baseline:
        print(report("this", measure(args.rounds)))
        return
    runs: dict[str, list[dict[str, float]]] = {"this": [], "baseline": []}
    command = [sys.executable, __file__, "--child", "--rounds", str(args.rounds)]
    for pair in range(args.pairs):
        for who in ("this", "baseline") if pair % 2 == 0 else ("baseline", "this"):
            env = env_with_version(args.baseline if who == "baseline" else None)
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            runs[who].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(report(f"  {who}", runs[who][-1]))
    for who, results in runs.items():
        print(report(who, {k: statistics.median(r[k] for r in results) for k in results[0]}))


if __name__ == "__main__":
    main()
