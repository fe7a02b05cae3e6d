"""The CPU thread budget: how many intra-op threads each worker runs.

Why: torch (OpenMP) and MKL start one thread per CPU of the machine in every process that uses
them. Two workers on two CPUs then run four busy threads that take the CPUs from each other: a
tensor-parallel step measured 3 to 7 times slower than with one thread each. Each worker gets
its share instead: the CPUs this process may use (its affinity) divided by the workers on its
node, at least 1. The share reaches the workers as ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS``
in their environment (read when torch and MKL start their pools) and as
``torch.set_num_threads`` during start-up (for a pool that started before the environment was
there: torch imported in a parent that forked).

Who wins: a ``cpu_threads`` setting (flag, env, config); then ``OMP_NUM_THREADS`` as the user
set it (the plan's env, the driver's environment); then the share. torchrun sets
``OMP_NUM_THREADS=1`` for its ranks when nobody set it; that 1 is taken for torchrun's default,
not the user's choice. Pure, like every rule: it reads facts and settings only.
"""

from __future__ import annotations

from collections.abc import Mapping

from hwlaunch._checks import text_int
from hwlaunch.executor_spec import ExecutorSpec
from hwlaunch.planning.notes import Notes
from hwlaunch.planning.settings import Overrides, Sourced
from hwlaunch.runtime_facts import RuntimeFacts

__all__ = ["THREAD_VARS", "thread_budget"]

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def thread_budget(
    backend: str,
    executor: ExecutorSpec,
    adopts_launcher: bool,
    sizes: tuple[int, int],
    env: Mapping[str, str],
    env_source: str,
    overrides: Overrides,
    notes: Notes,
) -> tuple[int | None, dict[str, str]]:
    """``(threads, variables)``: the workers' ``torch.set_num_threads`` (None: left alone) and
    what the budget adds to the plan's ``env``. ``sizes`` is (world size, nodes)."""
    requested = overrides.lookup("cpu_threads", backend)
    if executor.in_process and not adopts_launcher:  # the worker's threads are the program's
        _not_applied(executor.name, requested, notes)
        return None, {}
    share, fact = _share(adopts_launcher, sizes, notes.facts)
    user = _user_value(adopts_launcher, sizes, env, env_source, notes.facts)
    threads: int | None
    if requested is not None:
        threads, source = int(requested.value), requested.source
        reason = f"requested (the share would be {share}: {fact.removeprefix('fact: ')})"
        _warn_replaced(requested, env, env_source, notes.facts, notes)
    elif user is not None:
        threads, source = _count_or_none(user.value), user.source
        reason = (
            f"OMP_NUM_THREADS={user.value} as the user set it wins over the budget "
            f"({fact.removeprefix('fact: ')}: {share})"
        )
        if threads is None:
            reason += "; not a thread count, so torch.set_num_threads is left alone"
    else:
        threads, source = share, fact
        reason = "each worker's share of the CPUs this process may use (its affinity)"
    if threads is not None and adopts_launcher:
        reason += (
            "; applied with torch.set_num_threads when this rank's worker starts (the launcher "
            "set this process's environment before Python started)"
        )
    elif threads is not None:
        reason += ": OMP_NUM_THREADS, MKL_NUM_THREADS and torch.set_num_threads in every worker"
    notes.note("cpu_threads", threads, source, reason)
    if adopts_launcher:
        return threads, {}
    return threads, _variables(requested, threads, env, notes.facts)


def _not_applied(executor: str, requested: Sourced[int] | None, notes: Notes) -> None:
    notes.note(
        "cpu_threads",
        None,
        requested.source if requested is not None else "rule",
        f"not applied: the {executor} executor runs the worker in this process, whose threads "
        "are the program's (call torch.set_num_threads there)",
    )
    if requested is not None:
        notes.warn(
            f"cpu_threads {requested.value} (from {requested.source}) is not used: the {executor} "
            "executor runs the worker in this process, whose threads hwlaunch leaves alone"
        )


def _share(adopts_launcher: bool, sizes: tuple[int, int], facts: RuntimeFacts) -> tuple[int, str]:
    """Each worker's share of the usable CPUs, and the fact it comes from."""
    world, nodes = sizes
    local = -(-world // max(nodes, 1))  # the most workers any node runs
    given = facts.launcher.local_world_size
    if adopts_launcher and given is not None:
        local = int(given.value)
    cpus = facts.usable_cpus
    workers = f"{local} worker{'s' if local != 1 else ''}"
    where = (
        "" if nodes <= 1 or adopts_launcher else " per node, each node taken to be like this one"
    )
    fact = (
        f"fact: {cpus} CPU{'s' if cpus != 1 else ''}{facts.mark('usable_cpus')} / {workers}{where}"
    )
    return max(1, cpus // max(local, 1)), fact


def _user_value(
    adopts_launcher: bool,
    sizes: tuple[int, int],
    env: Mapping[str, str],
    env_source: str,
    facts: RuntimeFacts,
) -> Sourced[str] | None:
    """OMP_NUM_THREADS as the user set it: the plan's env (which the workers get), else the
    driver's environment; torchrun's default of 1 does not count."""
    if "OMP_NUM_THREADS" in env and not adopts_launcher:
        return Sourced(env["OMP_NUM_THREADS"], env_source)
    value = facts.thread_env.get("OMP_NUM_THREADS")
    if value is None:
        return None
    torchrun = facts.launcher.launcher == "torchrun" and sizes[0] > 1 and value.strip() == "1"
    if torchrun:
        return None  # torchrun's own default for ranks that nobody gave a thread count
    return Sourced(value, "env OMP_NUM_THREADS (driver)")


def _count_or_none(raw: str) -> int | None:
    """A plain thread count; None for what OpenMP reads but torch cannot take ("4,2")."""
    value = text_int(raw)
    return value if value is not None and value >= 1 else None


def _variables(
    requested: Sourced[int] | None,
    threads: int | None,
    env: Mapping[str, str],
    facts: RuntimeFacts,
) -> dict[str, str]:
    """The thread variables the plan's env gains: a requested count sets both; else what the
    user set stays, the driver's travels with the plan (Ray actors do not inherit it), and the
    rest are the count."""
    added: dict[str, str] = {}
    for var in THREAD_VARS:
        if requested is not None:
            added[var] = str(requested.value)
        elif var in env:
            continue
        elif var in facts.thread_env:
            added[var] = facts.thread_env[var]
        elif threads is not None:
            added[var] = str(threads)
    return added


def _warn_replaced(
    requested: Sourced[int],
    env: Mapping[str, str],
    env_source: str,
    facts: RuntimeFacts,
    notes: Notes,
) -> None:
    """A requested count replaces a different OMP/MKL value the user set: say so."""
    for var in THREAD_VARS:
        value, where = env.get(var), env_source
        if value is None:
            value, where = facts.thread_env.get(var), "the driver's environment"
        if value is not None and value.strip() != str(requested.value):
            notes.warn(
                f"{var}={value} from {where} is replaced by cpu_threads {requested.value} "
                f"(from {requested.source}) in every worker"
            )
