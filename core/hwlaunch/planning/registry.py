"""The backend registry: entry points in, validated BackendSpecs out.

Every plugin, built-in or third-party, is found through the entry-point group
``hwlaunch.backends`` and loaded in isolation: an import error, an exception (even SystemExit)
in its module or its hook, a missing hook, an invalid spec, or a backend name or entry-point name
that another plugin already took marks that plugin as failed (with the reason) and never breaks
the others, unless ``HWLAUNCH_STRICT_PLUGINS=1`` asks for errors.
"""

from __future__ import annotations

import difflib
import os
import sys
import traceback
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint
from typing import Any, TypeVar

import pluggy

from hwlaunch import contract, hookspecs
from hwlaunch._checks import (
    FALSE_WORDS,
    TRUE_WORDS,
    did_you_mean,
    parse_truthy,
    unknown_name_message,
)
from hwlaunch._discovery import (
    ENV_ALLOW,
    ENV_BLOCK,
    ENV_STRICT,
    OWN_DISTRIBUTION,
    SlowLoads,
    select_plugins,
)
from hwlaunch._hooks import call_plugin_hook, wrapper_hooks
from hwlaunch.errors import BackendUnavailableError, ConfigError, PluginError
from hwlaunch.executor_spec import ExecutorSpec
from hwlaunch.spec import BackendSpec, backend_aliases

__all__ = ["ENV_ALLOW", "ENV_BLOCK", "ENV_STRICT", "OWN_DISTRIBUTION", "Registry", "load_registry"]
T = TypeVar("T")
CONTRACT_ATTRIBUTE = "HWLAUNCH_CONTRACT"  # a plugin module's declared contract, if it has no spec
HOOKS = (
    "hwlaunch_register_backends",
    "hwlaunch_register_executors",
    "hwlaunch_adjust_plan",
    "hwlaunch_worker_setup",
)


@dataclass(frozen=True)
class PluginRecord:
    """One entry point of the group, loaded or failed."""

    name: str
    module: str
    distribution: str | None
    version: str | None
    backends: tuple[str, ...] = ()
    hooks: tuple[str, ...] = ()
    error: str | None = None
    contract: str = contract.CONTRACT_VERSION
    warnings: tuple[str, ...] = ()
    executors: tuple[str, ...] = ()

    @property
    def builtin(self) -> bool:
        return self.distribution == OWN_DISTRIBUTION

    def describe(self) -> str:
        dist = (
            f"{self.distribution} {self.version}" if self.distribution else "unknown distribution"
        )
        return f"plugin {self.name!r} ({dist})"


@dataclass(frozen=True)
class RegisteredBackend:
    """A backend in the registry: its validated spec and the plugin that registered it (for
    ``hwlaunch backends`` and for errors that name the plugin)."""

    spec: BackendSpec
    plugin: PluginRecord


@dataclass(frozen=True)
class RegisteredExecutor:
    """An executor spec and the plugin that registered it."""

    spec: ExecutorSpec
    plugin: PluginRecord


