"""Plan policy: what plugins propose through ``hwlaunch_adjust_plan``, and which proposals hold.

Two steps, kept apart so that the rules stay pure. ``settle`` calls the plugins' hooks (plugin
code: the only impure part), which return their proposals as data; ``apply_to_draft`` accepts or
drops each one, writing only the draft of the plan (``planning.drafting``), from (spec,
overrides, environment names, proposals). Both run before the plan is frozen, so a Plan is made
once, with the plugins' part in it; the start method a plugin sets brings its fork warning and
its preload through the same functions the rules use (``fork_warning``, ``preload_decision``).
A proposal is dropped, with a warning naming the plugin, when the user set the value
(keyword, flag, ``HWLAUNCH_*``, config file; for ``env``, a variable of the driver's own
environment too), when it breaks the backend's start-method rule, or when an earlier plugin in
hook order already took the setting.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from hwlaunch._start_methods import kind_of
from hwlaunch.draft import PlanDraft, Proposal
from hwlaunch.errors import PluginError
from hwlaunch.plan import Plan
from hwlaunch.planning.drafting import Draft
from hwlaunch.planning.registry import ENV_STRICT, Registry
from hwlaunch.planning.settings import Overrides
from hwlaunch.planning.start_method import fork_warning, judge, preload_decision
from hwlaunch.planning.threads_budget import THREAD_VARS
from hwlaunch.spec import BackendSpec, StartMethod, select_env


def consulted(plugin_backends: Mapping[str, Sequence[str]], backend: str, name: str) -> bool:
    """A plugin that provides backends is consulted only for its own; one that provides none
    (a site policy plugin) for every backend."""
    own = plugin_backends.get(name, ())
    return not own or backend in own


class _Policy:
    """Applies proposals one by one to a draft; pure but for the draft it writes."""

    def __init__(
        self,
        draft: Draft,
        spec: BackendSpec,
        overrides: Overrides,
        environ_names: Collection[str],
        claimed: dict[str, str],
    ) -> None:
        self.draft = draft
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
            return
        self.draft.values[p.setting] = p.value
        shown = list(p.value) if p.setting == "preload" else p.value
        self.draft.decide(p.setting, shown, source, p.reason)

    def check_start_method(self, method: str) -> str | None:
        """Why the proposed method cannot hold, by the same check a user's request meets
        (``judge``); a fork that would only be risky is refused too, as the rules refuse it."""
        draft = self.draft
        if draft.start_kind is None:  # the executor uses no start method
            return f"the {draft.executor} executor starts no local processes"
        verdict = judge(self.spec, method, "a plugin's proposal", draft.facts)
        if verdict.error is not None:
            return verdict.why
        if verdict.risk is not None:
            return f"fork is unsafe: {verdict.risk}"
        return None

    def check_preload(self, _: tuple[str, ...]) -> str | None:
        kind = self.draft.start_kind
        if kind is None or not kind.fork_server:
            return f"only the fork server preloads, and the start method is {kind}"
        return None

    def set_start_method(self, method: StartMethod, source: str, reason: str) -> None:
        """The plugin's method, and what follows from it: the backend's fork warning, and the
        fork server's preload when the method gains or loses a fork server."""
        draft, before = self.draft, self.draft.start_kind
        draft.values["start_method"] = method
        draft.decide("start_method", method, source, reason)
        fork_warning(self.spec, method, self.warnings)
        if before is not None and kind_of(method).fork_server == before.fork_server:
            return
        preload = preload_decision(self.spec, method)
        draft.values["preload"] = () if preload is None else tuple(preload.value)
        if preload is None:
            draft.forget("preload")
        else:
            draft.decide(preload.setting, preload.value, preload.source, preload.reason)

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
            elif key in THREAD_VARS and self.draft.values["cpu_threads"] is not None:
                self.drop(one, f"{key} is the thread budget's (set cpu_threads instead)")
            elif key in self.environ_names:
                self.drop(one, f"{key} is set in the driver's environment")
            elif not self.taken(one, f"env {key}"):
                self.claimed[f"env {key}"] = p.plugin
                accepted[key] = value
        if accepted:
            self.add_env(p, accepted)

    def add_env(self, p: Proposal, accepted: dict[str, str]) -> None:
        draft = self.draft
        env = {**draft.values["env"], **accepted}
        old = next((d for d in draft.decisions if d.setting == "env"), None)
        base_source = old.source if old is not None and old.source != "none" else ""
        source = " + ".join(filter(None, (base_source, f"plugin {p.plugin}")))
        reason = f"{old.reason if old else 'extra environment for workers'}; plugin {p.plugin} "
        reason += f"sets {', '.join(sorted(accepted))}: {p.reason}"
        draft.values["env"] = env
        draft.decide("env", env, source, reason)


