"""Plan: the resolver's decision, with a source and a reason for every setting.

This module is the data a resolution produces and a worker receives: plain frozen dataclasses
(the plan, its decisions, and the runtime facts it was made from) that import nothing of the
planning layer, so a worker that unpickles a Plan loads only this module.
"""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from hwlaunch.spec import StartMethod

# An executor is named by its registered ExecutorSpec (built-in or a plugin's): any string the
# registry knows, checked when a plan is resolved.
ExecutorName = str
RPC_CHANNELS = ("shm", "pipe")
DEFAULT_RPC_CHANNEL = "shm"  # measured faster than pipes (docs/performance.md, "RPC channel")
# Seconds a waiting side of the shm channel polls before it blocks, where every worker has a CPU
# of its own; where they do not, polling workers would take CPU from working ones.
SPIN_WITH_FREE_CPUS = 0.05
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
    (``file:line``). ``no-main-file``: the child re-runs nothing. ``not-reimportable``: the
    child would try to re-run a main it cannot read (code from stdin). ``reimporting``: this
    process *is* such a child, re-running ``__main__``. ``unknown``: the re-run cannot be
    analysed (a ``.pyc`` without source, a loader without source).
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
        out: dict[str, Any] = {
            "launcher": self.launcher,
            "evidence": self.evidence,
            "missing": list(self.missing),
        }
        for key in (
            "rank",
            "local_rank",
            "world_size",
            "local_world_size",
            "nnodes",
            "master_addr",
            "master_port",
        ):
            found: Found | None = getattr(self, key)
            out[key] = None if found is None else {"value": found.value, "source": found.source}
        return out


NO_LAUNCHER = LauncherInfo()


@dataclass(frozen=True)
class DeviceFacts:
    """What one backend's probes said: present, how many devices, runtime initialized here."""

    available: bool
    device_count: int
    initialized: bool
    probe_error: str | None = None


ThreadKind = Literal["python", "openmp", "native"]


@dataclass(frozen=True)
class ThreadInfo:
    """One thread of this process besides the calling one and hwlaunch's own.

    ``kind``: ``python`` (a ``threading`` thread), ``openmp`` (a worker of an OpenMP pool:
    GNU libgomp, whose pool a forked child believes it still has), ``native`` (any other thread
    a library started). ``library``: the shared library a native thread runs in, where it could
    be told (``libgomp.so.1``, ``libscipy_openblas64_.so``); ``owner``: whose pool it is, where
    known (``torch``).
    """

    name: str
    kind: ThreadKind
    library: str | None = None
    owner: str | None = None

    def label(self, n: int = 1) -> str:
        """``'my-poller'``, ``2 of torch's OpenMP pool (libgomp.so.1)``, ``a native thread of
        numpy (libopenblas.so)``: this thread, or ``n`` threads like it."""
        if self.kind == "python":
            return f"{n} of {self.name!r}" if n > 1 else repr(self.name)
        whose = f" of {self.owner}" if self.owner else ""
        where = f" ({self.library})" if self.library else ""
        if self.kind == "openmp":
            pool = f"{self.owner}'s OpenMP pool" if self.owner else "an OpenMP pool"
            return f"{n} of {pool}{where}"
        return f"{n} native threads{whose}{where}" if n > 1 else f"a native thread{whose}{where}"


@dataclass(frozen=True)
class ThreadFacts:
    """The threads a forked child would not have: every thread of this process but the calling
    one and hwlaunch's own (named ``hwlaunch-*``, which only wait in poll or recv and hold no
    lock a child needs). ``free_threaded``: the interpreter runs without a GIL
    (``sys._is_gil_enabled()`` is False), so Python threads run truly at once. ``source``:
    where the threads were read (``/proc/self/task``, or ``threading`` where /proc is absent,
    which sees Python threads only)."""

    others: tuple[ThreadInfo, ...] = ()
    own: int = 0
    free_threaded: bool = False
    source: str = "/proc/self/task"

    @property
    def openmp(self) -> tuple[ThreadInfo, ...]:
        """The threads of a started OpenMP pool: a forked child deadlocks in its first
        parallel region, waiting for them."""
        return tuple(t for t in self.others if t.kind == "openmp")

    def summary(self) -> str:
        """``3 threads: 2 of torch's OpenMP pool (libgomp.so.1), 'my-poller'``."""
        alike: dict[ThreadInfo, int] = {}
        for thread in self.others:
            alike[thread] = alike.get(thread, 0) + 1
        n = len(self.others)
        parts = ", ".join(thread.label(count) for thread, count in alike.items())
        text = f"{n} thread{'s' if n != 1 else ''}: {parts}" if n else "no other threads"
        return text + (" (free-threaded interpreter)" if self.free_threaded else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": len(self.others),
            "threads": [dataclasses.asdict(t) for t in self.others],
            "openmp_pool": len(self.openmp),
            "hwlaunch_own": self.own,
            "free_threaded": self.free_threaded,
            "source": self.source,
            "summary": self.summary(),
        }


