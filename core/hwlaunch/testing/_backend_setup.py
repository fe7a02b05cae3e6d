"""What every conformance check of one backend asks: its registration, spec, probes, facts
and plans, and the class attributes a plugin's test class sets (``BackendConformance``).

Kept apart from the checks (``_backend_rules``, ``_backend_lifecycle``) so that each of those
reads as a list of checks; this module imports pytest, as they do.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from hwlaunch.executor_spec import ExecutorSpec
from hwlaunch.plan import Plan
from hwlaunch.planning.facts import apply_assumptions, gather_facts, parse_assumptions
from hwlaunch.planning.policy import settle
from hwlaunch.planning.registry import ENV_BLOCK, RegisteredBackend, Registry, load_registry
from hwlaunch.planning.rules import LOCAL, draft_plan
from hwlaunch.planning.settings import Overrides, Sourced
from hwlaunch.runtime_facts import RuntimeFacts
from hwlaunch.spec import BackendSpec
from hwlaunch.testing._capabilities import (
    lifecycle_cases,
    ray_cases,
)

__all__ = [
    "ALWAYS_FORBIDDEN",
    "MARKER_VAR",
    "PROBES",
    "PROBE_CALLS",
    "PROPAGATED_VAR",
    "RPC_TIMEOUT",
    "SECRET",
    "BackendSetup",
    "documented_visibility",
    "matches",
    "run_python",
    "same_fields",
]

PROBES = ("is_available", "device_count", "is_initialized")
ALWAYS_FORBIDDEN = ("torch", "ray")  # never imported by loading a plugin or calling its probes
PROBE_CALLS = 7  # calls of each probe; the median is held to the budget
SOURCE = "hwlaunch.testing"
MARKER_VAR = "HWLAUNCH_CONFORMANCE_MARKERS"  # where LifecycleProbe records each rank's shutdown
PROPAGATED_VAR = "HWLAUNCH_CONFORMANCE_PROPAGATED"  # names LifecycleProbe reports the values of
SECRET = "hwlaunch-conformance-secret-7f3a"  # set in propagated variables; never in plan output
RPC_TIMEOUT = 120.0


# -- what runs inside the workers ----------------------------------------------------------------


def documented_visibility(
    spec: BackendSpec, rank: int, world: int, parent: str | None, facts: RuntimeFacts
) -> str | None:
    """The visibility variable of local rank ``rank`` on one node, as the binding documents it:
    the job's devices are the first ``world`` of what the parent sees (its own setting of the
    variable, else every device); ``per_worker`` gives the rank its own, ``job_wide`` all of
    them, ``none`` leaves the parent's value."""
    if spec.device_binding == "none" or spec.device_control_env_var is None:
        return parent
    if parent:
        entries = [e.strip() for e in parent.split(",") if e.strip()]
    else:
        entries = [str(i) for i in range(max(facts.devices[spec.name].device_count, world))]
    job = entries[:world]
    return job[rank] if spec.device_binding == "per_worker" else ",".join(job)


# -- what runs in a fresh interpreter ------------------------------------------------------------

PROBE_PROGRAM = Path(__file__).with_name("_probes.py")  # run as a file: see its docstring


