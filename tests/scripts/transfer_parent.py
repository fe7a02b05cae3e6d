"""A parent that launches 2 shm workers, prints their pids, then echoes 64 MiB for ever.

Used by the test of a parent SIGKILLed mid-transfer: after each round trip it prints a line,
so the test kills it while the next 64 MiB are on their way.
Usage: transfer_parent.py START_METHOD
"""

from __future__ import annotations

import json
import os
import sys

import hwlaunch


def echo(worker: hwlaunch.Worker, data: bytes) -> bytes:
    return data


def main() -> None:
    executor = hwlaunch.launch(
        backend="cpu", world_size=2, start_method=sys.argv[1], rpc_channel="shm"
    )
    print(json.dumps({"parent": os.getpid(), "workers": executor.pids}), flush=True)
    data = os.urandom(64 * 1024 * 1024)
    while True:
        executor.collective_rpc(echo, (data,))
        print("round trip", flush=True)


if __name__ == "__main__":
    main()
