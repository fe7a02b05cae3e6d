"""The start-method rules: requested, the backend's default, the fork hazard, the main guard.

Each rule is a small function of (spec, facts, the setting) that returns a value, a reason, or
an error; ``start_method()`` applies them in order. A fork hazard is a value (which fact makes
fork unsafe, and why), so every rule that needs it reads the same cause.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwlaunch._start_methods import FORK, SPAWN, kind_of
from hwlaunch.errors import MissingMainGuardError, StartMethodError
from hwlaunch.executor_spec import ExecutorSpec
from hwlaunch.plan import Decision
from hwlaunch.planning.fork_safety import judge_threads, reasons
from hwlaunch.planning.notes import Notes
from hwlaunch.planning.settings import Overrides, Sourced
from hwlaunch.runtime_facts import REIMPORT_UNSAFE, RuntimeFacts, labels
from hwlaunch.spec import BackendSpec, StartMethod

__all__ = [
    "ForkHazard",
    "Verdict",
    "fork_hazard",
    "fork_warning",
    "judge",
    "main_guard_rule",
    "note_threads",
    "preload_decision",
    "preload_of",
    "reimport_error",
    "start_method",
]


@dataclass(frozen=True)
class ForkHazard:
    """Why fork is unsafe right now: the fact that says so (``cuda.initialized``, ``threads``,
    ``in_ray_actor``) and the sentence for people. ``fatal``: forked workers surely fail or
    hang (an initialized device, a started OpenMP pool), so an explicit fork is an error with
    ``consequence`` and ``fix``; otherwise fork is a risk (a lock another thread holds at the
    fork stays locked in the child), honoured with a warning when asked for."""

    fact: str
    why: str
    fatal: bool
    consequence: str = ""
    fix: str = ""


def fork_hazard(spec: BackendSpec, facts: RuntimeFacts) -> ForkHazard | None:
    """The gravest reason fork is unsafe for ``spec`` in this process, or None."""
    if spec.start_methods.fork_unsafe_after_init and facts.devices[spec.name].initialized:
        key = f"{spec.name}.initialized"
        why = (
            f"{spec.name} is already initialized in this process{facts.mark(key)}, "
            f"and a forked child cannot re-initialize it"
        )
        consequence = (
            f"workers would fail with 'Cannot re-initialize {spec.device_type.upper()} in "
            "forked subprocess'"
        )
        fix = f"start the workers before anything initializes {spec.name} in this process"
        return ForkHazard(key, why, True, consequence, fix)
    threads = facts.threads
    verdicts = judge_threads(threads)
    if verdicts.fatal:
        why = (
            f"this process has {threads.summary(verdicts.fatal)}{facts.mark('threads')}, and a "
            "forked child keeps only the thread that forks"
        )
        fix = reasons(verdicts.fatal, "fix")
        return ForkHazard("threads", why, True, reasons(verdicts.fatal), fix)
    if facts.in_ray_actor:
        why = (
            "this process is a Ray actor, whose background threads make fork "
            f"unsafe{facts.mark('in_ray_actor')}"
        )
        return ForkHazard("in_ray_actor", why, fatal=False)
    if verdicts.risk:
        why = (
            f"this process has {threads.summary(verdicts.risk)}{facts.mark('threads')}, and a "
            f"forked child keeps only the thread that forks: {reasons(verdicts.risk)}"
        )
        return ForkHazard("threads", why, fatal=False)
    return None


def note_threads(notes: Notes) -> None:
    """The threads a fork leaves behind, by verdict: shown in every plan that starts
    processes, so that a fork kept beside known-safe threads says which and why."""
    facts = notes.facts
    threads, verdicts = facts.threads, judge_threads(facts.threads)
    parts = [
        f"{verdict}: {labels(group)}: {reasons(group)}"
        for verdict, group in (
            ("fatal", verdicts.fatal),
            ("risk", verdicts.risk),
            ("safe", verdicts.safe),
        )
        if group
    ]
    if threads.own:
        parts.append(
            f"safe: {threads.own} of hwlaunch's own threads: "
            "they wait in poll or recv and hold no lock a child needs"
        )
    reason = "; ".join(parts) if parts else "no other threads: a fork leaves nothing behind"
    gravest = verdicts.gravest if verdicts.gravest != "none" or not threads.own else "safe"
    notes.note("threads", gravest, notes.fact("threads"), reason)


@dataclass(frozen=True)
class Verdict:
    """Whether a start method may be used here: ``error`` when it cannot (what a request for it
    raises) with ``why`` in a few words (what a dropped plugin proposal says); ``risk`` when it
    may, with a warning (fork beside other threads)."""

    error: StartMethodError | None = None
    why: str = ""
    risk: str | None = None


def judge(spec: BackendSpec, method: str, source: str, facts: RuntimeFacts) -> Verdict:
    """The one legality check of a start method, for a user's request and a plugin's proposal
    alike: offered by the OS, allowed by the backend's rule, safe to fork now, and, for spawn
    and forkserver, a ``__main__`` that can be re-imported."""
    offered, rule = facts.os_start_methods, spec.start_methods
    if method not in offered:
        why = f"this OS does not offer it (offered: {', '.join(offered)})"
        return Verdict(not_offered(method, source, facts), why)
    if method not in rule.allowed:
        why = f"the rule of backend {spec.name} allows only {', '.join(rule.allowed)}"
        return Verdict(disallowed(method, source, spec), why)
    kind = kind_of(method)
    if kind.copies_parent:
        hazard = fork_hazard(spec, facts)
        if hazard is not None and hazard.fatal:
            return Verdict(fork_error(spec, source, hazard), f"fork is unsafe: {hazard.why}")
        return Verdict(risk=None if hazard is None else hazard.why)
    if kind.reimports_main and facts.main_guard.status in REIMPORT_UNSAFE:
        why = f"{method} would re-import __main__: {facts.main_guard.problem()}"
        return Verdict(guard_error(method, source, spec, facts), why)
    return Verdict()


def fork_error(spec: BackendSpec, source: str, hazard: ForkHazard) -> StartMethodError:
    fallback = spec.start_methods.fallback or SPAWN.name
    return StartMethodError(
        f"start method 'fork' from {source} cannot work: {hazard.why} ({hazard.consequence})."
        f' Fix: use start method {fallback!r} (with an `if __name__ == "__main__":` guard), or '
        f"{hazard.fix}"
    )


def preload_of(spec: BackendSpec) -> tuple[str, ...]:
    """What the fork server imports for this backend: the rule's modules, then the worker's."""
    return tuple(dict.fromkeys((*spec.start_methods.preload, spec.worker.partition(":")[0])))


def preload_decision(spec: BackendSpec, method: str | None) -> Decision | None:
    """What is imported once before the workers start with ``method``, as the plan shows it
    (the rules' method or a plugin's): the fork server's preload, or None without one."""
    preload = () if method is None else kind_of(method).preload(preload_of(spec))
    if not preload:
        return None
    reason = "imported once by the fork server so workers start fast"
    return Decision("preload", list(preload), f"rule of backend {spec.name}", reason)


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
    if chosen is not None:
        method = _requested(spec, chosen, notes)
        source, reason = chosen.source, "requested"
    else:
        method, source, reason, away = _default(spec, notes)
        method, source, reason = main_guard_rule(spec, method, source, reason, notes)
        if away is not None and not kind_of(method).copies_parent:
            notes.warn(f"using start method {method!r} instead of fork: {away}")
    fork_warning(spec, method, notes.warnings)
    notes.note("start_method", method, source, reason)
    note_threads(notes)
    return method