@dataclass
class Registry:
    """Backends by name, plus a record of every plugin considered (loaded or failed)."""

    backends: dict[str, RegisteredBackend] = field(default_factory=dict)
    executors: dict[str, RegisteredExecutor] = field(default_factory=dict)
    plugins: list[PluginRecord] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    manager: pluggy.PluginManager | None = None
    excluded: dict[str, str] = field(default_factory=dict)  # entry-point name -> variable
    selection_warnings: list[str] = field(default_factory=list)

    def hook_impls(self, hook: str) -> list[Any]:
        """pluggy's HookImpl of each loaded plugin implementing ``hook``, in the order pluggy
        calls them (tryfirst first, trylast last, later-loaded before earlier)."""
        if self.manager is None:
            return []
        return list(reversed(getattr(self.manager.hook, hook).get_hookimpls()))

    def call(self, plugin: object, hook: str, **kwargs: Any) -> None:
        """Call one plugin's implementations of ``hook`` through pluggy (see hwlaunch._hooks)."""
        if self.manager is not None:
            call_plugin_hook(self.manager, hook, plugin, **kwargs)

    def hook_order(self) -> dict[str, list[str]]:
        """For each hook, the plugins implementing it in call order."""
        return {hook: [impl.plugin_name for impl in self.hook_impls(hook)] for hook in HOOKS}

    def plugin_backends(self) -> dict[str, tuple[str, ...]]:
        return {p.name: p.backends for p in self.plugins if p.error is None}

    @property
    def specs(self) -> dict[str, BackendSpec]:
        return {name: b.spec for name, b in self.backends.items()}

    @property
    def executor_specs(self) -> dict[str, ExecutorSpec]:
        return {name: e.spec for name, e in self.executors.items()}

    @property
    def failures(self) -> list[PluginRecord]:
        return [p for p in self.plugins if p.error is not None]

    def get(self, name: str) -> BackendSpec:
        """The spec named ``name``; a KeyError-like error lists the known names otherwise."""
        if name in self.backends:
            return self.backends[name].spec
        raise BackendUnavailableError(self.unknown_backend(name))

    def unknown_backend(self, name: str, source: str = "") -> str:
        """Why ``name`` is no registered backend: a plugin of that name that the plugin
        variables excluded is named as such, else the known names and a did-you-mean."""
        if name in self.excluded and name not in self.backends:
            variable = self.excluded[name]
            fix = (
                f"remove it from {ENV_BLOCK}"
                if variable == ENV_BLOCK
                else f"add it to {ENV_ALLOW} (or unset {ENV_ALLOW} to load every plugin)"
            )
            where = f" from {source}" if source else ""
            return f"backend {name!r}{where} is installed but excluded by {variable}. Fix: {fix}"
        return unknown_name_message("backend", name, self.backends, backend_aliases(self.specs))


def strict_from_env(environ: Mapping[str, str]) -> bool:
    """Whether ``HWLAUNCH_STRICT_PLUGINS`` asks for strict mode; a value that is no yes or no
    word is an error rather than a silent "off"."""
    raw = environ.get(ENV_STRICT, "")
    if not raw.strip():
        return False
    value = parse_truthy(raw)
    if value is None:
        raise ConfigError(
            f"invalid {ENV_STRICT} {raw!r} from env {ENV_STRICT}"
            f"{did_you_mean(raw.strip(), (*TRUE_WORDS, *FALSE_WORDS))} (allowed: "
            f"{', '.join(TRUE_WORDS)} to make every plugin failure an error; "
            f"{', '.join(FALSE_WORDS)}, empty or unset to skip failed plugins; any case)"
        )
    return value


def load_registry(environ: Mapping[str, str] | None = None, strict: bool | None = None) -> Registry:
    """Discover, filter and load every plugin of the entry-point group."""
    env = os.environ if environ is None else environ
    strict = strict_from_env(env) if strict is None else strict
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    selection = select_plugins(env)
    registry = Registry(
        skipped=[f"{name} (excluded by {why})" for name, why in selection.excluded.items()],
        manager=manager,
        excluded=dict(selection.excluded),
        selection_warnings=list(selection.unmatched),
    )
    # importlib.metadata already lists a distribution once even when sys.path shows it twice,
    # so two entry points with one name come from two distributions: report, never drop one.
    by_name: dict[str, PluginRecord] = {}
    with SlowLoads() as loads:
        for ep in selection.chosen:
            if ep.name in by_name:
                record = _failed(_record_of(ep), _name_clash(by_name[ep.name], _record_of(ep)))
            else:
                with loads.loading(ep, _record_of(ep).describe()):
                    record = _load_plugin(manager, ep, registry)
                by_name[ep.name] = record
            registry.plugins.append(record)
            for text in record.warnings:
                warnings.warn(
                    f"{record.describe()}: {text}",
                    contract.HwlaunchDeprecationWarning,
                    stacklevel=2,
                )
    if strict and registry.failures:
        raise PluginError(_strict_failure(registry.failures))
    return registry