def apply_to_draft(
    draft: Draft,
    spec: BackendSpec,
    overrides: Overrides,
    proposals: Sequence[Proposal],
    environ_names: Collection[str] = (),
    claimed: dict[str, str] | None = None,
) -> list[str]:
    """Every acceptable proposal applied to ``draft``; a warning for each dropped one."""
    policy = _Policy(draft, spec, overrides, environ_names, {} if claimed is None else claimed)
    # A plugin's start method first: whether its preload holds depends on it.
    for p in sorted(proposals, key=lambda p: p.setting != "start_method"):
        policy.apply(p)
    return policy.warnings


def apply_proposals(
    plan: Plan,
    spec: BackendSpec,
    overrides: Overrides,
    proposals: Sequence[Proposal],
    environ_names: Collection[str] = (),
    claimed: dict[str, str] | None = None,
) -> tuple[Plan, list[str]]:
    """``apply_to_draft`` for a frozen plan (table tests): the new plan and the warnings."""
    draft = Draft.of(plan)
    warnings = apply_to_draft(draft, spec, overrides, proposals, environ_names, claimed)
    return draft.freeze(), warnings


def settle(
    draft: Draft,
    registry: Registry,
    spec: BackendSpec,
    overrides: Overrides,
    environ: Mapping[str, str],
    strict: bool,
) -> None:
    """The plugins' part of a draft, before it is frozen: policy proposals, the worker-setup
    plugins, and the names of the variables that reach the workers from the driver's
    environment (never their values)."""
    owners = registry.plugin_backends()
    claimed: dict[str, str] = {}
    warnings: list[str] = []
    for impl in registry.hook_impls("hwlaunch_adjust_plan"):
        name = impl.plugin_name
        if not consulted(owners, spec.name, name):
            continue
        proposed = PlanDraft(draft, spec, name)
        try:
            registry.call(impl.plugin, "hwlaunch_adjust_plan", draft=proposed)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # as at registration: a plugin never breaks the caller
            text = f"plugin {name}: hwlaunch_adjust_plan raised {type(exc).__name__}: {exc}"
            if strict:
                raise PluginError(f"{text} (an error because {ENV_STRICT} is set)") from exc
            warnings.append(f"{text}; its proposals are ignored")
            continue
        warnings += apply_to_draft(
            draft, spec, overrides, proposed.proposals, frozenset(environ), claimed
        )
    setup = tuple(
        impl.plugin_name
        for impl in registry.hook_impls("hwlaunch_worker_setup")
        if consulted(owners, spec.name, impl.plugin_name)
    )
    _setup_and_names(draft, setup, environ)
    draft.notes.warnings += warnings


def _setup_and_names(draft: Draft, setup: tuple[str, ...], environ: Mapping[str, str]) -> None:
    """The worker-setup plugins and the propagated names (never values) as decisions."""
    draft.values["worker_setup"] = setup
    if setup:
        draft.decide(
            "worker_setup",
            list(setup),
            "plugins",
            "hwlaunch_worker_setup runs in every worker before init_device, in this order",
        )
    patterns = draft.values["propagate_env"]
    old = next((d for d in draft.decisions if d.setting == "propagate_env"), None)
    if patterns and old is not None:
        names = sorted(select_env(environ, patterns))
        draft.decide(
            old.setting, names, old.source, f"{old.reason}; patterns: {', '.join(patterns)}"
        )
