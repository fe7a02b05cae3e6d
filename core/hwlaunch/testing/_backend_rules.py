"""The checks of a backend's rules: registration, spec, probes, the start-method rule, the
resolver's plan against it, and contract 1's policy, binding and propagated names. Pure
planning and fresh interpreters: no worker starts here.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import statistics
import subprocess
import sys

import pytest

from hwlaunch._start_methods import FORK, kind_of
from hwlaunch.errors import MissingMainGuardError, StartMethodError
from hwlaunch.planning.rules import LOCAL, SINGLE
from hwlaunch.spec import START_METHODS
from hwlaunch.testing._backend_setup import (
    ALWAYS_FORBIDDEN,
    PROBE_CALLS,
    PROBES,
    SECRET,
    BackendSetup,
    documented_visibility,
    matches,
    run_python,
    same_fields,
)

__all__ = ["RuleChecks"]


class RuleChecks(BackendSetup):
    """The rule checks of ``BackendConformance``."""

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
        result = run_python("worker", json.dumps(sys.path), spec.worker)
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
                    if name not in allowed and any(matches(m, (name,)) for m in result[step])
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
        same_fields(
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
            expected = documented_visibility(spec, rank, 2, None, facts)
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