def fork_warning(spec: BackendSpec, method: str, warnings: list[str]) -> None:
    """The backend's warning for a child that copies this process (HPU: fork can hang at
    exit), added to ``warnings`` whenever such a method is chosen, by a rule or a plugin."""
    if kind_of(method).copies_parent and spec.start_methods.fork_warning:
        warnings.append(f"backend {spec.name}: {spec.start_methods.fork_warning}")


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


def _requested(spec: BackendSpec, chosen: Sourced[StartMethod], notes: Notes) -> StartMethod:
    """An explicit method: legal here (``judge``); a risky fork is honoured with a warning."""
    verdict = judge(spec, chosen.value, chosen.source, notes.facts)
    if verdict.error is not None:
        raise verdict.error
    if verdict.risk is not None:
        notes.warn(f"fork was requested ({chosen.source}) although {verdict.risk}")
    return chosen.value


def _default(spec: BackendSpec, notes: Notes) -> tuple[StartMethod, str, str, str | None]:
    """The backend's default among what the OS offers; away from fork when fork is unsafe.
    The last item is why fork was left (the warning, given once the main guard has had its
    say), or None."""
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
    hazard = fork_hazard(spec, facts) if kind_of(method).copies_parent else None
    if hazard is None:
        return method, source, reason, None
    fallback = _fallback(spec, hazard, facts)
    if fallback is None:  # a risk, and nothing else to use: fork, said plainly
        notes.warn(f"using fork although {hazard.why}: backend {spec.name} allows nothing else")
        return method, source, f"{reason}; the only method usable: {hazard.why}", None
    method, why = fallback
    reason = f"fork is unsafe: {hazard.why}; using {method} instead: {why}"
    return method, notes.fact(hazard.fact), reason, hazard.why


