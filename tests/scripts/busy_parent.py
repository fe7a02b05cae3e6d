"""A parent that launches 2 workers, prints their pids, then blocks in a 600 s RPC.

Used by the parent-death and KeyboardInterrupt tests: the test kills or interrupts this process
once both workers are inside the RPC (each touches ``<markers>/rank<N>`` on entry).
Usage: busy_parent.py START_METHOD MARKER_DIR [MODE]

MODE ``busy`` (the default) is the above. The others end the program without ``shutdown()``,
for the finalizer at interpreter exit to deal with: ``return`` returns from main at once,
``return-while-busy`` once a daemon thread has both workers inside the 600 s RPC.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil

import hwlaunch


def busy(worker: hwlaunch.Worker, marker_dir: str) -> None:
    Path(marker_dir, f"rank{worker.rank}").touch()
    time.sleep(600)


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def main() -> None:
    # Python raises KeyboardInterrupt on SIGINT only if SIGINT was not ignored when it started
    # (a background job of a non-interactive shell ignores it): make it explicit.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    method, marker_dir = sys.argv[1], sys.argv[2]
    mode = sys.argv[3] if len(sys.argv) > 3 else "busy"
    executor = hwlaunch.launch(backend="cpu", world_size=2, start_method=method)
    print(json.dumps({"parent": os.getpid(), "workers": executor.pids}), flush=True)
    if mode == "return":
        return
    if mode == "return-while-busy":
        rpc = threading.Thread(target=executor.collective_rpc, args=(busy, (marker_dir,)))
        rpc.daemon = True
        rpc.start()
        while len(os.listdir(marker_dir)) < 2:
            time.sleep(0.005)
        print(json.dumps({"returning": True}), flush=True)
        return
    try:
        executor.collective_rpc(busy, args=(marker_dir,))
    except KeyboardInterrupt:
        alive = [pid for pid in executor.pids if pid is not None and running(pid)]
        print(json.dumps({"interrupted": True, "alive_after_interrupt": alive}), flush=True)
        raise


if __name__ == "__main__":
    main()
