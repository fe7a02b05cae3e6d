"""resolve(): rules + facts + overrides -> Plan, with no side effects.

``decide()`` is a pure function of (specs, facts, overrides): it writes no environment
variable, sets no global start method and starts no process, so every rule is a table test.
``resolve()`` only gathers its inputs (reads env, config file, probes) and calls it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from hwlaunch.errors import (
    BackendUnavailableError,
    ConfigError,
    MissingMainGuardError,
    StartMethodError,
)
from hwlaunch.facts import RuntimeFacts, apply_assumptions, gather_facts, parse_assumptions
from hwlaunch.mainguard import REIMPORT_UNSAFE
from hwlaunch.plan import Decision, Plan
from hwlaunch.registry import Registry, default_registry, unknown_name_message
from hwlaunch.settings import Overrides, Sourced, collect_overrides, did_you_mean
from hwlaunch.spec import BackendSpec

DEFAULT_RAY_PG_TIMEOUT = 60.0
# How close (difflib ratio) a [backends.<name>] must be to a registered name to count as a typo:
# 'cdua' (0.75) is a typo of 'cuda', while 'npu' or 'tpu' (0.67 to 'cpu') are other vendors.
TYPO_CUTOFF = 0.75
PYTHON_SOURCES = {
    "backend": "resolve(backend=)",
    "world_size": "resolve(world_size=)",
    "nnodes": "resolve(nnodes=)",
    "executor": "resolve(executor=)",
    "start_method": "resolve(start_method=)",
    "ray_address": "resolve(ray_address=)",
    "max_restarts": "resolve(max_restarts=)",
}


class _Decider:
    """One resolution; collects decisions and warnings while applying the rules in order."""

    def __init__(
        self,
        specs: Mapping[str, BackendSpec],
        facts: RuntimeFacts,
        overrides: Overrides,
        plugin_problems: Iterable[str],
    ) -> None:
        self.specs = specs
        self.facts = facts
        self.overrides = overrides
        self.decisions: list[Decision] = []
        self.warnings: list[str] = list(plugin_problems)

    def note(self, setting: str, value: Any, source: str, reason: str) -> Any:
        self.decisions.append(Decision(setting, value, source, reason))
        return value

    def fact(self, key: str) -> str:
        return f"fact: {key}{self.facts.mark(key)}"

    # -- backend -------------------------------------------------------------------------
    def backend(self) -> BackendSpec:
        chosen = self.overrides.lookup("backend")
        if chosen is not None:
            if chosen.value not in self.specs:
                raise BackendUnavailableError(
                    f"{unknown_name_message('backend', chosen.value, self.specs)} from "
                    f"{chosen.source}; `hwlaunch backends` lists them and any plugin that failed"
                )
            spec = self.specs[chosen.value]
            device = self.facts.devices[spec.name]
            if not device.available:
                available = [n for n, d in self.facts.devices.items() if d.available]
                why = f" (probe failed: {device.probe_error})" if device.probe_error else ""
                raise BackendUnavailableError(
                    f"backend {spec.name!r} from {chosen.source} is not available on this "
                    f"machine{why}{self.facts.mark(spec.name + '.available')}. Fix: choose an "
                    f"available backend ({', '.join(available) or 'none'}), or see what would "
                    f"happen with --assume {spec.name}.available=true"
                )
            self.note("backend", spec.name, chosen.source, "requested")
            return spec
        ranked = sorted(
            (s for s in self.specs.values() if self.facts.devices[s.name].available),
            key=lambda s: (-s.priority, s.name),
        )
        if ranked:
            spec = ranked[0]
            others = ", ".join(s.name for s in ranked[1:]) or "none"
            reason = (
                f"highest-priority available backend (priority {spec.priority}"
                f"{self.facts.mark(spec.name + '.available')}; other available: {others})"
            )
            self.note("backend", spec.name, "auto-detected", reason)
            return spec
        if "cpu" in self.specs:
            self.note("backend", "cpu", "built-in default", "no backend reports itself available")
            return self.specs["cpu"]
        raise BackendUnavailableError(
            "no backend is available and the cpu plugin is not loaded; check "
            "`hwlaunch backends` and HWLAUNCH_DISABLE_PLUGINS / HWLAUNCH_PLUGINS"
        )

    # -- sizes ---------------------------------------------------------------------------
    def size(self, name: str, backend: str) -> Sourced[int]:
        found = self.overrides.lookup(name, backend)
        if found is None:
            value, reason = Sourced(1, "built-in default"), "default"
        elif found is self.overrides.defaults.get(name):
            value, reason = found, "default of this command"
        else:
            value, reason = found, "requested"
        self.note(name, value.value, value.source, reason)
        return value

    # -- executor ------------------------------------------------------------------------
    def executor(self, spec: BackendSpec, world: Sourced[int], nodes: Sourced[int]) -> str:
        if nodes.value > world.value:
            raise ConfigError(
                f"nnodes {nodes.value} (from {nodes.source}) exceeds world_size {world.value} "
                f"(from {world.source}); every node needs at least one worker"
            )
        device = self.facts.devices[spec.name]
        count_fact = f"{spec.name}.device_count"
        chosen = self.overrides.lookup("executor", spec.name)
        if chosen is not None:
            if chosen.value == "uni" and world.value > 1:
                raise ConfigError(
                    f"executor 'uni' from {chosen.source} runs one in-process worker, but "
                    f"world_size is {world.value} (from {world.source}). Fix: use executor "
                    "'mp' (one node) or 'ray', or world_size 1"
                )
            if chosen.value in ("uni", "mp") and nodes.value > 1:
                raise ConfigError(
                    f"executor {chosen.value!r} from {chosen.source} runs on one node, but "
                    f"nnodes is {nodes.value} (from {nodes.source}). Fix: use executor 'ray'"
                )
            if chosen.value == "mp" and spec.is_accelerator and world.value > device.device_count:
                raise ConfigError(
                    f"executor 'mp' from {chosen.source} binds one {spec.name} device per worker, "
                    f"but world_size {world.value} (from {world.source}) exceeds the "
                    f"{device.device_count} local devices{self.facts.mark(count_fact)}. Fix: use "
                    f"executor 'ray' or world_size <= {device.device_count}"
                )
            return str(self.note("executor", chosen.value, chosen.source, "requested"))
        if nodes.value > 1:
            return str(
                self.note(
                    "executor",
                    "ray",
                    f"nnodes (from {nodes.source})",
                    f"{nodes.value} nodes requested; workers span machines",
                )
            )
        if world.value == 1:
            return str(self.note("executor", "uni", "rule", "world size 1 runs in-process"))
        if spec.is_accelerator and world.value > device.device_count:
            return str(
                self.note(
                    "executor",
                    "ray",
                    self.fact(count_fact),
                    f"world size {world.value} exceeds the {device.device_count} local "
                    f"{spec.name} devices{self.facts.mark(count_fact)}; Ray places workers on "
                    "other nodes",
                )
            )
        where = (
            f"{device.device_count} local {spec.name} devices"
            if spec.is_accelerator
            else "one node"
        )
        return str(
            self.note(
                "executor",
                "mp",
                "rule",
                f"world size {world.value} fits on {where}: local processes",
            )
        )

    # -- start method --------------------------------------------------------------------
    def fork_unsafe(self, spec: BackendSpec) -> str | None:
        rule = spec.start_methods
        if rule.fork_unsafe_after_init and self.facts.devices[spec.name].initialized:
            key = f"{spec.name}.initialized"
            return (
                f"{spec.name} is already initialized in this process{self.facts.mark(key)}, "
                f"and a forked child cannot re-initialize it"
            )
        if self.facts.in_ray_actor:
            return (
                "this process is a Ray actor, whose background threads make fork "
                f"unsafe{self.facts.mark('in_ray_actor')}"
            )
        return None

    def fork_usable(self, spec: BackendSpec) -> bool:
        """Allowed by the backend, offered by the OS, and safe right now."""
        return (
            "fork" in spec.start_methods.allowed
            and "fork" in self.facts.os_start_methods
            and self.fork_unsafe(spec) is None
        )

    def guard_location(self) -> str:
        guard = self.facts.main_guard
        return guard.where() or guard.file or "the main script"

    def guard_error(self, method: str, source: str, spec: BackendSpec) -> MissingMainGuardError:
        guard = self.facts.main_guard
        if self.fork_usable(spec):
            alternative = f", or use start method 'fork' (allowed by backend {spec.name})"
        elif "fork" not in spec.start_methods.allowed:
            alternative = f" (fork is not an option: backend {spec.name} does not allow it)"
        elif "fork" not in self.facts.os_start_methods:
            alternative = f" (fork is not an option: this OS does not offer it{self.facts.mark('start_methods')})"
        else:
            alternative = f" (fork is not an option: {self.fork_unsafe(spec)})"
        if guard.status == "unguarded":
            fix = 'put the launch in a function and call it under `if __name__ == "__main__":`'
        else:
            fix = (
                'put the launch under `if __name__ == "__main__":` in a source file and run '
                "that file (python train.py)"
            )
        return MissingMainGuardError(
            f"{guard.problem()}{self.facts.mark('main_guard')}, with start method {method!r} "
            f"(from {source}): {method} re-imports __main__ in every worker, and Python would "
            f"fail with its 'bootstrapping phase' RuntimeError or run the job twice. Fix: "
            f"{fix}{alternative}"
        )

    def reimport_error(self) -> MissingMainGuardError:
        """A launch reached while a spawned child re-runs ``__main__``: never a second run."""
        return MissingMainGuardError(
            f"{self.facts.main_guard.problem()}{self.facts.mark('main_guard')}: the program is "
            "being re-imported by a spawned child (a multiprocessing Pool, DataLoader or "
            "compile worker started with spawn or forkserver), and launching here would start "
            'the whole job again. Fix: put the launch under `if __name__ == "__main__":`'
        )

    def not_offered(self, method: str, source: str) -> StartMethodError:
        offered = self.facts.os_start_methods
        return StartMethodError(
            f"start method {method!r} from {source} is not offered by this "
            f"OS{self.facts.mark('start_methods')} (offered: {', '.join(offered)})"
        )

    def disallowed(self, method: str, source: str, spec: BackendSpec) -> StartMethodError:
        rule = spec.start_methods
        return StartMethodError(
            f"start method {method!r} from {source} is not allowed by the rule of backend "
            f"{spec.name}, which allows only {', '.join(rule.allowed)}. Fix: use "
            f"--start-method {rule.default} or remove the setting"
        )

    def fallback(self, spec: BackendSpec, offered: tuple[str, ...], unsafe: str) -> tuple[str, str]:
        """The method used when fork is unsafe, and why that one: the rule's fallback, else the
        first other allowed method, among those the OS offers."""
        rule = spec.start_methods
        ranked = [rule.fallback] if rule.fallback else []
        ranked += [m for m in rule.allowed if m != "fork" and m not in ranked]
        usable = [m for m in ranked if m in offered]
        if not usable:
            raise StartMethodError(
                f"fork cannot be used: {unsafe}, and backend {spec.name} allows no other start "
                f"method this OS offers{self.facts.mark('start_methods')} (allowed: "
                f"{', '.join(rule.allowed)}; offered: {', '.join(offered)})"
            )
        method = usable[0]
        if method == rule.fallback:
            why = f"the fallback of backend {spec.name}"
        else:
            why = (
                f"the rule's fallback {rule.fallback!r} is not offered by this OS"
                f"{self.facts.mark('start_methods')}"
                if rule.fallback
                else f"backend {spec.name} names no fallback"
            )
        if method == "forkserver":
            how = (
                f"a fork server, started fresh, imports {', '.join(preload_of(spec))} once and "
                f"each worker is forked from it, so workers start fast and none inherits the "
                f"{spec.name} state of this process"
            )
        else:
            how = "each worker starts a fresh interpreter and imports everything itself"
        return method, f"{why}; {how}"

    def start_method(self, spec: BackendSpec, executor: str) -> str | None:
        if self.facts.main_guard.status == "reimporting":
            raise self.reimport_error()
        if executor != "mp":
            ignored = self.overrides.lookup("start_method", spec.name)
            if ignored is not None and ignored.value not in self.facts.os_start_methods:
                raise self.not_offered(ignored.value, ignored.source)
            if ignored is not None and ignored.value not in spec.start_methods.allowed:
                raise self.disallowed(ignored.value, ignored.source, spec)
            if ignored is not None:
                self.warnings.append(
                    f"start method {ignored.value!r} from {ignored.source} is "
                    f"ignored: the {executor} executor does not use it"
                )
            self.note(
                "start_method",
                None,
                "rule",
                f"not used: the {executor} executor starts no local processes"
                if executor == "uni"
                else "not used: Ray starts the worker processes",
            )
            return None
        if self.facts.daemonic:
            raise StartMethodError(
                "this process is daemonic (started with daemon=True), and daemonic processes are "
                f"not allowed to have children{self.facts.mark('daemonic')}, so the mp executor "
                "cannot start workers here. Fix: start this process with daemon=False (hwlaunch "
                "workers are never daemonic), or use executor 'uni' or 'ray'"
            )
        rule = spec.start_methods
        offered = self.facts.os_start_methods
        unsafe = self.fork_unsafe(spec)
        guard = self.facts.main_guard
        chosen = self.overrides.lookup("start_method", spec.name)
        if chosen is not None:
            method = str(chosen.value)
            if method not in offered:
                raise self.not_offered(method, chosen.source)
            if method not in rule.allowed:
                raise self.disallowed(method, chosen.source, spec)
            if method == "fork" and unsafe is not None:
                if rule.fork_unsafe_after_init and self.facts.devices[spec.name].initialized:
                    fallback = rule.fallback or "spawn"
                    raise StartMethodError(
                        f"start method 'fork' from {chosen.source} cannot work: {unsafe} "
                        f"(workers would fail with 'Cannot re-initialize {spec.device_type.upper()}"
                        f" in forked subprocess'). Fix: use start method {fallback!r} (with an "
                        '`if __name__ == "__main__":` guard), or start the workers before '
                        f"anything initializes {spec.name} in this process"
                    )
                self.warnings.append(f"fork was requested ({chosen.source}) although {unsafe}")
            if method != "fork" and guard.status in REIMPORT_UNSAFE:
                raise self.guard_error(method, chosen.source, spec)
            if method == "fork" and rule.fork_warning:
                self.warnings.append(f"backend {spec.name}: {rule.fork_warning}")
            return str(self.note("start_method", method, chosen.source, "requested"))
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
                f"{self.facts.mark('start_methods')} (offered: {', '.join(offered)})"
            )
        if method == "fork" and unsafe is not None:
            method, why = self.fallback(spec, offered, unsafe)
            source = (
                self.fact(f"{spec.name}.initialized")
                if rule.fork_unsafe_after_init and self.facts.devices[spec.name].initialized
                else self.fact("in_ray_actor")
            )
            reason = f"fork is unsafe: {unsafe}; using {method} instead: {why}"
            self.warnings.append(f"using start method {method!r} instead of fork: {unsafe}")
        if method != "fork" and guard.status in REIMPORT_UNSAFE:
            if not self.fork_usable(spec):
                raise self.guard_error(method, source, spec)
            where = self.guard_location()
            self.warnings.append(
                f"{guard.problem()} if started with {method}; using fork instead. Add an "
                f'`if __name__ == "__main__":` guard around the launch to use {method}'
            )
            method, source = "fork", self.fact("main_guard")
            reason = f"fork is the only safe method: main guard {guard.status} ({where})"
        if method == "fork" and rule.fork_warning:
            self.warnings.append(f"backend {spec.name}: {rule.fork_warning}")
        return str(self.note("start_method", method, source, reason))

    # -- the whole plan ------------------------------------------------------------------
    def check_backend_tables(self) -> None:
        """A ``[backends.<name>]`` close to a registered name is a typo (error); any other is
        taken for a vendor whose plugin is not installed here (warning), so that one config
        file serves machines with different plugins."""
        config = self.overrides.config
        if config is None:
            return
        for name in config.backends:
            if name in self.specs:
                continue
            where = config.backend_tables.get(name, f"[backends.{name}] in {config.path}")
            close = did_you_mean(name, list(self.specs), cutoff=TYPO_CUTOFF)
            if close:
                raise ConfigError(
                    f"{where} names no registered backend{close} "
                    f"(registered: {', '.join(sorted(self.specs))})"
                )
            self.warnings.append(
                f"{where} names no registered backend, so it is ignored (registered: "
                f"{', '.join(sorted(self.specs))}; is its plugin installed?)"
            )

    def plan(self) -> Plan:
        self.check_backend_tables()
        spec = self.backend()
        world = self.size("world_size", spec.name)
        nodes = self.size("nnodes", spec.name)
        executor = self.executor(spec, world, nodes)
        method = self.start_method(spec, executor)
        self.note(
            "dist_backend",
            spec.dist_backend,
            f"rule of backend {spec.name}",
            "communication backend of the device",
        )
        self.note("worker", spec.worker, f"rule of backend {spec.name}", "worker class")
        self.note(
            "device_control_env_var",
            spec.device_control_env_var,
            f"rule of backend {spec.name}",
            "binds each worker to its device"
            if spec.device_control_env_var
            else "no device-visibility variable: workers share the host",
        )
        self.note(
            "ray_resource",
            spec.ray_resource,
            f"rule of backend {spec.name}",
            "the Ray resource each worker (actor) requests",
        )
        env = self.env(spec)
        preload: tuple[str, ...] = ()
        if method == "forkserver":
            preload = preload_of(spec)
            self.note(
                "preload",
                list(preload),
                f"rule of backend {spec.name}",
                "imported once by the fork server so workers start fast",
            )
        ray_address, pg_timeout = None, DEFAULT_RAY_PG_TIMEOUT
        if executor == "ray":
            found = self.overrides.lookup("ray_address")
            ray_address = found.value if found else None
            self.note(
                "ray_address",
                ray_address,
                found.source if found else "default",
                "cluster to join"
                if found
                else "the Ray instance already initialized here, else a new local one",
            )
            timeout = self.overrides.lookup("ray_pg_timeout")
            pg_timeout = timeout.value if timeout else DEFAULT_RAY_PG_TIMEOUT
            self.note(
                "ray_pg_timeout",
                pg_timeout,
                timeout.source if timeout else "default",
                "seconds to wait for the placement group",
            )
        restarts = self.max_restarts(executor)
        return Plan(
            backend=spec.name,
            world_size=world.value,
            nnodes=nodes.value,
            executor=executor,
            start_method=method,
            dist_backend=spec.dist_backend,
            worker=spec.worker,
            device_control_env_var=spec.device_control_env_var,
            ray_resource=spec.ray_resource,
            env=env,
            preload=preload,
            ray_address=ray_address,
            ray_pg_timeout=pg_timeout,
            max_restarts=restarts,
            decisions=tuple(self.decisions),
            warnings=tuple(dict.fromkeys(self.warnings)),
            facts=self.facts,
        )

    def max_restarts(self, executor: str) -> int:
        """How often a failed worker group is restarted (0: fail-stop); uni never restarts."""
        found = self.overrides.lookup("max_restarts")
        value = found.value if found else 0
        if executor == "uni" and value:
            self.warnings.append(
                f"max_restarts {value} (from {found.source if found else 'default'}) is not used: "
                "the uni executor runs the worker in this process, which a restart cannot replace"
            )
            value = 0
        self.note(
            "max_restarts",
            value,
            found.source if found else "default",
            "fail-stop: the first worker death ends the executor"
            if value == 0
            else "a failed worker group is stopped and started again, this many times at most",
        )
        return int(value)

    def env(self, spec: BackendSpec) -> dict[str, str]:
        env = dict(spec.worker_env)
        sources = [f"rule of backend {spec.name}"] if env else []
        config = self.overrides.config
        if config is not None:
            for layer in (config.env, config.backend_env.get(spec.name)):
                if layer is not None:
                    env.update(layer.value)
                    sources.append(layer.source)
        self.note("env", env, " < ".join(sources) or "none", "extra environment for workers")
        return env


def preload_of(spec: BackendSpec) -> tuple[str, ...]:
    """What the fork server imports for this backend: the rule's modules, then the worker's."""
    return tuple(dict.fromkeys((*spec.start_methods.preload, spec.worker.partition(":")[0])))


def decide(
    specs: Mapping[str, BackendSpec],
    facts: RuntimeFacts,
    overrides: Overrides,
    plugin_problems: Iterable[str] = (),
) -> Plan:
    """The pure core of resolution."""
    return _Decider(specs, facts, overrides, plugin_problems).plan()


def resolve_with_sources(
    explicit: Mapping[str, object | None],
    sources: Mapping[str, str],
    *,
    config: str | os.PathLike[str] | None = None,
    config_source: str = "resolve(config=)",
    assume: Mapping[str, object] | Iterable[str] | None = None,
    assume_source: str = "resolve(assume=)",
    registry: Registry | None = None,
    defaults: Mapping[str, Sourced[Any]] | None = None,
) -> Plan:
    """resolve() for callers (the CLI) that name their own sources, e.g. ``--start-method``,
    and their own defaults below every user setting."""
    registry = registry or default_registry()
    overrides = collect_overrides(explicit, sources, config, config_source, defaults=defaults)
    specs = registry.specs
    facts = gather_facts(specs)
    assumed = parse_assumptions(assume, assume_source)
    if assumed:
        facts = apply_assumptions(facts, assumed, assume_source)
    problems = [
        f"{p.describe()} failed to load: {p.error} (see `hwlaunch backends`)"
        for p in registry.failures
    ]
    return decide(specs, facts, overrides, problems)


def resolve(
    *,
    backend: str | None = None,
    world_size: int | None = None,
    nnodes: int | None = None,
    executor: str | None = None,
    start_method: str | None = None,
    config: str | os.PathLike[str] | None = None,
    assume: Mapping[str, object] | Iterable[str] | None = None,
    ray_address: str | None = None,
    max_restarts: int | None = None,
) -> Plan:
    """Decide backend, world size, executor and start method, with a reason for each.

    Explicit arguments beat the environment (``HWLAUNCH_*``), which beats the config file
    (``config``, ``HWLAUNCH_CONFIG``, ./hwlaunch.toml or ``[tool.hwlaunch]`` in
    ./pyproject.toml), which beats the backend's rule. ``assume`` replaces probed facts for
    what-if analysis (``{"cuda.available": True, "cuda.device_count": 2}``).
    """
    explicit = {
        "backend": backend,
        "world_size": world_size,
        "nnodes": nnodes,
        "executor": executor,
        "start_method": start_method,
        "ray_address": ray_address,
        "max_restarts": max_restarts,
    }
    return resolve_with_sources(explicit, PYTHON_SOURCES, config=config, assume=assume)
