"""hwlaunch.testing: the conformance suite a backend plugin runs from its own pytest suite.

Subclass :class:`BackendConformance` in a test module and name the backend::

    from hwlaunch.testing import BackendConformance

    class TestAcme(BackendConformance):
        backend = "acme"
        vendor_modules = ("acme_runtime",)  # the probes must never import these
        absent_env = ("ACME_NPU_DEVICES=0",)  # how to make the device absent, if you can

pytest collects the subclass (its name starts with ``Test``) and runs every check below against
the installed plugin: registration, spec validation, probes without side effects (in a fresh
interpreter, through ``sys.modules``) and fast, a consistent start-method rule, the resolver's
plan against the rule (with facts assumed where the hardware is absent), and the worker's
lifecycle under each executor of ``executors`` as its declared capabilities say (skipped, with
the reason, where the device is absent).

This module imports pytest; ``import hwlaunch`` never imports it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from hwlaunch._start_methods import FORK, kind_of
from hwlaunch.errors import MissingMainGuardError, StartMethodError
from hwlaunch.executor_spec import ExecutorSpec
from hwlaunch.plan import Plan
from hwlaunch.planning.facts import apply_assumptions, gather_facts, parse_assumptions
from hwlaunch.planning.policy import settle
from hwlaunch.planning.registry import ENV_BLOCK, RegisteredBackend, Registry, load_registry
from hwlaunch.planning.rules import LOCAL, SINGLE, draft_plan
from hwlaunch.planning.settings import Overrides, Sourced
from hwlaunch.runtime_facts import RuntimeFacts
from hwlaunch.spec import START_METHODS, BackendSpec
from hwlaunch.testing._capabilities import (
    lifecycle_cases,
    local_rank_of,
    own_processes,
    ray_cases,
    sets_binding,
    two_node_cluster,
    world_size_for,
)
from hwlaunch.worker import Worker

__all__ = ["BackendConformance", "LifecycleProbe"]

PROBES = ("is_available", "device_count", "is_initialized")
ALWAYS_FORBIDDEN = ("torch", "ray")  # never imported by loading a plugin or calling its probes
PROBE_CALLS = 7  # calls of each probe; the median is held to the budget
SOURCE = "hwlaunch.testing"
MARKER_VAR = "HWLAUNCH_CONFORMANCE_MARKERS"  # where LifecycleProbe records each rank's shutdown
PROPAGATED_VAR = "HWLAUNCH_CONFORMANCE_PROPAGATED"  # names LifecycleProbe reports the values of
SECRET = "hwlaunch-conformance-secret-7f3a"  # set in propagated variables; never in plan output
RPC_TIMEOUT = 120.0


# -- what runs inside the workers ----------------------------------------------------------------


class LifecycleProbe(Worker):
    """Worker extension mixed in front of the backend's worker class by the lifecycle checks.

    It reports what the worker looks like after start-up, and records (in a file per rank) that
    ``shutdown()`` ran, whether it raised, and whether it left the process group.
    """

    def conformance_report(self) -> dict[str, Any]:
        import torch.distributed as dist

        from hwlaunch.executor._runtime import import_object

        joined = bool(dist.is_available() and dist.is_initialized())
        var = self.plan.device_control_env_var
        names = self.plan.env.get(PROPAGATED_VAR, "")
        return {
            "pid": os.getpid(),
            "setup_plugins": list(self.setup_plugins),
            "propagated": {n: os.environ.get(n) for n in names.split(",") if n},
            "ray_noset": os.environ.get(self.plan.ray_noset_visibility_var or "", None),
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "is_backend_worker": isinstance(self, import_object(self.plan.worker)),
            "device": None if self.device is None else str(self.device),
            "dist_initialized": joined,
            "dist_backend": str(dist.get_backend()) if joined else None,
            "visible": os.environ.get(var) if var else None,
        }

    def shutdown(self) -> None:
        error: str | None = None
        try:
            super().shutdown()
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            dist = sys.modules.get("torch.distributed")
            joined = bool(dist is not None and dist.is_available() and dist.is_initialized())
            folder = self.plan.env.get(MARKER_VAR)
            if folder:
                marker = Path(folder, f"rank{self.rank}.json")
                marker.write_text(json.dumps({"error": error, "dist_initialized": joined}))
            if joined and dist is not None:  # recorded; now leave, so the next test starts clean
                dist.destroy_process_group()


def _documented_visibility(
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


def _run_python(*args: str, env: Mapping[str, str] | None = None) -> Any:
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
def _registry(path: tuple[str, ...]) -> Registry:
    """Every plugin, unfiltered and not strict: the suite checks one backend, whatever else is
    installed (or excluded by this shell's HWLAUNCH_* variables)."""
    return load_registry(environ={}, strict=False)


@functools.lru_cache(maxsize=16)
def _probe_run(backend: str, blocked: str, env: tuple[tuple[str, str], ...]) -> Any:
    """Load the plugins not ``blocked`` (only the backend's own) and call every probe of
    ``backend`` several times, in a fresh interpreter with ``env`` added."""
    args = {
        "path": list(sys.path),
        "environ": {ENV_BLOCK: blocked} if blocked else {},
        "backend": backend,
        "probes": list(PROBES),
        "calls": PROBE_CALLS,
    }
    return _run_python("probe", json.dumps(args), env=dict(env))


def _matches(module: str, names: tuple[str, ...]) -> bool:
    return any(module == name or module.startswith(name + ".") for name in names)


def _same(what: str, got: Mapping[str, object], expected: Mapping[str, object]) -> None:
    """Assert field by field with a message that names each difference (this module's asserts
    are not rewritten by pytest, so every assert carries its own message)."""
    wrong = [f"{k} is {got[k]!r}, expected {v!r}" for k, v in expected.items() if got[k] != v]
    assert not wrong, f"{what}: " + "; ".join(wrong)


def _overrides(**values: object) -> Overrides:
    explicit = {k: Sourced(v, f"{SOURCE} {k}={v}") for k, v in values.items() if v is not None}
    return Overrides(explicit=explicit)


class BackendConformance:
    """Conformance checks for one backend; subclass it as ``Test<Name>`` and set ``backend``.

    Class attributes to set:

    ``backend``
        The backend name, as the plugin registers it (required).
    ``assume``
        Facts assumed for the resolver checks when the device is absent, as ``--assume`` takes
        them: ``("acme.device_count=8",)`` (or a mapping); added to ``<backend>.available=true``
        and ``<backend>.device_count=2``.
    ``executors``
        The executors whose worker lifecycle is checked: ``("uni", "mp", "ray")`` by default;
        add your own executor's name to check your backend under it. What runs comes from each
        executor's declared capabilities, never its name: every start method the backend
        allows for one that declares ``start_method``, a real two-node cluster on 127.0.0.1
        for one that declares ``ray`` (skipped where Ray is not installed).
    ``vendor_modules``
        The vendor's runtime modules; like torch and Ray, the probes must not import them.
    ``absent_env``
        Environment variables under which the device is absent, if the plugin has such a
        switch, e.g. ``("ACME_NPU_DEVICES=0",)`` (or a mapping): the probe checks run there too.
    ``probe_imports_when_present``
        Modules the probes may import when the device is present (a cheap pre-check found it,
        so asking the runtime is allowed); never allowed where the device is absent.
    ``probe_budget_s``
        The median time one probe call may take (default 50 ms).
    """

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
        specs = _registry(tuple(sys.path)).executor_specs
        owner = type(self).__name__
        if "lifecycle_executor" in metafunc.fixturenames:
            cases = lifecycle_cases(self.executors, specs, owner)
            metafunc.parametrize(("lifecycle_executor", "lifecycle_method"), cases)
        if "ray_executor" in metafunc.fixturenames:
            cases = ray_cases(self.executors, specs, owner)
            metafunc.parametrize("ray_executor", cases)

    def executor_spec(self, name: str) -> ExecutorSpec:
        """The executor as a plugin registered it; fails with the registered names otherwise."""
        specs = _registry(tuple(sys.path)).executor_specs
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
        registry = _registry(tuple(sys.path))
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
        others = {p.name for p in _registry(tuple(sys.path)).plugins} - {record.name}
        return _probe_run(self.backend, ",".join(sorted(others)), tuple(sorted(env.items())))

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
        chosen = _overrides(**values)
        draft = draft_plan({spec.name: spec}, facts, chosen)
        if plugins:
            settle(draft, _registry(tuple(sys.path)), spec, chosen, os.environ, strict=True)
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

    # -- registration and the spec -------------------------------------------------------------
    def test_plugin_is_registered(self) -> None:
        entry = self.registered()
        assert entry.plugin.error is None, f"{entry.plugin.describe()}: {entry.plugin.error}"
        assert "hwlaunch_register_backends" in entry.plugin.hooks, entry.plugin.hooks
        assert entry.plugin.distribution is not None, (
            f"plugin {entry.plugin.name!r} has no distribution: install it (pip install -e .)"
        )

    def test_spec_validates(self) -> None:
        import importlib.util

        spec = self.spec()
        dataclasses.replace(spec)  # runs BackendSpec's validation of every field again
        module = spec.worker.partition(":")[0]
        assert importlib.util.find_spec(module) is not None, (
            f"worker module {module!r} of {spec.worker!r} cannot be found"
        )

    def test_worker_class_imports_in_a_fresh_process(self) -> None:
        spec = self.spec()
        result = _run_python("worker", json.dumps(sys.path), spec.worker)
        assert result["is_worker"], f"{spec.worker} is not a subclass of hwlaunch.Worker"

    # -- probes --------------------------------------------------------------------------------
    def test_probes_are_side_effect_free(self) -> None:
        """No device initialized, no torch/Ray/vendor import, the worker module not imported."""
        spec = self.spec()
        plugin_module = self.registered().plugin.module.partition(":")[0]
        worker_module = spec.worker.partition(":")[0]
        for where, env in self.probe_environments().items():
            result = self.probe_results(env)
            present = bool(result["values"]["is_available"])
            if where != "this environment":
                assert not present, f"{self.backend} reports a device with {where}"
            assert not result["initialized_after"], (
                f"{where}: is_initialized() is true after the probes ran in a fresh process, so "
                "a probe initialized the device runtime"
            )
            assert not result["values"]["is_initialized"], (
                f"{where}: is_initialized() is true in a fresh process"
            )
            forbidden = (*ALWAYS_FORBIDDEN, *self.vendor_modules)
            for step in ("loaded", "probed"):
                allowed = self.probe_imports_when_present if present and step == "probed" else ()
                bad = [
                    name
                    for name in forbidden
                    if name not in allowed and any(_matches(m, (name,)) for m in result[step])
                ]
                doing = "loading the plugin" if step == "loaded" else "the probes"
                assert not bad, (
                    f"{where}: {doing} imported {bad}; probes must stay cheap: pre-check with "
                    "hwlaunch.probes (module_imported, module_installed, device_nodes) and import "
                    "only inside workers"
                )
            if worker_module != plugin_module:
                imported = [*result["loaded"], *result["probed"]]
                assert worker_module not in imported, (
                    f"{where}: the worker module {worker_module!r} was imported outside a worker"
                )

    def test_probes_are_fast(self) -> None:
        for where, env in self.probe_environments().items():
            times = self.probe_results(env)["times"]
            for probe in PROBES:
                median = statistics.median(times[probe])
                assert median < self.probe_budget_s, (
                    f"{where}: {probe}() takes {median * 1000:.1f} ms (median of {PROBE_CALLS} "
                    f"calls, first {times[probe][0] * 1000:.1f} ms); the budget is "
                    f"{self.probe_budget_s * 1000:.0f} ms: cache what is slow to find out"
                )

    # -- the rule ------------------------------------------------------------------------------
    def test_rule_is_consistent(self) -> None:
        rule = self.spec().start_methods
        offered = tuple(multiprocessing.get_all_start_methods())
        assert set(rule.allowed) <= set(START_METHODS), f"unknown methods in {rule.allowed}"
        assert rule.default in rule.allowed, f"default {rule.default!r} not in {rule.allowed}"
        if rule.fallback is not None:
            assert rule.fallback in rule.allowed and not kind_of(rule.fallback).copies_parent, (
                f"fallback {rule.fallback!r} must be an allowed method other than fork"
            )
        if rule.fork_unsafe_after_init and FORK.name in rule.allowed:
            assert rule.fallback is not None, "fork can become unsafe, but there is no fallback"
        if rule.fork_warning is not None:
            assert FORK.name in rule.allowed, "fork_warning is set but fork is not allowed"
        assert any(m in offered for m in rule.allowed), (
            f"this OS offers {list(offered)}, none of the allowed {list(rule.allowed)}"
        )

    # -- the resolver's plan -------------------------------------------------------------------
    def test_plan_follows_the_rule(self) -> None:
        spec = self.spec()
        facts = self.rule_facts()
        plan = self.plan(facts)
        _same(
            f"the plan for backend {spec.name}\n{plan.explain()}",
            {**plan.to_dict(), "source": plan.decision("start_method").source},
            {
                "backend": spec.name,
                "executor": LOCAL,  # the rules' choice for local workers
                "start_method": self.default_method(spec, facts.os_start_methods),
                "source": f"rule of backend {spec.name}",
                "dist_backend": spec.dist_backend,
                "worker": spec.worker,
                "device_control_env_var": spec.device_control_env_var,
                "ray_resource": spec.ray_resource,
            },
        )
        assert dict(spec.worker_env).items() <= plan.env.items(), f"worker_env missing: {plan.env}"
        if plan.start_kind is not None and plan.start_kind.fork_server:
            assert spec.worker.partition(":")[0] in plan.preload, f"preload: {plan.preload}"
        single = self.plan(facts, world_size=1, executor=None)
        assert single.executor == SINGLE, f"world size 1 gave executor {single.executor!r}"

    def test_plan_when_fork_is_unsafe(self) -> None:
        spec = self.spec()
        rule = spec.start_methods
        facts = self.rule_facts(initialized=True)
        offered = facts.os_start_methods
        default = self.default_method(spec, offered)
        if not (rule.fork_unsafe_after_init and FORK.name in rule.allowed):
            assert self.plan(facts).start_method == default, (
                "the rule does not make fork unsafe after init, yet an initialized device "
                "changed the plan"
            )
            return
        if FORK.name not in offered:
            pytest.skip("this OS does not offer fork")
        if kind_of(default).copies_parent:
            plan = self.plan(facts)
            assert plan.start_method == rule.fallback, (
                f"the device is initialized, so fork is unsafe: expected the fallback "
                f"{rule.fallback!r}, got {plan.start_method!r}\n{plan.explain()}"
            )
            assert any("instead of fork" in w for w in plan.warnings), plan.warnings
        with pytest.raises(StartMethodError, match="cannot work"):
            self.plan(facts, start_method=FORK.name)

    def test_plan_honours_each_allowed_method(self) -> None:
        spec = self.spec()
        facts = self.rule_facts()
        for method in spec.start_methods.allowed:
            if method not in facts.os_start_methods:
                continue
            plan = self.plan(facts, start_method=method)
            assert plan.start_method == method, (
                f"{method!r} requested, {plan.start_method!r} planned"
            )
            if kind_of(method).copies_parent and spec.start_methods.fork_warning:
                warned = any(spec.start_methods.fork_warning in w for w in plan.warnings)
                assert warned, f"fork_warning missing from {plan.warnings}"

    def test_plan_refuses_a_disallowed_method(self) -> None:
        spec = self.spec()
        facts = self.rule_facts()
        refused = [
            m
            for m in START_METHODS
            if m not in spec.start_methods.allowed and m in facts.os_start_methods
        ]
        if not refused:
            pytest.skip(f"backend {spec.name} allows every start method this OS offers")
        for method in refused:
            with pytest.raises(StartMethodError, match="not allowed by the rule of backend"):
                self.plan(facts, start_method=method)

    def test_plan_for_an_unguarded_main(self) -> None:
        """spawn/forkserver re-import __main__: fork if the rule allows it safely, else an error."""
        spec = self.spec()
        rule = spec.start_methods
        facts = self.rule_facts(main_guard="unguarded")
        offered = facts.os_start_methods
        fork_ok = FORK.name in rule.allowed and FORK.name in offered
        default = self.default_method(spec, offered)
        if fork_ok or kind_of(default).copies_parent:
            plan = self.plan(facts)
            assert plan.start_kind is FORK, (
                f"unguarded main: expected fork, got {plan.start_method!r}\n{plan.explain()}"
            )
            if kind_of(default).reimports_main:
                assert any("guard" in w for w in plan.warnings), plan.warnings
        else:
            with pytest.raises(MissingMainGuardError, match="__main__"):
                self.plan(facts)
        for method in rule.allowed:
            if kind_of(method).reimports_main and method in offered:
                with pytest.raises(MissingMainGuardError):
                    self.plan(facts, start_method=method)

    # -- the worker lifecycle ------------------------------------------------------------------
    def run_lifecycle(
        self,
        executor: str,
        method: str | None,
        markers: Path,
        monkeypatch: pytest.MonkeyPatch,
        **extra: object,
    ) -> None:
        """Start the workers, check what they report and an all-reduce, shut them down."""
        from hwlaunch.executor.launcher import launch

        spec = self.spec()
        chosen = self.executor_spec(executor)
        facts = gather_facts({spec.name: spec})
        device = facts.devices[spec.name]
        if not device.available:
            why = f" (probe failed: {device.probe_error})" if device.probe_error else ""
            pytest.skip(
                f"no {spec.name} device on this machine{why}: the worker lifecycle needs the "
                "hardware; the rule and resolver checks ran with the device assumed"
            )
        if method is not None and not chosen.start_method:
            pytest.skip(f"executor {executor!r} does not declare start_method")
        if method is not None and method not in spec.start_methods.allowed:
            pytest.skip(f"backend {spec.name} does not allow start method {method!r}")
        if method is not None and method not in facts.os_start_methods:
            pytest.skip(f"this OS does not offer start method {method!r}")
        world = world_size_for(chosen, spec, device.device_count)
        propagated = self.propagation_env()
        for name, value in propagated.items():
            monkeypatch.setenv(name, value)
        parent_visible = os.environ.get(spec.device_control_env_var or "")
        try:
            plan = self.plan(
                facts,
                plugins=True,
                backend=spec.name,
                world_size=world,
                executor=executor,
                start_method=method,
                **extra,
            )
        except StartMethodError as exc:
            if method is not None and kind_of(method).copies_parent and device.initialized:
                pytest.skip(f"fork is unsafe in this test process: {exc}")
            raise
        plan = dataclasses.replace(
            plan, env={**plan.env, MARKER_VAR: str(markers), PROPAGATED_VAR: ",".join(propagated)}
        )
        with launch(plan, worker_extension=LifecycleProbe, startup_timeout=RPC_TIMEOUT) as workers:
            reports = workers.collective_rpc("conformance_report", timeout=RPC_TIMEOUT)
            sums = workers.collective_rpc("all_reduce_rank", timeout=RPC_TIMEOUT)
            workers.check_health()
        self.check_lifecycle(plan, reports, sums, markers)
        visible = [
            _documented_visibility(spec, r, world, parent_visible, facts) for r in range(world)
        ]
        self.check_contract(plan, chosen, reports, visible, propagated)

    def check_contract(
        self,
        plan: Plan,
        executor: ExecutorSpec,
        reports: list[Any],
        visible: list[str | None],
        propagated: dict[str, str],
    ) -> None:
        """Contract v1 in the workers, as the executor's capabilities promise: the binding's
        variable where hwlaunch sets it, each setup hook once per worker, the propagated
        variables, Ray's opt-out variable (``ray``), one process per rank (not ``in_process``)."""
        spec, world = self.spec(), plan.world_size
        for rank, report in enumerate(reports):
            if sets_binding(executor):
                assert report["visible"] == visible[rank], (
                    f"rank {rank}: {spec.device_control_env_var} is {report['visible']!r}; binding "
                    f"{spec.device_binding!r} documents {visible[rank]!r}"
                )
            assert report["setup_plugins"] == list(plan.worker_setup), (
                f"rank {rank}: hwlaunch_worker_setup ran for {report['setup_plugins']}, expected "
                f"once for each of {list(plan.worker_setup)}"
            )
            assert report["propagated"] == propagated, (
                f"rank {rank}: propagated variables arrived as {report['propagated']}, "
                f"expected {propagated}"
            )
        if executor.ray and plan.ray_noset_visibility_var:
            noset = [r["ray_noset"] for r in reports]
            assert noset == ["1"] * world, f"{plan.ray_noset_visibility_var} in the actors: {noset}"
        if own_processes(executor):
            pids = [r["pid"] for r in reports]
            assert len(set(pids)) == world and os.getpid() not in pids, (
                f"worker pids {pids}, this process {os.getpid()}: executor {executor.name!r} "
                "does not declare in_process, so each rank must run in a process of its own"
            )

    def check_lifecycle(
        self, plan: Plan, reports: list[Any], sums: list[Any], markers: Path
    ) -> None:
        """What every rank reported after start-up, the all-reduce, and its shutdown marker."""
        world = plan.world_size
        for rank, report in enumerate(reports):
            expected = {"rank": rank, "world_size": world, "is_backend_worker": True}
            local = local_rank_of(rank, world, plan.nnodes)
            if local is not None:  # the ranks of a node are contiguous
                expected["local_rank"] = local
            _same(f"rank {rank} after start-up", report, expected)
            assert report["device"] is not None, "init_device() must set self.device"
            assert report["dist_initialized"], "init_distributed() did not join a process group"
            assert report["dist_backend"] == plan.dist_backend, (
                f"rank {rank} joined a {report['dist_backend']!r} group, not {plan.dist_backend!r}"
            )
        assert sums == [world * (world - 1) // 2] * world, f"all-reduce of rank ids gave {sums}"
        for rank in range(world):
            marker = markers / f"rank{rank}.json"
            assert marker.is_file(), f"rank {rank}: shutdown() was not called"
            ended = json.loads(marker.read_text())
            assert ended["error"] is None, f"rank {rank}: shutdown() raised {ended['error']}"
            assert not ended["dist_initialized"], (
                f"rank {rank}: shutdown() did not leave the process group (call super().shutdown())"
            )

    def test_lifecycle(
        self,
        lifecycle_executor: str,
        lifecycle_method: str | None,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """Each executor of ``executors`` that starts workers here, under each start method the
        backend allows where it declares ``start_method``."""
        self.run_lifecycle(lifecycle_executor, lifecycle_method, tmp_path, monkeypatch)

    def test_lifecycle_ray_two_nodes(
        self, ray_executor: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Two ranks on two Ray nodes (a real cluster on 127.0.0.1), for each executor of
        ``executors`` that declares ``ray``: setup once per actor, and the propagated variables
        arrive through Ray's runtime environment, not inheritance (they are set only after the
        nodes started)."""
        spec = self.spec()
        if not gather_facts({spec.name: spec}).devices[spec.name].available:
            pytest.skip(f"no {spec.name} device on this machine")
        with two_node_cluster(spec) as address:
            self.run_lifecycle(
                ray_executor, None, tmp_path, monkeypatch, nnodes=2, ray_address=address
            )

    # -- contract v1: policy, binding, propagated names ---------------------------------------
    def test_policy_proposals_respect_the_rule(self) -> None:
        """Whatever the installed plugins propose, the plan still obeys the backend's rule and
        keeps what the user set."""
        spec = self.spec()
        rule = spec.start_methods
        for initialized, guard in ((False, "guarded"), (True, "guarded"), (False, "unguarded")):
            facts = self.rule_facts(initialized=initialized, main_guard=guard)
            offered = [m for m in rule.allowed if m in facts.os_start_methods]
            for method in (None, *offered):
                try:
                    plan = self.plan(facts, plugins=True, start_method=method)
                except StartMethodError:
                    continue  # the rules refuse it; the rule checks above cover that
                where = f"(initialized={initialized}, main {guard}, start_method={method})"
                assert plan.start_method in rule.allowed, f"{where}: {plan.start_method}"
                if method is not None:
                    assert plan.start_method == method, f"{where}: user's {method} overridden"
                kind, asked = plan.start_kind, None if method is None else kind_of(method)
                assert kind is not None, f"{where}: the mp executor without a start method"
                if guard == "unguarded":
                    assert not kind.reimports_main, f"{where}: {kind} re-imports"
                if initialized and rule.fork_unsafe_after_init and asked is not FORK:
                    assert not kind.copies_parent, f"{where}: fork after device init"
                for d in plan.decisions:
                    if d.source.startswith("plugin "):
                        assert d.reason.strip(), (
                            f"{where}: {d.setting} from {d.source} has no reason"
                        )

    def test_binding_sets_documented_variables(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """What each rank's visibility variable holds under the backend's device binding."""
        from hwlaunch.executor.base import worker_environment

        spec = self.spec()
        if spec.device_control_env_var:
            monkeypatch.delenv(spec.device_control_env_var, raising=False)
        facts = self.facts({f"{spec.name}.available": True, f"{spec.name}.device_count": 4})
        plan = self.plan(facts, world_size=2)
        assert plan.device_binding == spec.device_binding
        for rank in range(2):
            env = worker_environment(plan, rank, rank, "127.0.0.1", 1)
            var = spec.device_control_env_var
            got = env.get(var) if var else None
            expected = _documented_visibility(spec, rank, 2, None, facts)
            assert got == expected, f"rank {rank}: {var}={got!r}, binding documents {expected!r}"

    def test_propagated_values_never_in_plan_output(self, monkeypatch: pytest.MonkeyPatch) -> None:
        spec = self.spec()
        env = {k: v for k, v in self.propagation_env().items() if v == SECRET}
        if not env:
            pytest.skip(f"backend {spec.name} declares no propagate_env prefix")
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        plan = self.plan(self.facts(), plugins=True)
        shown = plan.decision("propagate_env").value
        assert set(env) <= set(shown), f"propagate_env decision lists {shown}, not {sorted(env)}"
        for text in (plan.explain(), json.dumps(plan.to_dict())):
            assert SECRET not in text, "a propagated variable's value appears in the plan"
        assumed = [f"{k}={v}" for k, v in {f"{spec.name}.available": "true"}.items()]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "hwlaunch.cli",
                "resolve",
                "--backend",
                spec.name,
                "--json",
                *(a for item in assumed for a in ("--assume", item)),
            ],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert SECRET not in done.stdout + done.stderr, "a propagated value appears in --json"
