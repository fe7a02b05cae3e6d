"""Workers' stacks read from outside their processes, with py-spy: what needs nothing of them.

A rank that holds the GIL in a C call, or that is stopped (SIGSTOP, a debugger), cannot answer
a request for its stack: its stack thread never runs. py-spy reads a Python process's memory
from another process (``py-spy dump --nonblocking``: it never pauses the process, and so also
reads one that is stopped), which is how SGLang and Ray read hung ranks too. It comes with the
``hwlaunch`` distribution (a dependency); where it is absent, or may not read the process (no
ptrace permission), the worker's own answer is the fallback (``hwlaunch.executor._stacks``).

Each read is a process of its own, all started at once and all bounded by one deadline: a read
that has not finished by then is killed, and its rank says why it has no stack from here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Mapping
from functools import lru_cache
from multiprocessing import connection
from typing import IO, Any

import psutil

from hwlaunch.executor._stacks import STACKS_THREAD, Frame, Thread, render_stacks

__all__ = ["OutsideReads", "pyspy_command"]

_PYSPY = "py-spy"


@lru_cache(maxsize=1)
def pyspy_command() -> str | None:
    """py-spy's executable: beside this interpreter's scripts (a venv that was not activated),
    else on PATH; None where it is not installed."""
    folders = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable)]
    for folder in folders:
        found = shutil.which(_PYSPY, path=folder)
        if found:
            return found
    return shutil.which(_PYSPY)


class OutsideReads:
    """One py-spy read per rank, started at once; the driver waits on their pipes with its
    other waits (``waitables``), and takes each result as it comes (``take``).

    ``found``: the stacks of each rank read so far; ``failed``: why a read gave none.
    """

    def __init__(self, pids: Mapping[int, int | None]) -> None:
        self.found: dict[int, str] = {}
        self.failed: dict[int, str] = {}
        self._reads: dict[int, tuple[subprocess.Popen[bytes], int]] = {}
        self._output: dict[int, bytearray] = {}
        self._pids = dict(pids)
        command = pyspy_command()
        for rank, pid in pids.items():
            if pid is None:
                self.failed[rank] = "the worker has no process"
            elif command is None:
                self.failed[rank] = "py-spy is not installed"
            else:
                self._start(rank, pid, command)

    def _start(self, rank: int, pid: int, command: str) -> None:
        try:
            process = subprocess.Popen(
                [command, "dump", "--pid", str(pid), "--nonblocking", "--json", "--full-filenames"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        except OSError as exc:
            self.failed[rank] = f"py-spy did not start: {exc}"
            return
        stdout: IO[bytes] = process.stdout  # type: ignore[assignment]
        self._reads[rank] = (process, stdout.fileno())
        self._output[rank] = bytearray()

    def waitables(self) -> list[int]:
        """The pipes of the reads still running, for ``multiprocessing.connection.wait``."""
        return [fd for _, fd in self._reads.values()]

    def take(self, ready: object) -> bool:
        """Read from ``ready`` if it is one of these pipes (True), else False."""
        for rank, (process, fd) in list(self._reads.items()):
            if fd == ready:
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    self._output[rank] += chunk
                else:
                    self._finish(rank, process)
                return True
        return False

    def wait(self, deadline: float) -> None:
        """Take every read that ends before ``deadline`` (and what is ready at it)."""
        while self._reads:
            remaining = max(0.0, deadline - time.monotonic())
            ready = connection.wait(self.waitables(), remaining)
            for pipe in ready:
                self.take(pipe)
            if not ready and remaining == 0.0:
                return

    def close(self, waited: float) -> None:
        """Kill the reads still running (their ranks: not read within ``waited`` seconds)."""
        for rank, (process, _) in list(self._reads.items()):
            with contextlib.suppress(OSError):
                process.kill()
            self.failed[rank] = f"py-spy did not read it within {waited:g}s"
            self._finish(rank, process, killed=True)

    def _finish(self, rank: int, process: subprocess.Popen[bytes], killed: bool = False) -> None:
        del self._reads[rank]
        process.wait()
        assert process.stdout is not None
        process.stdout.close()
        output = bytes(self._output.pop(rank))
        if killed:
            return
        text = _rendered(self._pids[rank], output)
        if text is None:
            self.failed[rank] = f"py-spy could not read it: {_first_line(output)}"
        else:
            self.found[rank] = text


def _rendered(pid: int | None, output: bytes) -> str | None:
    """py-spy's JSON as the stacks' text, or None when it holds no thread."""
    try:
        threads: list[dict[str, Any]] = json.loads(output)
    except ValueError:
        return None
    if pid is None or not isinstance(threads, list) or not threads:
        return None
    shown = [t for t in threads if t.get("thread_name") != STACKS_THREAD]
    shown.sort(key=lambda t: (t.get("os_thread_id") != pid, t.get("os_thread_id") or 0))
    rendered: list[Thread] = []
    for thread in shown:
        frames: list[Frame] = [
            (str(f.get("filename")), int(f.get("line") or 0), str(f.get("name")))
            for f in reversed(thread.get("frames") or [])
        ]
        name = thread.get("thread_name") or f"thread {thread.get('os_thread_id')}"
        rendered.append((str(name), _state(thread), frames))
    return render_stacks(pid, rendered, f", read by py-spy{_process_state(pid)}")


def _state(thread: Mapping[str, Any]) -> str:
    if thread.get("owns_gil"):
        return "holds the GIL"
    return "running" if thread.get("active") else "idle"


def _process_state(pid: int) -> str:
    """What the process is doing, where that tells why it does not answer on its own."""
    try:
        status = psutil.Process(pid).status()
    except psutil.Error:
        return ""
    if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
        return " (the process is stopped: SIGSTOP, or a debugger holds it)"
    if status == psutil.STATUS_DISK_SLEEP:
        return " (the process waits in the kernel, uninterruptibly)"
    return ""


def _first_line(output: bytes) -> str:
    """py-spy's error, and its first cause (``Error: ...``, ``Caused by: 0: ...``)."""
    lines = [line.strip() for line in output.decode("utf-8", "replace").splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return "no output"
    causes = lines.index("Caused by:") + 1 if "Caused by:" in lines else 0
    cause = lines[causes] if 0 < causes < len(lines) else ""
    return f"{lines[0]} ({cause})" if cause else lines[0]