def _strict_failure(failures: list[PluginRecord]) -> str:
    """Every plugin that failed, each with its reason, and how to get past them."""
    names = ",".join(dict.fromkeys(p.name for p in failures))
    reasons = "; ".join(f"{p.describe()} failed to load: {p.error}" for p in failures)
    them = "them" if len(failures) > 1 else "it"
    count = f"{len(failures)} plugins failed to load: " if len(failures) > 1 else ""
    return (
        f"{count}{reasons}. This is an error because {ENV_STRICT} is set; unset it to skip "
        f"the failed plugins, or block {them} with {ENV_BLOCK}={names}"
    )


def _record_of(ep: EntryPoint) -> PluginRecord:
    return PluginRecord(
        name=ep.name,
        module=ep.value,
        distribution=ep.dist.name if ep.dist is not None else None,
        version=ep.dist.version if ep.dist is not None else None,
    )


def _name_clash(first: PluginRecord, record: PluginRecord) -> str:
    return (
        f"entry-point name {record.name!r} is already taken by {first.describe()}, loaded "
        f"first; {ENV_BLOCK}={record.name} would block both. Rename the entry point in "
        f"{record.distribution or 'its distribution'}'s group {hookspecs.ENTRY_POINT_GROUP!r}, "
        "or uninstall one of the two distributions"
    )


