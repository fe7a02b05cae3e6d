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
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points

import pluggy

from hwlaunch import hookspecs
from hwlaunch._checks import parse_truthy, unknown_name_message
from hwlaunch.errors import BackendUnavailableError, PluginError
from hwlaunch.spec import BackendSpec

OWN_DISTRIBUTION = "hwlaunch"
ENV_ALLOW = "HWLAUNCH_PLUGINS"
ENV_BLOCK = "HWLAUNCH_DISABLE_PLUGINS"
ENV_STRICT = "HWLAUNCH_STRICT_PLUGINS"


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


@dataclass
class Registry:
    """Backends by name, plus a record of every plugin considered (loaded or failed)."""

    backends: dict[str, RegisteredBackend] = field(default_factory=dict)
    plugins: list[PluginRecord] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def specs(self) -> dict[str, BackendSpec]:
        return {name: b.spec for name, b in self.backends.items()}

    @property
    def failures(self) -> list[PluginRecord]:
        return [p for p in self.plugins if p.error is not None]

    def get(self, name: str) -> BackendSpec:
        """The spec named ``name``; a KeyError-like error lists the known names otherwise."""
        if name in self.backends:
            return self.backends[name].spec
        raise BackendUnavailableError(unknown_name_message("backend", name, self.backends))


def _split_env(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _strict_from_env(environ: Mapping[str, str]) -> bool:
    return parse_truthy(environ.get(ENV_STRICT, "")) is True


def _load_order(ep: EntryPoint) -> tuple[int, str]:
    """Built-ins first, then third parties by name: clashes are decided the same every time."""
    dist = ep.dist.name if ep.dist is not None else None
    return (0 if dist == OWN_DISTRIBUTION else 1, ep.name)


def load_registry(environ: Mapping[str, str] | None = None, strict: bool | None = None) -> Registry:
    """Discover, filter and load every plugin of the entry-point group."""
    env = os.environ if environ is None else environ
    strict = _strict_from_env(env) if strict is None else strict
    allow = _split_env(env[ENV_ALLOW]) if ENV_ALLOW in env else None
    block = set(_split_env(env.get(ENV_BLOCK, "")))
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    registry = Registry()
    # importlib.metadata already lists a distribution once even when sys.path shows it twice,
    # so two entry points with one name come from two distributions: report, never drop one.
    by_name: dict[str, PluginRecord] = {}
    for ep in sorted(entry_points(group=hookspecs.ENTRY_POINT_GROUP), key=_load_order):
        dist = ep.dist.name if ep.dist is not None else None
        builtin = dist == OWN_DISTRIBUTION
        if ep.name in block or (allow is not None and not builtin and ep.name not in allow):
            why = ENV_BLOCK if ep.name in block else ENV_ALLOW
            registry.skipped.append(f"{ep.name} (excluded by {why})")
            continue
        if ep.name in by_name:
            record = _failed(_record_of(ep), _name_clash(by_name[ep.name], _record_of(ep)))
        else:
            record = _load_plugin(manager, ep, registry)
            by_name[ep.name] = record
        registry.plugins.append(record)
        if record.error is not None and strict:
            raise PluginError(
                f"{record.describe()} failed to load: {record.error}. This is an error because "
                f"{ENV_STRICT} is set; unset it to skip the plugin, or block it with "
                f"{ENV_BLOCK}={record.name}"
            )
    return registry


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
    try:
        plugin = ep.load()
        manager.register(plugin, name=ep.name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a plugin must never break the registry, not even sys.exit()
        return _failed(base, f"cannot load {ep.value!r}: {_one_line(exc)}")
    hooks = tuple(sorted(h.name for h in manager.get_hookcallers(plugin) or []))
    impls = [
        impl
        for impl in manager.hook.hwlaunch_register_backends.get_hookimpls()
        if impl.plugin is plugin
    ]
    if not impls:
        manager.unregister(plugin)
        return _failed(base, _no_hook_message(ep, hooks), hooks)
    collected: list[BackendSpec] = []

    def register(spec: BackendSpec) -> None:
        if not isinstance(spec, BackendSpec):
            raise PluginError(f"register() takes a hwlaunch.BackendSpec, got {type(spec).__name__}")
        collected.append(spec)

    arguments: dict[str, object] = {"register": register}
    try:
        for impl in impls:  # called as pluggy would: each argument the hookimpl names
            impl.function(*(arguments[name] for name in impl.argnames))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # sys.exit() inside a hook fails the plugin, not the caller
        manager.unregister(plugin)
        return _failed(base, f"hwlaunch_register_backends raised {_one_line(exc)}", hooks)
    clash = _find_clash(collected, registry, base)
    if clash is not None:
        manager.unregister(plugin)
        return _failed(base, clash, hooks)
    names = tuple(spec.name for spec in collected)
    record = PluginRecord(**{**base.__dict__, "backends": names, "hooks": hooks})
    for spec in collected:
        registry.backends[spec.name] = RegisteredBackend(spec=spec, plugin=record)
    return record


def _find_clash(
    collected: list[BackendSpec], registry: Registry, record: PluginRecord
) -> str | None:
    names = [spec.name for spec in collected]
    for name in names:
        if names.count(name) > 1:
            return f"registers backend {name!r} twice"
        if name in registry.backends:
            owner = registry.backends[name].plugin
            return (
                f"backend name {name!r} is already registered by {owner.describe()}, loaded "
                f"first; {record.describe()} cannot register it too. To keep {owner.name!r}: "
                f"{ENV_BLOCK}={record.name}; to use {record.name!r} instead: {ENV_BLOCK}={owner.name}"
            )
    return None


def _no_hook_message(ep: EntryPoint, hooks: tuple[str, ...]) -> str:
    spec_name = "hwlaunch_register_backends"
    close = difflib.get_close_matches(spec_name, hooks, n=1)
    found = f" (it has {close[0]!r}: a misspelling?)" if close else ""
    return (
        f"{ep.value!r} implements no {spec_name} hook{found}; define "
        f"`{spec_name}(register)` decorated with @hwlaunch.hookimpl"
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
        _strict_from_env(os.environ),
        hash(tuple(sys.path)),
    )
    if key not in _cached:
        _cached.clear()
        _cached[key] = load_registry()
    return _cached[key]
