"""The workers' stdout and stderr, in the driver: whole lines, each after its rank's prefix.

Why lines are assembled here, in one place per group: a worker's bytes arrive in chunks that
end anywhere, and eight workers writing straight to one terminal interleave mid-line. Each
rank's streams are read separately (a pipe each under mp, the actor's buffer under Ray), cut at
the last newline, and written to this process's own ``sys.stdout`` / ``sys.stderr`` as one
write per chunk of whole lines, under one lock: no line of one rank is ever split by another's.
A partial last line waits for its newline, and is written (with a newline) when the stream ends:
at exit, also after a crash. The log files get every byte as the worker wrote it.

Writing through ``sys.stdout`` as it is at that moment (not file descriptor 1) puts the workers'
lines where this program's own prints go: a redirect, pytest's capture, a notebook's cell.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from pathlib import Path
from typing import BinaryIO

from hwlaunch.console import format_prefix
from hwlaunch.errors import ConfigError
from hwlaunch.plan import Plan

__all__ = ["STREAMS", "RankStream", "WorkerOutput", "attempt_of", "open_run_dir"]

STREAMS = ("stdout", "stderr")
# ANSI foreground colours, one per rank in turn: cyan, yellow, magenta, green, blue, red.
COLOURS = (36, 33, 35, 32, 34, 31)
MAX_PARTIAL = 64 * 1024  # a "line" longer than this without a newline is written in parts
_console_lock = threading.Lock()  # every group's writes to this process's streams


def colour_wanted(stream: object) -> bool:
    """Colour on a terminal, unless NO_COLOR is set (no-color.org); FORCE_COLOR forces it."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return is_terminal(stream)


def is_terminal(stream: object) -> bool:
    """``stream`` is a terminal; a stream without ``isatty``, or closed, is not."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(callable(isatty) and isatty())
    except (OSError, ValueError):
        return False


def write_console(name: str, data: bytes) -> None:
    """``data`` (whole lines) to ``sys.<name>`` as it is now, bytes through its buffer when it
    has one. A closed or broken stream drops the lines: the worker must not fail for it."""
    stream = getattr(sys, name, None)
    if stream is None:
        return
    with _console_lock:
        try:
            buffer = getattr(stream, "buffer", None)
            stream.flush()  # this program's own pending text first, in order
            if buffer is not None:
                buffer.write(data)
                buffer.flush()
            else:
                stream.write(data.decode(errors="replace"))
                stream.flush()
        except (OSError, ValueError):
            pass


class RankStream:
    """One rank's stdout or stderr: lines to the console (when shown) and bytes to its file."""

    def __init__(self, name: str, prefix: bytes | None, log: BinaryIO | None) -> None:
        self.name = name
        self.prefix = prefix  # None: this rank is not shown on the console
        self.log = log
        self.partial = b""
        self.ended = False

    def feed(self, data: bytes) -> None:
        if self.log is not None:
            self._log(data)
        if self.prefix is None:
            return
        data = self.partial + data
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) < MAX_PARTIAL:
            self.partial = data
            return
        if cut == 0:
            data, cut = data + b"\n", len(data) + 1
        self.partial = data[cut:]
        prefix = self.prefix
        write_console(self.name, prefix + data[: cut - 1].replace(b"\n", b"\n" + prefix) + b"\n")

    def _log(self, data: bytes) -> None:
        """To the log file; one that fails (a full disk) is closed with a note on the console,
        and the console goes on."""
        assert self.log is not None
        try:
            self.log.write(data)
        except OSError as exc:
            name = getattr(self.log, "name", "a log file")
            self.log.close()
            self.log = None
            write_console("stderr", f"hwlaunch: {name} is closed: {exc}\n".encode())

    def end(self) -> None:
        """The stream has ended (the worker exited or was stopped): its last partial line."""
        if self.ended:
            return
        self.ended = True
        if self.partial and self.prefix is not None:
            write_console(self.name, self.prefix + self.partial + b"\n")
        self.partial = b""
        if self.log is not None:
            self.log.close()


def attempt_of(plan: Plan) -> int:
    """Which start of the group this is: 0, then 1 after the first restart (RESTART_COUNT)."""
    return int(plan.env.get("RESTART_COUNT", "0"))


class WorkerOutput:
    """The streams of one worker group: a prefix per rank, colours, the attempt's log files."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.attempt = attempt_of(plan)
        self.colour = {name: colour_wanted(getattr(sys, name, None)) for name in STREAMS}
        self.streams: dict[int, tuple[RankStream, RankStream]] = {}

    def add_rank(
        self, rank: int, local_rank: int, pid: int | None, node: str
    ) -> tuple[RankStream, RankStream]:
        """The rank's (stdout, stderr), once its pid is known; log files opened here."""
        plan = self.plan
        shown = plan.console_ranks is None or rank in plan.console_ranks
        text = format_prefix(
            plan.console_prefix,
            rank=rank,
            local_rank=local_rank,
            pid=pid,
            backend=plan.backend,
            node=node,
        ).encode()
        streams = []
        for name in STREAMS:
            prefix = None
            if shown:
                colour = COLOURS[rank % len(COLOURS)]
                prefix = b"\x1b[%dm%s\x1b[0m" % (colour, text) if self.colour[name] else text
            log = None
            if plan.log_run_dir is not None:
                path = Path(plan.log_run_dir) / f"rank{rank}.attempt{self.attempt}.{name}"
                log = open(path, "wb", buffering=0)  # noqa: SIM115 - closed by RankStream.end
            streams.append(RankStream(name, prefix, log))
        pair = (streams[0], streams[1])
        self.streams[rank] = pair
        return pair

    def end(self) -> None:
        """Every stream's last partial line, and the files closed."""
        for pair in self.streams.values():
            for stream in pair:
                stream.end()


def open_run_dir(plan: Plan) -> Plan:
    """The plan with this run's log directory, ``<log_dir>/<run id>``, created now.

    The run id is the start time and this process's pid, so runs never share files; each
    restart attempt then has files of its own in it. A directory that cannot be made is a
    ConfigError naming the setting's source, raised before any worker starts.
    """
    assert plan.log_dir is not None
    base = Path(plan.log_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(100):
        path = base / (f"{stamp}-{os.getpid()}" + (f"-{n}" if n else ""))
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            continue
        except OSError as exc:
            source = next((d.source for d in plan.decisions if d.setting == "log_dir"), "the plan")
            raise ConfigError(
                f"log_dir {plan.log_dir} (from {source}) cannot hold log files: could not "
                f"create {path}: {exc.strerror or exc}. Fix: set log_dir to a directory this "
                f"user can write"
            ) from None
        return dataclasses.replace(plan, log_run_dir=str(path))
    raise ConfigError(f"log_dir {plan.log_dir}: no free run directory name for {stamp}")