NO_THREADS = ThreadFacts()


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
    assumed: frozenset[str] = field(default_factory=frozenset)

    def mark(self, key: str) -> str:
        """`` (assumed)`` after a fact that was assumed, for reasons and tables."""
        return " (assumed)" if key in self.assumed else ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "os_start_methods": list(self.os_start_methods),
            "devices": {
                name: {
                    "available": d.available,
                    "device_count": d.device_count,
                    "initialized": d.initialized,
                    "probe_error": d.probe_error,
                }
                for name, d in self.devices.items()
            },
            "main_guard": {
                "status": self.main_guard.status,
                "file": self.main_guard.file,
                "line": self.main_guard.line,
            },
            "daemonic": self.daemonic,
            "in_ray_actor": self.in_ray_actor,
            "launcher": self.launcher.to_dict(),
            "threads": self.threads.to_dict(),
            "assumed": sorted(self.assumed),
        }


@dataclass(frozen=True)
class Decision:
    """One setting of a plan: its value, where the value came from, and why.

    ``source`` names the winning layer (``--start-method``, ``env HWLAUNCH_START_METHOD``,
    ``hwlaunch.toml:3``, ``rule of backend cuda``, ``fact: cuda.initialized``); ``reason`` says
    why the rules kept or changed it. ``explain()`` and ``--json`` show one row per Decision.
    """

    setting: str
    value: Any
    source: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "setting": self.setting,
            "value": self.value,
            "source": self.source,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Plan:
    """How to start the workers. Pure data: it can be pickled, printed and compared."""

    backend: str
    world_size: int
    nnodes: int
    executor: ExecutorName
    start_method: StartMethod | None
    dist_backend: str
    worker: str
    device_control_env_var: str | None
    ray_resource: str
    env: dict[str, str] = field(default_factory=dict)
    preload: tuple[str, ...] = ()
    ray_address: str | None = None
    ray_pg_timeout: float = 60.0
    startup_timeout: float = 600.0
    rpc_channel: str = DEFAULT_RPC_CHANNEL
    rpc_spin: float | None = None  # None: SPIN_WITH_FREE_CPUS if each worker has a CPU, else 0
    max_restarts: int = 0
    decisions: tuple[Decision, ...] = ()
    warnings: tuple[str, ...] = ()
    facts: RuntimeFacts | None = None
    device_binding: str = "none"
    propagate_env: tuple[str, ...] = ()  # names and prefixes ("HABANA_*"), never values
    ray_noset_visibility_var: str | None = None
    worker_setup: tuple[str, ...] = ()  # plugins whose hwlaunch_worker_setup runs, in order
    # A launcher started the ranks (the executor declares needs_launcher): each worker takes its
    # rank, rendezvous and device from the launcher's variables.
    ranks_from_launcher: bool = False

    def decision(self, setting: str) -> Decision:
        for decision in self.decisions:
            if decision.setting == setting:
                return decision
        raise KeyError(
            f"no decision for {setting!r}; decided: {[d.setting for d in self.decisions]}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "world_size": self.world_size,
            "nnodes": self.nnodes,
            "executor": self.executor,
            "start_method": self.start_method,
            "dist_backend": self.dist_backend,
            "worker": self.worker,
            "device_control_env_var": self.device_control_env_var,
            "ray_resource": self.ray_resource,
            "env": dict(self.env),
            "preload": list(self.preload),
            "ray_address": self.ray_address,
            "ray_pg_timeout": self.ray_pg_timeout,
            "startup_timeout": self.startup_timeout,
            "rpc_channel": self.rpc_channel,
            "rpc_spin": self.rpc_spin,
            "max_restarts": self.max_restarts,
            "decisions": [d.to_dict() for d in self.decisions],
            "warnings": list(self.warnings),
            "facts": self.facts.to_dict() if self.facts is not None else None,
            "device_binding": self.device_binding,
            "propagate_env": list(self.propagate_env),
            "ray_noset_visibility_var": self.ray_noset_visibility_var,
            "worker_setup": list(self.worker_setup),
            "ranks_from_launcher": self.ranks_from_launcher,
        }

    def explain(self, width: int = 110) -> str:
        """A table of settings, values, sources and reasons, then the warnings."""
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        table = Table(
            title=Text(f"hwlaunch plan: {self.backend} x{self.world_size}"),
            title_justify="left",
            expand=True,
        )
        table.add_column("setting", no_wrap=True)
        table.add_column("value", overflow="fold", ratio=3)
        table.add_column("source", overflow="fold", ratio=3)
        table.add_column("reason", overflow="fold", ratio=5)
        for d in self.decisions:
            value = d.value if not isinstance(d.value, dict) else _env_text(d.value)
            cells = (d.setting, "-" if value is None else str(value), d.source, d.reason)
            # Text, not str: a source such as "hwlaunch.toml:3 [backends.cuda]" is not markup.
            table.add_row(*(Text(cell) for cell in cells))
        buffer = io.StringIO()
        console = Console(file=buffer, width=width, no_color=True, highlight=False)
        console.print(table)
        for warning in self.warnings:
            console.print(f"warning: {warning}", soft_wrap=True, markup=False)
        if self.facts is not None and self.facts.assumed:
            console.print(f"assumed facts: {', '.join(sorted(self.facts.assumed))}", markup=False)
        return buffer.getvalue()


def _env_text(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "{}"
