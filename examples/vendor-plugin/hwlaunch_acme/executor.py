"""acme-sub: an executor of the Acme plugin that starts each rank with its own command.

Acme's fictional cluster tools want every rank started through a wrapper (think ``numactl`` or
a vendor's device-binding launcher), which hwlaunch's mp executor knows nothing about. So the
plugin brings its own executor: each rank is ``$ACME_LAUNCHER python -m hwlaunch_acme.rank``,
started with ``subprocess`` and driven over its stdin and stdout (hwlaunch_acme.channel).

It uses only hwlaunch's public API: the Executor base class (which owns the state, the RPC
entry point and the error vocabulary; this class implements its public extension points
``start_ranks``, ``exchange`` and ``stop_ranks``, and reports through ``report_status``,
``timed_out``, ``worker_died`` and ``startup_timed_out``), and the worker-side functions in ``hwlaunch.executor`` that the
built-in executors use too, so its workers behave the same.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shlex
import subprocess
import sys
import threading
import time
from typing import Any

from hwlaunch import WorkerDiedError, WorkerStartupError
from hwlaunch.executor import Executor, Failure, dumps, free_port, loads, worker_environment
from hwlaunch_acme.channel import HEADER, write_frame

LAUNCHER_VAR = "ACME_LAUNCHER"  # e.g. "numactl --localalloc": put before each rank's command
STOP_WAIT = 5.0  # seconds a rank gets to leave its process group before it is killed


class AcmeSubprocessExecutor(Executor):
    """Each rank a subprocess started through ``$ACME_LAUNCHER``, driven over its pipes."""

    def start_ranks(self, extension: bytes | str | None, init_distributed: bool) -> None:
        self._procs: list[subprocess.Popen[bytes]] = []
        self._stop_lock = threading.Lock()
        self._stopped = False
        port = free_port()
        prefix = shlex.split(os.environ.get(LAUNCHER_VAR, ""))
        for rank in range(self.plan.world_size):
            env = {**os.environ, **worker_environment(self.plan, rank, rank, "127.0.0.1", port)}
            proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", "hwlaunch_acme.rank"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            self._procs.append(proc)
            start = (self.plan, extension, rank, "127.0.0.1", port, init_distributed)
            self._send(rank, dumps(start))
            self.report_status(rank, "started")
        replies, pending = self._gather(self.startup_timeout)
        if pending:
            raise self.startup_timed_out(pending)
        for rank, (ok, value) in replies.items():
            if not ok:
                raise WorkerStartupError(
                    rank, f"{value.exc_type}: {value.message}", value.traceback
                )
            self.report_status(rank, "ready")

    def exchange(
        self, request: Any, label: str, timeout: float | None, reply_rank: int | None
    ) -> tuple[list[Any], dict[int, Failure]]:
        payload = dumps(request)
        for rank in range(len(self._procs)):
            self._send(rank, payload)
        replies, pending = self._gather(timeout)
        if pending:
            raise self.timed_out(label, pending, timeout)
        failures = {rank: value for rank, (ok, value) in replies.items() if not ok}
        return [value if ok else None for ok, value in replies.values()], failures

    # -- the channel -----------------------------------------------------------------------
    def _send(self, rank: int, payload: bytes) -> None:
        stdin = self._procs[rank].stdin
        assert stdin is not None
        try:
            write_frame(stdin, payload)
        except (BrokenPipeError, OSError):
            self._rank_died(rank)

    def _rank_died(self, rank: int) -> None:
        proc = self._procs[rank]
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_WAIT)
        raise self.worker_died(WorkerDiedError(rank, proc.pid, proc.returncode, "acme-sub"))

    def _gather(self, timeout: float | None) -> tuple[dict[int, tuple[bool, Any]], list[int]]:
        """One reply from every rank, in rank order, and the ranks silent at the deadline."""
        deadline = None if timeout is None else time.monotonic() + timeout
        buffers = {rank: b"" for rank in range(len(self._procs))}
        replies: dict[int, tuple[bool, Any]] = {}
        with selectors.DefaultSelector() as selector:
            for rank, proc in enumerate(self._procs):
                assert proc.stdout is not None
                selector.register(proc.stdout, selectors.EVENT_READ, rank)
            while len(replies) < len(self._procs):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return replies, sorted(set(buffers) - set(replies))
                for key, _ in selector.select(left):
                    rank = key.data
                    chunk = os.read(key.fd, 1 << 20)
                    if not chunk:
                        self._rank_died(rank)
                    buffers[rank] += chunk
                    data = buffers[rank]
                    if len(data) >= HEADER.size:
                        (size,) = HEADER.unpack(data[: HEADER.size])
                        if len(data) >= HEADER.size + size:
                            replies[rank] = loads(data[HEADER.size : HEADER.size + size])
                            selector.unregister(key.fileobj)
        return dict(sorted(replies.items())), []

    def stop_ranks(self, polite: bool = True) -> None:
        """Ask every rank to stop (an empty frame), then kill what is still running."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        for proc in self._procs:
            try:
                assert proc.stdin is not None
                write_frame(proc.stdin, b"")
                proc.stdin.close()
            except (BrokenPipeError, OSError, ValueError):
                pass
        deadline = time.monotonic() + STOP_WAIT
        for proc in self._procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
