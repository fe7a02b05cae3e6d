"""The ``launcher`` fact: did torchrun, SLURM's srun or mpirun start this process as one rank?

On clusters something else often starts one process per rank already. Each launcher says so in
the environment it gives its ranks, with its own variable names; this module reads them into
one record, with the variable each value came from, so a plan can show
``env: WORLD_SIZE (torchrun)`` and an error can name the variable to fix.

Detection order, first match wins:

1. ``torchrun`` (torchelastic): ``TORCHELASTIC_RUN_ID`` with ``RANK``, ``WORLD_SIZE`` and
   ``LOCAL_RANK``. Its agent hosts the rendezvous store at ``MASTER_ADDR:MASTER_PORT``.
2. ``mpi`` (Open MPI's mpirun): ``OMPI_COMM_WORLD_RANK`` / ``_SIZE`` / ``_LOCAL_RANK``.
3. ``slurm`` (srun): ``SLURM_PROCID``, ``SLURM_LOCALID`` and ``SLURM_STEP_NUM_TASKS``. The last is
   set by srun for the tasks of a job step and not in the batch script's own shell, which also
   has ``SLURM_PROCID=0`` but is not one rank of many.
4. ``mpi`` (MPICH's and Intel MPI's Hydra): ``PMI_RANK`` / ``PMI_SIZE``, local rank from
   ``MPI_LOCALRANKID``. srun with PMI sets these too; SLURM comes first because it also says
   where the other ranks are.

The rendezvous address (``MASTER_ADDR``/``MASTER_PORT``) comes from the environment when set.
Otherwise: for one node, ``127.0.0.1``; for SLURM across nodes, the first host of the step's
node list (``node[01-04]`` is expanded here, in Python: planning starts no process, so not
``scontrol show hostnames``); and for SLURM a port derived from the job and step ids
(``10000 + (SLURM_JOB_ID * 64 + SLURM_STEP_ID) % 20000``), the same on every rank without any
exchange. MPI has no job id that every implementation sets: across nodes, or without a
``MASTER_PORT``, it must be given (``mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500``).

Pure: reads a mapping (``os.environ`` by default), writes nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import replace

from hwlaunch._checks import ASCII_NUMBER_RULE, text_int
from hwlaunch.errors import ConfigError
from hwlaunch.runtime_facts import LAUNCHERS, NO_LAUNCHER, Found, LauncherInfo, LauncherName

__all__ = [
    "LAUNCHERS",
    "NO_LAUNCHER",
    "Found",
    "LauncherInfo",
    "detect_launcher",
    "expand_hostlist",
    "launcher_of",
]
SLURM_PORT_BASE = 10000
SLURM_PORT_SPAN = 20000


class _Reader:
    """Reads a launcher's variables as integers, each remembering its variable."""

    def __init__(self, env: Mapping[str, str], launcher: LauncherName) -> None:
        self.env = env
        self.launcher = launcher

    def source(self, var: str) -> str:
        return f"env: {var} ({self.launcher})"

    def int(self, *names: str, minimum: int = 0) -> Found | None:
        """The first of ``names`` that is set, as an integer >= ``minimum``."""
        for var in names:
            raw = self.env.get(var)
            if raw is None or not raw.strip():
                continue
            value = text_int(raw)
            if value is None or value < minimum:
                raise ConfigError(
                    f"invalid value {raw!r} of {var} set by {self.launcher}: expected an "
                    f"integer >= {minimum}, {ASCII_NUMBER_RULE}"
                )
            return Found(value, self.source(var))
        return None

    def text(self, var: str) -> Found | None:
        raw = self.env.get(var, "").strip()
        return Found(raw, self.source(var)) if raw else None