def run_python(*args: str, env: Mapping[str, str] | None = None) -> Any:
    environ = {**os.environ, **(env or {})}
    done = subprocess.run(
        [sys.executable, str(PROBE_PROGRAM), *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        pytest.fail(f"the fresh interpreter failed (exit {done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@functools.lru_cache(maxsize=4)
def registry_of(path: tuple[str, ...]) -> Registry:
    """Every plugin, unfiltered and not strict: the suite checks one backend, whatever else is
    installed (or excluded by this shell's HWLAUNCH_* variables)."""
    return load_registry(environ={}, strict=False)


@functools.lru_cache(maxsize=16)
def probe_run(backend: str, blocked: str, env: tuple[tuple[str, str], ...]) -> Any:
    """Load the plugins not ``blocked`` (only the backend's own) and call every probe of
    ``backend`` several times, in a fresh interpreter with ``env`` added."""
    args = {
        "path": list(sys.path),
        "environ": {ENV_BLOCK: blocked} if blocked else {},
        "backend": backend,
        "probes": list(PROBES),
        "calls": PROBE_CALLS,
    }
    return run_python("probe", json.dumps(args), env=dict(env))


def matches(module: str, names: tuple[str, ...]) -> bool:
    return any(module == name or module.startswith(name + ".") for name in names)


def same_fields(what: str, got: Mapping[str, object], expected: Mapping[str, object]) -> None:
    """Assert field by field with a message that names each difference (this module's asserts
    are not rewritten by pytest, so every assert carries its own message)."""
    wrong = [f"{k} is {got[k]!r}, expected {v!r}" for k, v in expected.items() if got[k] != v]
    assert not wrong, f"{what}: " + "; ".join(wrong)


def overrides_of(**values: object) -> Overrides:
    explicit = {k: Sourced(v, f"{SOURCE} {k}={v}") for k, v in values.items() if v is not None}
    return Overrides(explicit=explicit)


class BackendSetup:
    """The attributes and helpers of a backend's checks (documented on BackendConformance)."""

    backend: ClassVar[str] = ""
    assume: ClassVar[Mapping[str, object] | tuple[str, ...]] = ()
    executors: ClassVar[tuple[str, ...]] = ("uni", "mp", "ray")
    vendor_modules: ClassVar[tuple[str, ...]] = ()
    absent_env: ClassVar[Mapping[str, str] | tuple[str, ...]] = ()
    probe_imports_when_present: ClassVar[tuple[str, ...]] = ()
    probe_budget_s: ClassVar[float] = 0.05

    # -- helpers -------------------------------------------------------------------------------
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """The lifecycle cases of ``executors``, by the capabilities each one declares."""
        specs = registry_of(tuple(sys.path)).executor_specs
        owner = type(self).__name__
        if "lifecycle_executor" in metafunc.fixturenames:
            cases = lifecycle_cases(self.executors, specs, owner)
            metafunc.parametrize(("lifecycle_executor", "lifecycle_method"), cases)
        if "ray_executor" in metafunc.fixturenames:
            cases = ray_cases(self.executors, specs, owner)
            metafunc.parametrize("ray_executor", cases)

    def executor_spec(self, name: str) -> ExecutorSpec:
        """The executor as a plugin registered it; fails with the registered names otherwise."""
        specs = registry_of(tuple(sys.path)).executor_specs
        if name not in specs:
            pytest.fail(
                f"executor {name!r} of {type(self).__name__}.executors is not registered "
                f"(registered: {', '.join(sorted(specs))})"
            )
        return specs[name]

    def registered(self) -> RegisteredBackend:
        """The backend as the registry holds it; fails with every plugin failure otherwise."""
        if not self.backend:
            pytest.fail(f"{type(self).__name__} must set `backend = '<name>'`")
        registry = registry_of(tuple(sys.path))
        if self.backend in registry.backends:
            return registry.backends[self.backend]
        failures = "".join(f"\n  {p.describe()}: {p.error}" for p in registry.failures)
        pytest.fail(
            f"backend {self.backend!r} is not registered (registered: "
            f"{', '.join(sorted(registry.backends))}). Is its distribution installed (pip install "
            "-e .), with an entry point in the group 'hwlaunch.backends'? Plugins that failed:"
            f"{failures or ' none'}"
        )

    def spec(self) -> BackendSpec:
        return self.registered().spec

    def probe_results(self, env: Mapping[str, str]) -> Any:
        """The probe run in a fresh interpreter where only this backend's plugin is loaded."""
        record = self.registered().plugin
        others = {p.name for p in registry_of(tuple(sys.path)).plugins} - {record.name}
        return probe_run(self.backend, ",".join(sorted(others)), tuple(sorted(env.items())))

    def probe_environments(self) -> dict[str, dict[str, str]]:
        """Where the probe checks run: here, and under ``absent_env`` when it is set."""
        envs: dict[str, dict[str, str]] = {"this environment": {}}
        absent = {k: str(v) for k, v in parse_assumptions(self.absent_env, "absent_env").items()}
        if absent:
            shown = " ".join(f"{k}={v}" for k, v in absent.items())
            envs[f"device absent ({shown})"] = absent
        return envs

    def facts(self, assumed: Mapping[str, object] | None = None) -> RuntimeFacts:
        """Probed facts of this backend, plus ``assumed``; the device is assumed where absent."""
        spec = self.spec()
        facts = gather_facts({spec.name: spec})
        given: dict[str, object] = {}
        if not facts.devices[spec.name].available:
            given = {f"{spec.name}.available": True, f"{spec.name}.device_count": 2}
            given.update(parse_assumptions(self.assume, f"{type(self).__name__}.assume"))
        given.update(assumed or {})
        return apply_assumptions(facts, given, SOURCE) if given else facts

    def plan(self, facts: RuntimeFacts, *, plugins: bool = False, **overrides: object) -> Plan:
        """The rules' plan; with ``plugins``, also what resolve() adds: every installed plugin's
        policy proposals, the worker-setup plugins, the propagated names."""
        spec = self.spec()
        count = facts.devices[spec.name].device_count
        world = min(2, count) if spec.is_accelerator else 2
        values: dict[str, object] = {"backend": spec.name, "world_size": world, "executor": LOCAL}
        values.update(overrides)
        chosen = overrides_of(**values)
        draft = draft_plan({spec.name: spec}, facts, chosen)
        if plugins:
            settle(draft, registry_of(tuple(sys.path)), spec, chosen, os.environ, strict=True)
        return draft.freeze()

    def propagation_env(self) -> dict[str, str]:
        """One variable per ``propagate_env`` prefix, holding :data:`SECRET`; plain names are
        the user's, and are checked with their own values where set."""
        spec = self.spec()
        env = {
            p[:-1] + "HWLAUNCH_CONFORMANCE": SECRET for p in spec.propagate_env if p.endswith("*")
        }
        env.update({p: os.environ[p] for p in spec.propagate_env if p in os.environ})
        return env

    def rule_facts(self, *, initialized: bool = False, main_guard: str = "guarded") -> RuntimeFacts:
        """Facts for the rule checks: only the states named here, whatever this process is in."""
        return self.facts(
            {
                f"{self.backend}.initialized": initialized,
                "main_guard": main_guard,
                "in_ray_actor": False,
                "daemonic": False,
                "threads": "none",
            }
        )

    @staticmethod
    def default_method(spec: BackendSpec, offered: tuple[str, ...]) -> str:
        """What the rule gives before safety: the default, else the first allowed the OS offers."""
        rule = spec.start_methods
        if rule.default in offered:
            return rule.default
        return next(m for m in rule.allowed if m in offered)
