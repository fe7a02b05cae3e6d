"""Plan policy: what plugins propose through ``hwlaunch_adjust_plan``, and which proposals hold.

Two steps, kept apart so that the rules stay pure. ``collect`` calls the plugins' hooks (plugin
code: the only impure part) and returns their proposals as data; ``apply_proposals`` is a pure
function of (plan, spec, overrides, environment names, proposals) that accepts or drops each
one. A proposal is dropped, with a warning naming the plugin, when the user set the value
(keyword, flag, ``HWLAUNCH_*``, config file; for ``env``, a variable of the driver's own
environment too), when it breaks the backend's start-method rule, or when an earlier plugin in
hook order already took the setting.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from hwlaunch.draft import PlanDraft, Proposal
from hwlaunch.errors import PluginError
from hwlaunch.plan import Decision, Plan
from hwlaunch.planning.registry import ENV_STRICT, Registry
from hwlaunch.planning.settings import Overrides
from hwlaunch.planning.start_method import judge, preload_of
from hwlaunch.planning.threads_budget import THREAD_VARS
from hwlaunch.spec import BackendSpec, StartMethod, select_env


def consulted(plugin_backends: Mapping[str, Sequence[str]], backend: str, name: str) -> bool:
    """A plugin that provides backends is consulted only for its own; one that provides none
    (a site policy plugin) for every backend."""
    own = plugin_backends.get(name, ())
    return not own or backend in own


class _Policy:
    """Applies proposals one by one to a plan; pure."""

    def __init__(
        self,
        plan: Plan,
        spec: BackendSpec,
        overrides: Overrides,
        environ_names: Collection[str],
        claimed: dict[str, str],
    ) -> None:
        self.plan = plan
        self.spec = spec
        self.overrides = overrides
        self.environ_names = environ_names
        self.claimed = claimed  # setting (or "env KEY") -> the plugin that took it
        self.warnings: list[str] = []

    def drop(self, p: Proposal, why: str) -> None:
        self.warnings.append(f"plugin {p.plugin}: proposal {p.setting}={p.value!r} dropped: {why}")

    def taken(self, p: Proposal, key: str) -> bool:
        owner = self.claimed.get(key)
        if owner is not None and owner != p.plugin:
            self.drop(p, f"plugin {owner} (earlier in hook order) already set {key}")
            return True
        return False

    def decide(self, setting: str, value: Any, source: str, reason: str) -> None:
        new = Decision(setting, value, source, reason)
        old = self.plan.decisions
        if any(d.setting == setting for d in old):
            decisions = tuple(new if d.setting == setting else d for d in old)
        else:
            decisions = (*old, new)
        self.plan = replace(self.plan, decisions=decisions)

    def apply(self, p: Proposal) -> None:
        if p.setting == "env":
            self.env(p)
            return
        user = self.overrides.lookup(p.setting, self.spec.name)
        if user is not None:
            self.drop(p, f"the user set {p.setting}={user.value!r} ({user.source})")
            return
        if self.taken(p, p.setting):
            return
        why = getattr(self, f"check_{p.setting}", lambda _: None)(p.value)
        if why is not None:
            self.drop(p, why)
            return
        self.claimed[p.setting] = p.plugin
        source = f"plugin {p.plugin}"
        if p.setting == "start_method":
            self.set_start_method(p.value, source, p.reason)
        elif p.setting == "preload":
            self.plan = replace(self.plan, preload=p.value)
            self.decide("preload", list(p.value), source, p.reason)
        else:
            self.plan = replace(self.plan, **{p.setting: p.value})
            self.decide(p.setting, p.value, source, p.reason)

    def check_start_method(self, method: str) -> str | None:
        """Why the proposed method cannot hold, by the same check a user's request meets
        (``judge``); a fork that would only be risky is refused too, as the rules refuse it."""
        spec, plan = self.spec, self.plan
        assert plan.facts is not None
        if plan.start_method is None:  # the executor uses no start method
            return f"the {plan.executor} executor starts no local processes"
        verdict = judge(spec, method, "a plugin's proposal", plan.facts)
        if verdict.error is not None:
            return verdict.why
        if verdict.risk is not None:
            return f"fork is unsafe: {verdict.risk}"
        return None

    def check_preload(self, _: tuple[str, ...]) -> str | None:
        if self.plan.start_method != "forkserver":
            return (
                f"only the fork server preloads, and the start method is {self.plan.start_method}"
            )
        return None

    def set_start_method(self, method: StartMethod, source: str, reason: str) -> None:
        plan = self.plan
        self.plan = replace(plan, start_method=method)
        self.decide("start_method", method, source, reason)
        if method == "fork" and self.spec.start_methods.fork_warning:
            self.warnings.append(
                f"backend {self.spec.name}: {self.spec.start_methods.fork_warning}"
            )
        if method == "forkserver" and plan.start_method != "forkserver":
            preload = preload_of(self.spec)
            self.plan = replace(self.plan, preload=preload)
            self.decide(
                "preload",
                list(preload),
                f"rule of backend {self.spec.name}",
                "imported once by the fork server so workers start fast",
            )
        elif method != "forkserver" and plan.start_method == "forkserver":
            self.plan = replace(
                self.plan,
                preload=(),
                decisions=tuple(d for d in self.plan.decisions if d.setting != "preload"),
            )

    def env(self, p: Proposal) -> None:
        config = self.overrides.config
        user: dict[str, str] = {}
        if config is not None:
            for layer in (config.env, config.backend_env.get(self.spec.name)):
                if layer is not None:
                    user.update(dict.fromkeys(layer.value, layer.source))
        accepted: dict[str, str] = {}
        for key, value in p.value.items():
            one = Proposal(p.plugin, "env", {key: value}, p.reason)
            if key in user:
                self.drop(one, f"the user set {key} ({user[key]})")
            elif key in THREAD_VARS and self.plan.cpu_threads is not None:
                self.drop(one, f"{key} is the thread budget's (set cpu_threads instead)")
            elif key in self.environ_names:
                self.drop(one, f"{key} is set in the driver's environment")
            elif not self.taken(one, f"env {key}"):
                self.claimed[f"env {key}"] = p.plugin
                accepted[key] = value
        if not accepted:
            return
        env = {**self.plan.env, **accepted}
        old = next((d for d in self.plan.decisions if d.setting == "env"), None)
        base_source = old.source if old is not None and old.source != "none" else ""
        source = " + ".join(filter(None, (base_source, f"plugin {p.plugin}")))
        reason = f"{old.reason if old else 'extra environment for workers'}; plugin {p.plugin} "
        reason += f"sets {', '.join(sorted(accepted))}: {p.reason}"
        self.plan = replace(self.plan, env=env)
        self.decide("env", env, source, reason)


def apply_proposals(
    plan: Plan,
    spec: BackendSpec,
    overrides: Overrides,
    proposals: Sequence[Proposal],
    environ_names: Collection[str] = (),
    claimed: dict[str, str] | None = None,
) -> tuple[Plan, list[str]]:
    """The plan with every acceptable proposal applied, and a warning for each dropped one."""
    policy = _Policy(plan, spec, overrides, environ_names, {} if claimed is None else claimed)
    # A plugin's start method first: whether its preload holds depends on it.
    for p in sorted(proposals, key=lambda p: p.setting != "start_method"):
        policy.apply(p)
    return policy.plan, policy.warnings


def adjust(
    plan: Plan,
    registry: Registry,
    spec: BackendSpec,
    overrides: Overrides,
    environ: Mapping[str, str],
    strict: bool,
) -> Plan:
    """The plugins' part of a plan: policy proposals, the worker-setup plugins, and the names of
    the variables that reach the workers from the driver's environment (never their values)."""
    owners = registry.plugin_backends()
    claimed: dict[str, str] = {}
    warnings: list[str] = []
    for impl in registry.hook_impls("hwlaunch_adjust_plan"):
        name = impl.plugin_name
        if not consulted(owners, spec.name, name):
            continue
        draft = PlanDraft(plan, spec, name)
        try:
            registry.call(impl.plugin, "hwlaunch_adjust_plan", draft=draft)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # as at registration: a plugin never breaks the caller
            text = f"plugin {name}: hwlaunch_adjust_plan raised {type(exc).__name__}: {exc}"
            if strict:
                raise PluginError(f"{text} (an error because {ENV_STRICT} is set)") from exc
            warnings.append(f"{text}; its proposals are ignored")
            continue
        plan, dropped = apply_proposals(
            plan, spec, overrides, draft.proposals, frozenset(environ), claimed
        )
        warnings += dropped
    setup = tuple(
        impl.plugin_name
        for impl in registry.hook_impls("hwlaunch_worker_setup")
        if consulted(owners, spec.name, impl.plugin_name)
    )
    return _with_setup_and_names(plan, setup, environ, warnings)


def _with_setup_and_names(
    plan: Plan, setup: tuple[str, ...], environ: Mapping[str, str], warnings: list[str]
) -> Plan:
    """The worker-setup plugins and the propagated names (never values) as decisions."""
    decisions = list(plan.decisions)
    if setup:
        decisions.append(
            Decision(
                "worker_setup",
                list(setup),
                "plugins",
                "hwlaunch_worker_setup runs in every worker before init_device, in this order",
            )
        )
    if plan.propagate_env:
        names = sorted(select_env(environ, plan.propagate_env))
        decisions = [
            Decision(
                d.setting, names, d.source, f"{d.reason}; patterns: {', '.join(plan.propagate_env)}"
            )
            if d.setting == "propagate_env"
            else d
            for d in decisions
        ]
    return replace(
        plan,
        decisions=tuple(decisions),
        worker_setup=setup,
        warnings=tuple(dict.fromkeys((*plan.warnings, *warnings))),
    )
