"""One rank of the acme-sub executor: ``python -m hwlaunch_acme.rank``, started by the parent.

The parent writes frames to this process's stdin and reads replies from its original stdout;
fd 1 is pointed at stderr so that anything the worker prints cannot corrupt the channel.
"""

from __future__ import annotations

import os
import sys

from hwlaunch.executor import Failure, answer, dumps, loads, start_worker
from hwlaunch_acme.channel import read_frame, write_frame


def main() -> int:
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    start = read_frame(requests)
    if not start:
        return 0  # the parent went away before the start-up message
    plan, extension, rank, master_addr, master_port, init_distributed = loads(start)
    try:
        worker = start_worker(
            plan,
            extension,
            rank=rank,
            local_rank=rank,
            master_addr=master_addr,
            master_port=master_port,
            init_distributed=init_distributed,
        )
    except Exception as exc:
        write_frame(replies, dumps((False, Failure.current(exc))))
        return 1
    write_frame(replies, dumps((True, os.getpid())))
    try:
        while payload := read_frame(requests):  # empty: stop, or the parent's end of file
            write_frame(replies, answer(worker, payload))
    finally:
        worker.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