def _fallback(
    spec: BackendSpec, hazard: ForkHazard, facts: RuntimeFacts
) -> tuple[StartMethod, str] | None:
    """The method used when fork is unsafe, and why that one: the rule's fallback, else the
    first other allowed method, among those the OS offers. None: there is none, and fork is
    only a risk."""
    rule, offered = spec.start_methods, facts.os_start_methods
    ranked = [rule.fallback] if rule.fallback else []
    ranked += [m for m in rule.allowed if not kind_of(m).copies_parent and m not in ranked]
    usable = [m for m in ranked if m in offered]
    if not usable and not hazard.fatal:
        return None
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
    how = kind_of(method).how_workers_start(spec.name, preload_of(spec))
    return method, f"{why}; {how}"


# -- the main guard ------------------------------------------------------------------------
def main_guard_rule(
    spec: BackendSpec, method: StartMethod, source: str, reason: str, notes: Notes
) -> tuple[StartMethod, str, str]:
    """spawn and forkserver re-import ``__main__`` in every worker: with a main that is unsafe
    to re-import (unguarded, unreadable, or not analysable), the rule's method becomes fork
    where fork can work (a risky fork is said so), else an error. (A requested method meets
    the same check in ``judge``.) Returns the (method, source, reason) to use."""
    facts = notes.facts
    guard = facts.main_guard
    if not kind_of(method).reimports_main or guard.status not in REIMPORT_UNSAFE:
        return method, source, reason
    fork = judge(spec, FORK.name, f"rule of backend {spec.name}", facts)
    if fork.error is not None:
        raise guard_error(method, source, spec, facts)
    risk = f", although {fork.risk}" if fork.risk else ""
    notes.warn(
        f"{guard.problem()} if started with {method}; using fork instead{risk}. Add an "
        f'`if __name__ == "__main__":` guard around the launch to use {method}'
    )
    where = guard_location(facts)
    reason = f"fork is the only method that can work: main guard {guard.status} ({where})"
    return FORK.name, notes.fact("main_guard"), reason


def guard_location(facts: RuntimeFacts) -> str:
    guard = facts.main_guard
    return guard.where() or guard.file or "the main script"


def guard_error(
    method: str, source: str, spec: BackendSpec, facts: RuntimeFacts
) -> MissingMainGuardError:
    fork = judge(spec, FORK.name, f"rule of backend {spec.name}", facts)
    hazard = fork_hazard(spec, facts)
    if fork.error is None:
        risk = f"; mind that {fork.risk}" if fork.risk else ""
        alternative = f", or use start method 'fork' (allowed by backend {spec.name}{risk})"
    elif FORK.name not in spec.start_methods.allowed:
        alternative = f" (fork is not an option: backend {spec.name} does not allow it)"
    elif FORK.name not in facts.os_start_methods:
        alternative = (
            f" (fork is not an option: this OS does not offer it{facts.mark('start_methods')})"
        )
    else:
        assert hazard is not None  # fork is offered and allowed: a fatal hazard refused it
        alternative = f" (fork is not an option: {hazard.why}: {hazard.consequence})"
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
