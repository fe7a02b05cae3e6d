"""A parent whose workers each start a process tree, then wait for the test to kill it.

Each worker starts two ``subprocess.Popen(["sleep", "300"])`` and a 2-process
``multiprocessing.Pool``; the parent prints one JSON line with its pid, the workers' pids and
every descendant of the workers, then blocks: idle in ``time.sleep`` (MODE ``idle``) or inside
a 600 s RPC (MODE ``busy``). Used by tests/integration/test_process_tree.py and benchmarks/reliability.py.
Usage: tree_parent.py START_METHOD [MODE] [WORLD_SIZE]
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from typing import Any

import psutil

import hwlaunch


def start_tree(worker: hwlaunch.Worker) -> list[int]:
    """Two Popen sleeps and a 2-process Pool that has run a task; returns their pids."""
    kept: list[Any] = [subprocess.Popen(["sleep", "300"]) for _ in range(2)]
    pool = multiprocessing.get_context().Pool(2)
    pool.map(abs, range(4))
    kept.append(pool)
    # Kept on the worker, which lives as long as the process (a Pool ends when collected; a
    # module global would not do: this function travels by value, with a copy of its globals).
    worker.kept_tree = kept  # type: ignore[attr-defined]
    return [p.pid for p in psutil.Process().children(recursive=True)]


def busy(worker: hwlaunch.Worker) -> None:
    time.sleep(600)


def main() -> None:
    method = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else "idle"
    world_size = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    executor = hwlaunch.launch(backend="cpu", world_size=world_size, start_method=method)
    trees = executor.collective_rpc(start_tree)
    report = {
        "parent": os.getpid(),
        "workers": executor.pids,  # type: ignore[attr-defined]
        "descendants": [pid for tree in trees for pid in tree],
    }
    print(json.dumps(report), flush=True)
    if mode == "busy":
        executor.collective_rpc(busy)
    time.sleep(600)


if __name__ == "__main__":
    main()
