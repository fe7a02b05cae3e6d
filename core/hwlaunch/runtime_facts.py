"""The runtime facts: what is true in this process when it resolves, as plain frozen data.

The rules read these besides the specs and the settings; a Plan carries them (``plan.facts``)
and ``hwlaunch_adjust_plan`` sees them (``draft.facts``). They are probed by
``hwlaunch.planning.facts``, or assumed (what-if), and then named in ``assumed``. Data only:
this module imports nothing of the planning layer, so a worker that unpickles a Plan loads it
without the resolver.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from hwlaunch._data import fields_of

MainGuardStatus = Literal[
    "guarded", "unguarded", "no-main-file", "not-reimportable", "reimporting", "unknown"
]
# What spawn/forkserver must not be used with: the child would launch again, could not start
# at all, or nobody can tell.
REIMPORT_UNSAFE: tuple[MainGuardStatus, ...] = ("unguarded", "not-reimportable", "unknown")


@dataclass(frozen=True)
class MainGuard:
    """What a spawned child does with ``__main__``, and where this process is in it.

    ``guarded``: the child re-runs the main module, and the running line (and every earlier
    launch of this process) is inside a main guard. ``unguarded``: the re-run reaches a launch
    (``file:line``). ``no-main-file``: the child re-runs nothing (also code read from stdin,
    which hwlaunch's workers do not re-run). ``not-reimportable``: the child would try to
    re-run a main it cannot read (a ``__file__`` that does not exist). ``reimporting``: this
    process *is* such a child, re-running ``__main__``. ``unknown``: the re-run cannot be
    analysed (a loader without source). A ``.pyc`` without its source is read from its
    bytecode.
    """

    status: MainGuardStatus
    file: str | None = None
    line: int | None = None
    detail: str | None = None

    def describe(self) -> str:
        """One line for people, e.g. ``unguarded (train.py:12)``."""
        reason = ": ".join(part for part in (self.where(short=True), self.detail) if part)
        return f"{self.status} ({reason})" if reason else self.status

    def where(self, *, short: bool = False) -> str | None:
        if not (self.file and self.line):
            return None
        return f"{os.path.basename(self.file) if short else self.file}:{self.line}"

    def problem(self) -> str:
        """Why spawn/forkserver cannot be used with this main, for error messages."""
        where = self.where() or self.file or "the main script"
        if self.status == "unguarded":
            why = f" ({self.detail})" if self.detail and self.detail != "assumed" else ""
            return (
                f"{where} starts workers at module level, outside an "
                f'`if __name__ == "__main__":` block{why}, so each spawned worker would re-run '
                "it and launch again"
            )
        if self.status == "not-reimportable":
            return (
                f"each spawned worker would have to re-run __main__, which it cannot read "
                f"({self.detail or where})"
            )
        if self.status == "reimporting":
            return (
                f"this process is a spawned child re-importing the program's __main__, and the "
                f"re-import reached a launch at {where}"
            )
        return (
            "each spawned worker would re-run __main__, and hwlaunch cannot read what that "
            f"re-run does ({self.detail or where})"
        )


# Who started this process as one rank of a job ("none": nobody, hwlaunch starts the ranks).
LauncherName = Literal["torchrun", "slurm", "mpi", "none"]
LAUNCHERS: tuple[LauncherName, ...] = ("torchrun", "slurm", "mpi", "none")


@dataclass(frozen=True)
class Found:
    """A value the launcher gave (or hwlaunch derived from what it gave), and from where."""

    value: Any
    source: str


@dataclass(frozen=True)
class LauncherInfo:
    """What a launcher says about this rank. ``launcher == "none"`` leaves the rest None.

    A value is None when the launcher did not say (an assumed launcher without its variables,
    an MPI job with no ``MASTER_PORT``); ``missing`` then says what to set.
    """

    launcher: LauncherName = "none"
    rank: Found | None = None
    local_rank: Found | None = None
    world_size: Found | None = None
    local_world_size: Found | None = None
    nnodes: Found | None = None
    master_addr: Found | None = None
    master_port: Found | None = None
    missing: tuple[str, ...] = ()
    evidence: str = ""

    @property
    def detected(self) -> bool:
        return self.launcher != "none"

    def to_dict(self) -> dict[str, Any]:
        return fields_of(self)


NO_LAUNCHER = LauncherInfo()


@dataclass(frozen=True)
class DeviceFacts:
    """What one backend's probes said: present, how many devices, runtime initialized here."""

    available: bool
    device_count: int
    initialized: bool
    probe_error: str | None = None


ThreadKind = Literal["python", "native"]


@dataclass(frozen=True)
class ThreadInfo:
    """One thread of this process besides the calling one and hwlaunch's own.

    ``kind``: ``python`` (a ``threading`` thread) or ``native`` (one a library started).
    ``library``: the shared library file a native thread runs in, where it could be told
    (``libgomp.so.1``, ``libscipy_openblas64_-32a4b2a6.so``); ``owner``: the package that ships
    that file (``torch``); ``known_library``: the library hwlaunch recognises in that file
    (``OpenBLAS``, ``GNU OpenMP pool``, ``Intel OpenMP pool``, ``gRPC``), whose behaviour at fork the
    rules know. ``running``: the kernel showed the thread on a CPU (or waiting for one) each
    time it was looked at, so where it runs could not be read.
    """

    name: str
    kind: ThreadKind
    library: str | None = None
    owner: str | None = None
    known_library: str | None = None
    running: bool = False

    def label(self, n: int = 1) -> str:
        """``'my-poller'``, ``2 of torch's GNU OpenMP pool (libgomp.so.1)``, ``a native
        thread of ray (_raylet.so)``: this thread, or ``n`` threads like it."""
        if self.kind == "python":
            return f"{n} of {self.name!r}" if n > 1 else repr(self.name)
        count = f"{n}" if n > 1 else "a thread"
        where = f" ({self.library})" if self.library else " (running)" if self.running else ""
        if self.known_library:
            whose = f"{self.owner}'s " if self.owner else ""
            return f"{count} of {whose}{self.known_library}{where}"
        whose = f" of {self.owner}" if self.owner else ""
        return f"{n} native threads{whose}{where}" if n > 1 else f"a native thread{whose}{where}"


def labels(threads: tuple[ThreadInfo, ...]) -> str:
    """``2 of torch's GNU OpenMP pool (libgomp.so.1), 'my-poller'``: alike threads counted once."""
    alike: dict[ThreadInfo, int] = {}  # by what the label shows: a native thread's own name
    for thread in threads:  # (``gcs_client_io_s``) is not part of it
        key = thread if thread.kind == "python" else replace(thread, name="")
        alike[key] = alike.get(key, 0) + 1
    return ", ".join(thread.label(count) for thread, count in alike.items())


@dataclass(frozen=True)
class ThreadFacts:
    """The threads a forked child would not have: every thread of this process but the calling
    one and hwlaunch's own (``planning.threads.OWN_THREADS``: monitors and call threads that
    only wait in poll or recv and hold no lock a child needs; ``own`` counts them). Which of the
    others a fork can stand is the rules' call (``planning.fork_safety``), from the library each
    one runs in. ``free_threaded``: the interpreter runs without a GIL
    (``sys._is_gil_enabled()`` is False), so Python threads run truly at once. ``source``:
    where the threads were read (``/proc/self/task``, or ``threading`` where /proc is absent,
    which sees Python threads only)."""

    others: tuple[ThreadInfo, ...] = ()
    own: int = 0
    free_threaded: bool = False
    source: str = "/proc/self/task"

    def summary(self, threads: tuple[ThreadInfo, ...] | None = None) -> str:
        """``3 threads: 2 of torch's GNU OpenMP pool (libgomp.so.1), 'my-poller'``: the other
        threads, or the given ones among them."""
        shown = self.others if threads is None else threads
        n = len(shown)
        text = f"{n} thread{'s' if n != 1 else ''}: {labels(shown)}" if n else "no other threads"
        free = self.free_threaded and threads is None
        return text + (" (free-threaded interpreter)" if free else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": len(self.others),
            "threads": [fields_of(t) for t in self.others],
            "hwlaunch_own": self.own,
            "free_threaded": self.free_threaded,
            "source": self.source,
            "summary": self.summary(),
        }


NO_THREADS = ThreadFacts()


@dataclass(frozen=True)
class Limit:
    """How much more of something this process may take now (``free``: tasks, descriptors or
    bytes; below 0 where it is over already), and the limit that says so, by name."""

    free: int
    name: str


@dataclass(frozen=True)
class Room:
    """What this machine has room for now, each the tightest limit that applies (None: no
    limit was found): tasks (processes and threads), this process's file descriptors, memory
    in bytes. Read by the rule that refuses a world size beyond them (``planning.room``)."""

    tasks: Limit | None = None
    fds: Limit | None = None
    memory: Limit | None = None


NO_LIMITS = Room()


@dataclass(frozen=True)
class RuntimeFacts:
    """What is true in this process when it resolves: the inputs the rules read besides specs
    and settings. ``assumed`` names the facts that were assumed (what-if) rather than probed."""

    os_start_methods: tuple[str, ...]
    devices: Mapping[str, DeviceFacts]
    main_guard: MainGuard
    daemonic: bool
    in_ray_actor: bool
    launcher: LauncherInfo = NO_LAUNCHER
    threads: ThreadFacts = NO_THREADS
    # The CPUs this process may run on (its affinity), and OMP_NUM_THREADS / MKL_NUM_THREADS as
    # the driver's environment sets them: the inputs of the CPU thread budget.
    usable_cpus: int = 1
    thread_env: Mapping[str, str] = field(default_factory=dict)
    room: Room = NO_LIMITS
    assumed: frozenset[str] = field(default_factory=frozenset)

    def mark(self, key: str) -> str:
        """`` (assumed)`` after a fact that was assumed, for reasons and tables."""
        return " (assumed)" if key in self.assumed else ""

    def to_dict(self) -> dict[str, Any]:
        return fields_of(self)
