"""acme-sub: an executor of the Acme plugin that starts each rank with its own command.

Acme's fictional cluster tools want every rank started through a wrapper (think ``numactl`` or
a vendor's device-binding launcher), which hwlaunch's mp executor knows nothing about. So the
plugin brings its own executor: each rank is ``$ACME_LAUNCHER python -m hwlaunch_acme.rank``,
started with ``subprocess`` and driven over its stdin and stdout (hwlaunch_acme.channel).

It uses only hwlaunch's public API: the Executor base class, and the worker-side functions in
``hwlaunch.executor`` that the built-in executors use too, so its workers behave the same.
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
from collections.abc import Callable
from typing import Any

from hwlaunch import Plan, RpcTimeoutError, WorkerDiedError, WorkerStartupError
from hwlaunch.executor import (
    Executor,
    StatusCallback,
    dumps,
    encode_extension,
    encode_method,
    free_port,
    loads,
    method_label,
    raise_first_failure,
    worker_environment,
)
from hwlaunch_acme.channel import HEADER, write_frame

LAUNCHER_VAR = "ACME_LAUNCHER"  # e.g. "numactl --localalloc": put before each rank's command
STOP_WAIT = 5.0  # seconds a rank gets to leave its process group before it is killed


class AcmeSubprocessExecutor(Executor):
    def __init__(
        self,
        plan: Plan,
        worker_extension: type | str | None = None,
        *,
        init_distributed: bool = True,
        startup_timeout: float | None = None,
        on_status: StatusCallback | None = None,
    ) -> None:
        self.plan = plan
        self.warnings: list[str] = []
        self._lock = threading.Lock()
        self._closed_because: str | None = None
        port = free_port()
        extension = encode_extension(worker_extension)
        prefix = shlex.split(os.environ.get(LAUNCHER_VAR, ""))
        self._procs: list[subprocess.Popen[bytes]] = []
        try:
            for rank in range(plan.world_size):
                env = {**os.environ, **worker_environment(plan, rank, rank, "127.0.0.1", port)}
                proc = subprocess.Popen(
                    [*prefix, sys.executable, "-m", "hwlaunch_acme.rank"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=env,
                )
                self._procs.append(proc)
                start = (plan, extension, rank, "127.0.0.1", port, init_distributed)
                self._send(rank, dumps(start))
                if on_status:
                    on_status(rank, "started")
            for rank, (ok, value) in self._gather("start-up", startup_timeout).items():
                if not ok:
                    raise WorkerStartupError(
                        rank, f"{value.exc_type}: {value.message}", value.traceback
                    )
                if on_status:
                    on_status(rank, "ready")
        except RpcTimeoutError as exc:
            self._stop("start-up timed out")
            raise WorkerStartupError(exc.ranks[0], f"not ready within {exc.timeout:g}s") from None
        except BaseException:
            self._stop("start-up failed")
            raise

    # -- the channel -----------------------------------------------------------------------
    def _send(self, rank: int, payload: bytes) -> None:
        stdin = self._procs[rank].stdin
        assert stdin is not None
        try:
            write_frame(stdin, payload)
        except (BrokenPipeError, OSError):
            self._died(rank)

    def _died(self, rank: int) -> None:
        proc = self._procs[rank]
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_WAIT)
        self._stop(f"rank {rank} died")
        raise WorkerDiedError(rank, proc.pid, proc.returncode, "acme-sub")

    def _gather(self, label: str, timeout: float | None) -> dict[int, tuple[bool, Any]]:
        """One reply from every rank, in rank order; RpcTimeoutError naming the silent ranks."""
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
                    raise RpcTimeoutError(label, sorted(set(buffers) - set(replies)), timeout or 0)
                for key, _ in selector.select(left):
                    rank = key.data
                    chunk = os.read(key.fd, 1 << 20)
                    if not chunk:
                        self._died(rank)
                    buffers[rank] += chunk
                    data = buffers[rank]
                    if len(data) >= HEADER.size:
                        (size,) = HEADER.unpack(data[: HEADER.size])
                        if len(data) >= HEADER.size + size:
                            replies[rank] = loads(data[HEADER.size : HEADER.size + size])
                            selector.unregister(key.fileobj)
        return dict(sorted(replies.items()))

    # -- the Executor interface -------------------------------------------------------------
    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        payload = dumps((encode_method(method), tuple(args), dict(kwargs or {})))
        with self._lock:
            if self._closed_because is not None:
                raise RuntimeError(
                    f"this executor was shut down ({self._closed_because}); launch a new one"
                )
            for rank in range(len(self._procs)):
                self._send(rank, payload)
            try:
                replies = self._gather(method_label(method), timeout)
            except RpcTimeoutError:
                self._stop(f"collective_rpc {method_label(method)!r} timed out")
                raise
        raise_first_failure({rank: value for rank, (ok, value) in replies.items() if not ok})
        return [value for _, value in replies.values()]

    def check_health(self) -> None:
        self.collective_rpc("ping", timeout=30.0)

    def shutdown(self) -> None:
        self._stop("shutdown() was called")

    def _stop(self, reason: str) -> None:
        """Ask every rank to stop (an empty frame), then kill what is still running."""
        if self._closed_because is not None:
            return
        self._closed_because = reason
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
