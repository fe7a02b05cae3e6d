"""RuntimeFacts: what is true right now, probed cheaply or assumed for what-if analysis.

Assumed facts are marked, so a plan made from them says so. Probing never initializes a device
and never imports torch, Ray or a vendor module that is not already imported.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hwlaunch.errors import ConfigError
from hwlaunch.mainguard import MainGuard, detect_main_guard
from hwlaunch.settings import did_you_mean
from hwlaunch.spec import START_METHODS, BackendSpec

MAIN_GUARD_VALUES = ("guarded", "unguarded", "no-main-file", "unknown")
GLOBAL_KEYS = (
    "main_guard",
    "interactive",
    "daemonic",
    "ray_initialized",
    "in_ray_actor",
    "start_methods",
)
DEVICE_KEYS = ("available", "device_count", "initialized")


@dataclass(frozen=True)
class DeviceFacts:
    available: bool
    device_count: int
    initialized: bool
    probe_error: str | None = None


@dataclass(frozen=True)
class RuntimeFacts:
    os_start_methods: tuple[str, ...]
    devices: Mapping[str, DeviceFacts]
    main_guard: MainGuard
    interactive: bool
    daemonic: bool
    ray_initialized: bool
    in_ray_actor: bool
    assumed: frozenset[str] = field(default_factory=frozenset)

    def mark(self, key: str) -> str:
        """`` (assumed)`` after a fact that was assumed, for reasons and tables."""
        return " (assumed)" if key in self.assumed else ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "os_start_methods": list(self.os_start_methods),
            "devices": {
                name: {
                    "available": d.available,
                    "device_count": d.device_count,
                    "initialized": d.initialized,
                    "probe_error": d.probe_error,
                }
                for name, d in self.devices.items()
            },
            "main_guard": {
                "status": self.main_guard.status,
                "file": self.main_guard.file,
                "line": self.main_guard.line,
            },
            "interactive": self.interactive,
            "daemonic": self.daemonic,
            "ray_initialized": self.ray_initialized,
            "in_ray_actor": self.in_ray_actor,
            "assumed": sorted(self.assumed),
        }


def probe_device(spec: BackendSpec) -> DeviceFacts:
    """Run the spec's probes; a probe that raises makes the backend unavailable, not fatal."""
    try:
        available = bool(spec.is_available())
        count = int(spec.device_count()) if available else 0
        initialized = bool(spec.is_initialized()) if available else False
    except Exception as exc:  # a broken probe must not break resolve()
        return DeviceFacts(False, 0, False, probe_error=f"{type(exc).__name__}: {exc}")
    return DeviceFacts(available, count, initialized)


def _interactive() -> bool:
    return bool(hasattr(sys, "ps1") or sys.flags.interactive or "ipykernel" in sys.modules)


def _ray_state() -> tuple[bool, bool]:
    """(ray initialized, inside a Ray actor), asked only when Ray is already imported."""
    ray: Any = sys.modules.get("ray")
    if ray is None:
        return False, False
    try:
        if not ray.is_initialized():
            return False, False
        return True, ray.get_runtime_context().get_actor_id() is not None
    except Exception:
        return False, False


def gather_facts(specs: Mapping[str, BackendSpec]) -> RuntimeFacts:
    ray_initialized, in_actor = _ray_state()
    return RuntimeFacts(
        os_start_methods=tuple(multiprocessing.get_all_start_methods()),
        devices={name: probe_device(spec) for name, spec in specs.items()},
        main_guard=detect_main_guard(),
        interactive=_interactive(),
        daemonic=bool(multiprocessing.current_process().daemon),
        ray_initialized=ray_initialized,
        in_ray_actor=in_actor,
    )


def _bool(key: str, raw: object, source: str) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"invalid value {raw!r} for {key} from {source}: expected true or false")


def _count(key: str, raw: object, source: str) -> int:
    try:
        value = int(str(raw).strip()) if not isinstance(raw, bool) else -1
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(
            f"invalid value {raw!r} for {key} from {source}: expected an integer >= 0"
        )
    return value


def parse_assumptions(
    items: Mapping[str, object] | Iterable[str] | None, source: str
) -> dict[str, object]:
    """``{"cuda.available": True}`` or ``["cuda.available=true"]`` into a key -> raw map."""
    if items is None:
        return {}
    if isinstance(items, Mapping):
        return dict(items)
    parsed: dict[str, object] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"invalid {source} {item!r}: expected KEY=VALUE, e.g. cuda.available=true"
            )
        parsed[key.strip()] = value.strip()
    return parsed


def apply_assumptions(
    facts: RuntimeFacts, assume: Mapping[str, object], source: str
) -> RuntimeFacts:
    """Replace probed facts with assumed ones; each assumed key is recorded in ``assumed``."""
    devices = dict(facts.devices)
    changes: dict[str, Any] = {}
    valid = [*GLOBAL_KEYS, *(f"{b}.{k}" for b in devices for k in DEVICE_KEYS)]
    for key, raw in assume.items():
        where = f"{source} {key}={raw}"
        backend, dot, attr = key.partition(".")
        if dot and backend in devices and attr in DEVICE_KEYS:
            device = devices[backend]
            if attr == "device_count":
                count = _count(key, raw, where)
                device = replace(
                    device, device_count=count, available=device.available or count > 0
                )
            else:
                flag = _bool(key, raw, where)
                device = (
                    replace(device, available=flag)
                    if attr == "available"
                    else replace(device, initialized=flag)
                )
                if attr == "available" and flag:
                    device = replace(device, device_count=max(device.device_count, 1))
                if attr == "initialized" and flag:
                    device = replace(
                        device, available=True, device_count=max(device.device_count, 1)
                    )
            devices[backend] = replace(device, probe_error=None)
        elif key == "main_guard":
            status = str(raw).strip()
            if status not in MAIN_GUARD_VALUES:
                raise ConfigError(
                    f"invalid value {raw!r} for main_guard from {where}"
                    f"{did_you_mean(status, MAIN_GUARD_VALUES)} "
                    f"(allowed: {', '.join(MAIN_GUARD_VALUES)})"
                )
            changes["main_guard"] = MainGuard(status, detail="assumed")
        elif key == "start_methods":
            methods = tuple(m.strip() for m in str(raw).split(",") if m.strip())
            bad = [m for m in methods if m not in START_METHODS]
            if bad or not methods:
                raise ConfigError(
                    f"invalid value {raw!r} for start_methods from {where}: expected a comma-"
                    f"separated list of {', '.join(START_METHODS)}"
                )
            changes["os_start_methods"] = methods
        elif key in GLOBAL_KEYS:
            changes[key] = _bool(key, raw, where)
        else:
            raise ConfigError(
                f"unknown fact {key!r} in {source}{did_you_mean(key, valid)} "
                f"(known: {', '.join(valid)})"
            )
    return replace(facts, devices=devices, assumed=facts.assumed | frozenset(assume), **changes)
