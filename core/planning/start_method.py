"""The start-method rules: requested, the backend's default, the fork hazard, the main guard.

Each rule is a small function of (spec, facts, the setting) that returns a value, a reason, or
an error; ``start_method()`` applies them in order. A fork hazard is a value (which fact makes
fork unsafe, and why), so every rule that needs it reads the same cause.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwlaunch.errors import MissingMainGuardError, StartMethodError
from hwlaunch.executor_spec import ExecutorSpec
from hwlaunch.plan import REIMPORT_UNSAFE, RuntimeFacts
from hwlaunch.planning.notes import Notes
from hwlaunch.planning.settings import Overrides, Sourced
from hwlaunch.spec import BackendSpec, StartMethod

__all__ = [
    "ForkHazard",
    "fork_hazard",
    "main_guard_rule",
    "preload_of",
    "reimport_error",
    "start_method",
]


@dataclass(frozen=True)
class ForkHazard:
    """Why fork is unsafe right now: the fact that says so (``cuda.initialized``,
    ``in_ray_actor``), the sentence for people, and whether forked workers would surely fail
    (an initialized device) rather than risk a hang (a Ray actor's threads)."""

    fact: str
    why: str
    fatal: bool


def fork_hazard(spec: BackendSpec, facts: RuntimeFacts) -> ForkHazard | None:
    """The reason fork is unsafe for ``spec`` in this process, or None."""
    if spec.start_methods.fork_unsafe_after_init and facts.devices[spec.name].initialized:
        key = f"{spec.name}.initialized"
        why = (
            f"{spec.name} is already initialized in this process{facts.mark(key)}, "
            f"and a forked child cannot re-initialize it"
        )
        return ForkHazard(key, why, fatal=True)
    if facts.in_ray_actor:
        why = (
            "this process is a Ray actor, whose background threads make fork "
            f"unsafe{facts.mark('in_ray_actor')}"
        )
        return ForkHazard("in_ray_actor", why, fatal=False)
    return None


def preload_of(spec: BackendSpec) -> tuple[str, ...]:
    """What the fork server imports for this backend: the rule's modules, then the worker's."""
    return tuple(dict.fromkeys((*spec.start_methods.preload, spec.worker.partition(":")[0])))


def not_offered(method: str, source: str, facts: RuntimeFacts) -> StartMethodError:
    offered = facts.os_start_methods
    return StartMethodError(
        f"start method {method!r} from {source} is not offered by this "
        f"OS{facts.mark('start_methods')} (offered: {', '.join(offered)})"
    )


def disallowed(method: str, source: str, spec: BackendSpec) -> StartMethodError:
    rule = spec.start_methods
    return StartMethodError(
        f"start method {method!r} from {source} is not allowed by the rule of backend "
        f"{spec.name}, which allows only {', '.join(rule.allowed)}. Fix: use "
        f"--start-method {rule.default} or remove the setting"
    )


def start_method(
    spec: BackendSpec, executor: ExecutorSpec, overrides: Overrides, notes: Notes
) -> StartMethod | None:
    """The start method for an executor that declares ``start_method`` (mp; None for the
    others), with its reason."""
    if notes.facts.main_guard.status == "reimporting":
        raise reimport_error(notes.facts)
    chosen = overrides.lookup("start_method", spec.name)
    if not executor.start_method:
        _not_used(spec, executor, chosen, notes)
        return None
    _check_daemonic(notes.facts)
    hazard = fork_hazard(spec, notes.facts)
    if chosen is not None:
        method = _requested(spec, chosen, hazard, notes)
        source, reason = chosen.source, "requested"
    else:
        method, source, reason = _default(spec, hazard, notes)
    method, source, reason = main_guard_rule(spec, method, source, reason, chosen, notes)
    if method == "fork" and spec.start_methods.fork_warning:
        notes.warn(f"backend {spec.name}: {spec.start_methods.fork_warning}")
    return notes.note("start_method", method, source, reason)  # type: ignore[no-any-return]


def not_used_reason(executor: ExecutorSpec) -> str:
    """Why an executor has no start method, from what it declares."""
    if executor.in_process and not executor.needs_launcher:
        return f"not used: the {executor.name} executor starts no local processes"
    if executor.ray:
        return "not used: Ray starts the worker processes"
    if executor.needs_launcher:
        return "not used: the launcher started the processes"
    return f"not used by the {executor.name} executor"


def _not_used(
    spec: BackendSpec, executor: ExecutorSpec, chosen: Sourced[StartMethod] | None, notes: Notes
) -> None:
    """An executor that uses no start method: a start method is checked against the rule,
    then ignored with a warning."""
    if chosen is not None and chosen.value not in notes.facts.os_start_methods:
        raise not_offered(chosen.value, chosen.source, notes.facts)
    if chosen is not None and chosen.value not in spec.start_methods.allowed:
        raise disallowed(chosen.value, chosen.source, spec)
    if chosen is not None:
        notes.warn(
            f"start method {chosen.value!r} from {chosen.source} is "
            f"ignored: the {executor.name} executor does not use it"
        )
    notes.note("start_method", None, "rule", not_used_reason(executor))


def _check_daemonic(facts: RuntimeFacts) -> None:
    if facts.daemonic:
        raise StartMethodError(
            "this process is daemonic (started with daemon=True), and daemonic processes are "
            f"not allowed to have children{facts.mark('daemonic')}, so the mp executor "
            "cannot start workers here. Fix: start this process with daemon=False (hwlaunch "
            "workers are never daemonic), or use executor 'uni' or 'ray'"
        )


def _requested(
    spec: BackendSpec, chosen: Sourced[StartMethod], hazard: ForkHazard | None, notes: Notes
) -> StartMethod:
    """An explicit method: offered by the OS, allowed by the rule, and not a fatal fork."""
    method, facts, rule = chosen.value, notes.facts, spec.start_methods
    offered = facts.os_start_methods
    if method not in offered:
        raise not_offered(method, chosen.source, facts)
    if method not in rule.allowed:
        raise disallowed(method, chosen.source, spec)
    if method == "fork" and hazard is not None:
        if hazard.fatal:
            raise StartMethodError(
                f"start method 'fork' from {chosen.source} cannot work: {hazard.why} "
                f"(workers would fail with 'Cannot re-initialize {spec.device_type.upper()}"
                f" in forked subprocess'). Fix: use start method {rule.fallback or 'spawn'!r} "
                '(with an `if __name__ == "__main__":` guard), or start the workers before '
                f"anything initializes {spec.name} in this process"
            )
        notes.warn(f"fork was requested ({chosen.source}) although {hazard.why}")
    return method


def _default(
    spec: BackendSpec, hazard: ForkHazard | None, notes: Notes
) -> tuple[StartMethod, str, str]:
    """The backend's default among what the OS offers; away from fork when fork is unsafe."""
    rule, facts = spec.start_methods, notes.facts
    offered = facts.os_start_methods
    source = f"rule of backend {spec.name}"
    method = rule.default
    reason = f"default of backend {spec.name} (allowed: {', '.join(rule.allowed)})"
    if method not in offered:
        usable = [m for m in rule.allowed if m in offered]
        if not usable:
            raise StartMethodError(
                f"backend {spec.name} allows {', '.join(rule.allowed)}, but this OS offers "
                f"only {', '.join(offered)}"
            )
        method = usable[0]
        reason = (
            f"default {rule.default!r} is not offered by this OS"
            f"{facts.mark('start_methods')} (offered: {', '.join(offered)})"
        )
    if method == "fork" and hazard is not None:
        method, why = _fallback(spec, hazard, facts)
        source = notes.fact(hazard.fact)
        reason = f"fork is unsafe: {hazard.why}; using {method} instead: {why}"
        notes.warn(f"using start method {method!r} instead of fork: {hazard.why}")
    return method, source, reason


def _fallback(
    spec: BackendSpec, hazard: ForkHazard, facts: RuntimeFacts
) -> tuple[StartMethod, str]:
    """The method used when fork is unsafe, and why that one: the rule's fallback, else the
    first other allowed method, among those the OS offers."""
    rule, offered = spec.start_methods, facts.os_start_methods
    ranked = [rule.fallback] if rule.fallback else []
    ranked += [m for m in rule.allowed if m != "fork" and m not in ranked]
    usable = [m for m in ranked if m in offered]
    if not usable:
        raise StartMethodError(
            f"fork cannot be used: {hazard.why}, and backend {spec.name} allows no other start "
            f"method this OS offers{facts.mark('start_methods')} (allowed: "
            f"{', '.join(rule.allowed)}; offered: {', '.join(offered)})"
        )
    method = usable[0]
    if method == rule.fallback:
        why = f"the fallback of backend {spec.name}"
    elif rule.fallback:
        why = f"the rule's fallback {rule.fallback!r} is not offered by this OS{facts.mark('start_methods')}"
    else:
        why = f"backend {spec.name} names no fallback"
    if method == "forkserver":
        how = (
            f"a fork server, started fresh, imports {', '.join(preload_of(spec))} once and "
            f"each worker is forked from it, so workers start fast and none inherits the "
            f"{spec.name} state of this process"
        )
    else:
        how = "each worker starts a fresh interpreter and imports everything itself"
    return method, f"{why}; {how}"


# -- the main guard ------------------------------------------------------------------------
def main_guard_rule(
    spec: BackendSpec,
    method: StartMethod,
    source: str,
    reason: str,
    requested: Sourced[StartMethod] | None,
    notes: Notes,
) -> tuple[StartMethod, str, str]:
    """spawn and forkserver re-import ``__main__`` in every worker: with a main that is unsafe
    to re-import (unguarded, unreadable, or not analysable), a requested method is an error; a
    rule's method becomes fork where fork is usable, else an error. Returns the (method,
    source, reason) to use."""
    guard = notes.facts.main_guard
    if method == "fork" or guard.status not in REIMPORT_UNSAFE:
        return method, source, reason
    if requested is not None or not fork_usable(spec, notes.facts):
        raise guard_error(method, source, spec, notes.facts)
    notes.warn(
        f"{guard.problem()} if started with {method}; using fork instead. Add an "
        f'`if __name__ == "__main__":` guard around the launch to use {method}'
    )
    where = guard_location(notes.facts)
    reason = f"fork is the only safe method: main guard {guard.status} ({where})"
    return "fork", notes.fact("main_guard"), reason


def fork_usable(spec: BackendSpec, facts: RuntimeFacts) -> bool:
    """Allowed by the backend, offered by the OS, and safe right now."""
    return (
        "fork" in spec.start_methods.allowed
        and "fork" in facts.os_start_methods
        and fork_hazard(spec, facts) is None
    )


def guard_location(facts: RuntimeFacts) -> str:
    guard = facts.main_guard
    return guard.where() or guard.file or "the main script"


def guard_error(
    method: str, source: str, spec: BackendSpec, facts: RuntimeFacts
) -> MissingMainGuardError:
    hazard = fork_hazard(spec, facts)
    if fork_usable(spec, facts):
        alternative = f", or use start method 'fork' (allowed by backend {spec.name})"
    elif "fork" not in spec.start_methods.allowed:
        alternative = f" (fork is not an option: backend {spec.name} does not allow it)"
    elif "fork" not in facts.os_start_methods:
        alternative = (
            f" (fork is not an option: this OS does not offer it{facts.mark('start_methods')})"
        )
    else:
        alternative = f" (fork is not an option: {hazard.why if hazard else ''})"
    guard = facts.main_guard
    if guard.status == "unguarded":
        fix = 'put the launch in a function and call it under `if __name__ == "__main__":`'
    else:
        fix = (
            'put the launch under `if __name__ == "__main__":` in a source file and run '
            "that file (python train.py)"
        )
    return MissingMainGuardError(
        f"{guard.problem()}{facts.mark('main_guard')}, with start method {method!r} "
        f"(from {source}): {method} re-imports __main__ in every worker, and Python would "
        f"fail with its 'bootstrapping phase' RuntimeError or run the job twice. Fix: "
        f"{fix}{alternative}"
    )


def reimport_error(facts: RuntimeFacts) -> MissingMainGuardError:
    """A launch reached while a spawned child re-runs ``__main__``: never a second run."""
    return MissingMainGuardError(
        f"{facts.main_guard.problem()}{facts.mark('main_guard')}: the program is "
        "being re-imported by a spawned child (a multiprocessing Pool, DataLoader or "
        "compile worker started with spawn or forkserver), and launching here would start "
        'the whole job again. Fix: put the launch under `if __name__ == "__main__":`'
    )