def _load_plugin(manager: pluggy.PluginManager, ep: EntryPoint, registry: Registry) -> PluginRecord:
    base = _record_of(ep)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        record = _load_isolated(manager, ep, registry, base)
    noted = tuple(
        str(w.message)
        for w in caught
        if issubclass(w.category, contract.HwlaunchDeprecationWarning)
    )
    for w in caught:  # anything else the plugin warned about goes on as it came
        if not issubclass(w.category, contract.HwlaunchDeprecationWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return PluginRecord(**{**record.__dict__, "warnings": noted}) if noted else record


def _load_isolated(
    manager: pluggy.PluginManager, ep: EntryPoint, registry: Registry, base: PluginRecord
) -> PluginRecord:
    try:
        plugin = ep.load()
        manager.register(plugin, name=ep.name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a plugin must never break the registry, not even sys.exit()
        return _failed(base, f"cannot load {ep.value!r}: {_one_line(exc)}")
    hooks = tuple(sorted(h.name for h in manager.get_hookcallers(plugin) or []))
    hook_problem = _hook_problem(ep, hooks) or _wrapper_problem(manager, plugin, ep)
    if hook_problem is not None:
        manager.unregister(plugin)
        return _failed(base, hook_problem, hooks)
    try:
        declared = contract.require(
            getattr(plugin, CONTRACT_ATTRIBUTE, contract.CONTRACT_VERSION), base.describe()
        )
    except PluginError as exc:
        manager.unregister(plugin)
        return _failed(base, str(exc), hooks)
    found = _collect_all(manager, plugin, registry, base)
    if isinstance(found, str):
        manager.unregister(plugin)
        return _failed(base, found, hooks)
    backends, executors = found
    versions = [declared, *(spec.contract for spec in backends)]
    record = PluginRecord(
        **{
            **base.__dict__,
            "backends": tuple(spec.name for spec in backends),
            "executors": tuple(spec.name for spec in executors),
            "hooks": hooks,
            "contract": max(versions, key=lambda v: contract.parse_version(v, base.describe())),
        }
    )
    for spec in backends:
        registry.backends[spec.name] = RegisteredBackend(spec=spec, plugin=record)
    for executor in executors:
        registry.executors[executor.name] = RegisteredExecutor(spec=executor, plugin=record)
    return record


def _collect_all(
    manager: pluggy.PluginManager, plugin: object, registry: Registry, base: PluginRecord
) -> tuple[list[BackendSpec], list[ExecutorSpec]] | str:
    """The backends and executors the plugin registers, or why it cannot be loaded (a hook
    raised, or a name is taken)."""
    backends = _collect(manager, plugin, "hwlaunch_register_backends", BackendSpec)
    if isinstance(backends, str):
        return backends
    executors = _collect(manager, plugin, "hwlaunch_register_executors", ExecutorSpec)
    if isinstance(executors, str):
        return executors
    clash = _find_clash("backend", backends, registry.backends, base) or _find_clash(
        "executor", executors, registry.executors, base
    )
    return clash if clash is not None else (backends, executors)


def _collect(
    manager: pluggy.PluginManager, plugin: object, hook: str, kind: type[T]
) -> list[T] | str:
    """The specs (of type ``kind``) the plugin's ``hook`` registers, or why it failed."""
    collected: list[T] = []

    def register(spec: T) -> None:
        if not isinstance(spec, kind):
            raise PluginError(
                f"register() takes a hwlaunch.{kind.__name__}, got {type(spec).__name__}"
            )
        collected.append(spec)

    try:
        call_plugin_hook(manager, hook, plugin, register=register)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # sys.exit() inside a hook fails the plugin, not the caller
        return f"{hook} raised {_one_line(exc)}"
    return collected


def _find_clash(
    kind: str,
    collected: list[BackendSpec] | list[ExecutorSpec],
    taken: Mapping[str, RegisteredBackend | RegisteredExecutor],
    record: PluginRecord,
) -> str | None:
    names = [spec.name for spec in collected]
    for name in names:
        if names.count(name) > 1:
            return f"registers {kind} {name!r} twice"
        if name in taken:
            owner = taken[name].plugin
            return (
                f"{kind} name {name!r} is already registered by {owner.describe()}, loaded "
                f"first; {record.describe()} cannot register it too. To keep {owner.name!r}: "
                f"{ENV_BLOCK}={record.name}; to use {record.name!r} instead: {ENV_BLOCK}={owner.name}"
            )
    return None


def _hook_problem(ep: EntryPoint, hooks: tuple[str, ...]) -> str | None:
    """Why the plugin's hook names are unusable, or None. The one check of hook names (what
    pluggy's check_pending does, for this plugin alone), with a did-you-mean for each name
    hwlaunch does not define: a misspelled hook would otherwise never be called."""
    unknown = [name for name in hooks if name not in HOOKS]
    known = [name for name in hooks if name in HOOKS]
    if known and not unknown:
        return None
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, HOOKS, n=1)
        parts.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    if not known:
        found = f"; it has {', '.join(parts)}, which looks misspelt" if parts else ""
        return (
            f"{ep.value!r} implements no hwlaunch hook{found}. Define at least one of "
            f"{', '.join(HOOKS)}, decorated with @hwlaunch.hookimpl"
        )
    return (
        f"{ep.value!r} implements {', '.join(parts)}, which hwlaunch (plugin contract "
        f"{contract.CONTRACT_VERSION}) does not define; hooks: {', '.join(HOOKS)}. Fix the "
        "name, or upgrade hwlaunch if the hook is newer"
    )


def _wrapper_problem(manager: pluggy.PluginManager, plugin: object, ep: EntryPoint) -> str | None:
    wrappers = wrapper_hooks(manager, plugin)
    if not wrappers:
        return None
    return (
        f"{ep.value!r} declares {', '.join(wrappers)} as a hook wrapper (hookwrapper=True or "
        "wrapper=True), which hwlaunch does not support: each plugin's hooks are called on their "
        "own, so a wrapper would wrap nothing. Fix: use a plain @hwlaunch.hookimpl, with "
        "tryfirst=True or trylast=True to order it"
    )


def _failed(base: PluginRecord, reason: str, hooks: tuple[str, ...] = ()) -> PluginRecord:
    return PluginRecord(**{**base.__dict__, "hooks": hooks, "error": reason})


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"SystemExit: sys.exit({exc.code!r}) was called"
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text.replace("\n", " ")


_cached: dict[tuple[str | None, str | None, bool, int], Registry] = {}


def default_registry() -> Registry:
    """The registry for this process, reloaded when the plugin environment variables change."""
    key = (
        os.environ.get(ENV_ALLOW),
        os.environ.get(ENV_BLOCK),
        strict_from_env(os.environ),
        hash(tuple(sys.path)),
    )
    if key not in _cached:
        _cached.clear()
        _cached[key] = load_registry()
    return _cached[key]