def detect_launcher(environ: Mapping[str, str] | None = None) -> LauncherInfo:
    """The launcher that started this process, read from ``environ`` (default: os.environ)."""
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in env and all(v in env for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return _torchrun(env)
    if "OMPI_COMM_WORLD_RANK" in env:
        return _mpi(env, "OMPI_COMM_WORLD_")
    if all(v in env for v in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS")):
        return _slurm(env)
    if "PMI_RANK" in env:
        return _mpi(env, "PMI_")
    return NO_LAUNCHER


def launcher_of(name: LauncherName, environ: Mapping[str, str] | None = None) -> LauncherInfo:
    """The record ``name`` gives from ``environ`` (for an assumed launcher: what-if planning)."""
    env = os.environ if environ is None else environ
    readers = {"torchrun": _torchrun, "slurm": _slurm}
    if name == "none":
        return NO_LAUNCHER
    if name in readers:
        return readers[name](env)
    return _mpi(env, "OMPI_COMM_WORLD_" if "OMPI_COMM_WORLD_RANK" in env else "PMI_")


def _rendezvous(
    r: _Reader, info: LauncherInfo, derived_addr: Found | None, derived_port: Found | None
) -> LauncherInfo:
    """MASTER_ADDR/MASTER_PORT from the environment, else what the launcher lets us derive."""
    addr = r.text("MASTER_ADDR")
    port = r.int("MASTER_PORT", minimum=1)
    if addr is None and info.nnodes is not None and info.nnodes.value == 1:
        addr = Found("127.0.0.1", f"derived: one node ({info.nnodes.source})")
    addr = addr or derived_addr
    port = port or derived_port
    missing = [var for var, found in (("MASTER_ADDR", addr), ("MASTER_PORT", port)) if not found]
    return replace(info, master_addr=addr, master_port=port, missing=tuple(missing))


def _nnodes(given: Found | None, world: Found | None, local: Found | None) -> Found | None:
    """The launcher's node count, or world size / ranks per node when it divides evenly."""
    if given is not None:
        return given
    if world is not None and local is not None and local.value and world.value % local.value == 0:
        return Found(
            world.value // local.value,
            f"derived: {world.source.removeprefix('env: ')} / {local.source.removeprefix('env: ')}",
        )
    return None


def _torchrun(env: Mapping[str, str]) -> LauncherInfo:
    r = _Reader(env, "torchrun")
    world = r.int("WORLD_SIZE", minimum=1)
    local = r.int("LOCAL_WORLD_SIZE", minimum=1)
    info = LauncherInfo(
        launcher="torchrun",
        evidence="env: TORCHELASTIC_RUN_ID (torchrun)",
        rank=r.int("RANK"),
        local_rank=r.int("LOCAL_RANK"),
        world_size=world,
        local_world_size=local,
        nnodes=_nnodes(r.int("GROUP_WORLD_SIZE", minimum=1), world, local),
    )
    # torchrun's agent already serves the store at MASTER_ADDR:MASTER_PORT: never derive one.
    return _rendezvous(r, info, None, None)


def _slurm(env: Mapping[str, str]) -> LauncherInfo:
    r = _Reader(env, "slurm")
    nodes = r.int("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", minimum=1)
    world = r.int("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", minimum=1)
    info = LauncherInfo(
        launcher="slurm",
        evidence="env: SLURM_PROCID, SLURM_STEP_NUM_TASKS (slurm: srun)",
        rank=r.int("SLURM_PROCID"),
        local_rank=r.int("SLURM_LOCALID"),
        world_size=world,
        local_world_size=None,
        nnodes=nodes,
    )
    addr = None
    for var in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if env.get(var, "").strip():
            first = next(expand_hostlist(env[var]), None)
            if first is not None:
                addr = Found(first, f"derived: first host of {var} (slurm)")
            break
    port = None
    job = r.int("SLURM_JOB_ID", "SLURM_JOBID")
    if job is not None:
        step = r.int("SLURM_STEP_ID", "SLURM_STEPID")
        step_id = step.value if step is not None else 0
        value = SLURM_PORT_BASE + (job.value * 64 + step_id) % SLURM_PORT_SPAN
        names = "SLURM_JOB_ID" + (", SLURM_STEP_ID" if step is not None else "")
        port = Found(value, f"derived: from {names} (slurm)")
    return _rendezvous(r, info, addr, port)


def _mpi(env: Mapping[str, str], prefix: str) -> LauncherInfo:
    r = _Reader(env, "mpi")
    if prefix == "OMPI_COMM_WORLD_":
        rank, world = r.int("OMPI_COMM_WORLD_RANK"), r.int("OMPI_COMM_WORLD_SIZE", minimum=1)
        local = r.int("OMPI_COMM_WORLD_LOCAL_RANK")
        local_size = r.int("OMPI_COMM_WORLD_LOCAL_SIZE", minimum=1)
    else:
        rank, world = r.int("PMI_RANK"), r.int("PMI_SIZE", minimum=1)
        local, local_size = r.int("MPI_LOCALRANKID"), r.int("MPI_LOCALNRANKS", minimum=1)
    info = LauncherInfo(
        launcher="mpi",
        evidence=f"env: {prefix}RANK (mpi)",
        rank=rank,
        local_rank=local,
        world_size=world,
        local_world_size=local_size,
        nnodes=_nnodes(None, world, local_size),
    )
    return _rendezvous(r, info, None, None)


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(hostlist: str) -> Iterator[str]:
    """SLURM's compressed host lists, lazily: ``"n[01-03,07],gpu1"`` -> n01 n02 n03 n07 gpu1.

    Zero padding follows the range's first bound (``[08-10]`` -> 08 09 10); several bracket
    groups in one name expand as a product (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2).
    """
    for name in _split_top_level(hostlist):
        yield from _expand_name(name)


def _split_top_level(text: str) -> Iterator[str]:
    depth, start = 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            if text[start:i].strip():
                yield text[start:i].strip()
            start = i + 1
    if depth != 0:
        raise ConfigError(f"invalid SLURM host list {text!r}: unbalanced brackets")
    if text[start:].strip():
        yield text[start:].strip()


def _expand_name(name: str) -> Iterator[str]:
    open_at = name.find("[")
    if open_at < 0:
        yield name
        return
    close_at = name.index("]", open_at)
    prefix, body, rest = name[:open_at], name[open_at + 1 : close_at], name[close_at + 1 :]
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if match is None:
            raise ConfigError(f"invalid SLURM host list range {part!r} in {name!r}")
        low, high = match.group(1), match.group(2) or match.group(1)
        width = len(low)
        for number in range(int(low), int(high) + 1):
            for tail in _expand_name(rest):
                yield f"{prefix}{number:0{width}d}{tail}"
