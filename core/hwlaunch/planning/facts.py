"""RuntimeFacts: what is true right now, probed cheaply or assumed for what-if analysis.

Assumed facts are marked, so a plan made from them says so. Probing never initializes a device
and never imports torch, Ray or a vendor module that is not already imported.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, get_args

from hwlaunch._checks import ASCII_NUMBER_RULE, did_you_mean, parse_truthy, text_int
from hwlaunch.errors import ConfigError
from hwlaunch.planning.launchers import LAUNCHERS, detect_launcher, launcher_of
from hwlaunch.planning.mainguard import detect_main_guard
from hwlaunch.planning.room import probe_room
from hwlaunch.planning.threads import (
    GNU_OPENMP,
    GRPC,
    INTEL_OPENMP,
    OPENBLAS,
    probe_threads,
)
from hwlaunch.planning.threads_budget import THREAD_VARS
from hwlaunch.probes import usable_cpus
from hwlaunch.runtime_facts import (
    DeviceFacts,
    LauncherInfo,
    MainGuard,
    MainGuardStatus,
    RuntimeFacts,
    ThreadFacts,
    ThreadInfo,
)
from hwlaunch.spec import START_METHODS, BackendSpec

MAIN_GUARD_VALUES: tuple[MainGuardStatus, ...] = get_args(MainGuardStatus)
GLOBAL_KEYS = (
    "main_guard",
    "daemonic",
    "in_ray_actor",
    "start_methods",
    "launcher",
    "threads",
    "free_threaded",
    "usable_cpus",
)
DEVICE_KEYS = ("available", "device_count", "initialized")


def probe_device(spec: BackendSpec) -> DeviceFacts:
    """Run the spec's probes; a probe that raises makes the backend unavailable, not fatal."""
    try:
        available = bool(spec.is_available())
        count = int(spec.device_count()) if available else 0
        initialized = bool(spec.is_initialized()) if available else False
    except Exception as exc:  # a broken probe must not break resolve()
        return DeviceFacts(False, 0, False, probe_error=f"{type(exc).__name__}: {exc}")
    return DeviceFacts(available, count, initialized)


def _in_ray_actor() -> bool:
    """Whether this process is a Ray actor, asked only when Ray is already imported."""
    ray: Any = sys.modules.get("ray")
    if ray is None:
        return False
    try:
        return bool(ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None)
    except Exception:
        return False


def gather_facts(specs: Mapping[str, BackendSpec]) -> RuntimeFacts:
    """Probe every backend and this process; cheap, and never initializes a device."""
    return RuntimeFacts(
        os_start_methods=tuple(multiprocessing.get_all_start_methods()),
        devices={name: probe_device(spec) for name, spec in specs.items()},
        main_guard=detect_main_guard(),
        daemonic=bool(multiprocessing.current_process().daemon),
        in_ray_actor=_in_ray_actor(),
        launcher=detect_launcher(),
        threads=probe_threads(),
        usable_cpus=usable_cpus(),
        thread_env={k: os.environ[k] for k in THREAD_VARS if k in os.environ},
        room=probe_room(),
    )


def _bool(key: str, raw: object, source: str) -> bool:
    value = parse_truthy(raw)
    if value is not None:
        return value
    raise ConfigError(f"invalid value {raw!r} for {key} from {source}: expected true or false")


def _count(key: str, raw: object, source: str, minimum: int = 0) -> int:
    found = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
    if isinstance(raw, str):
        found = text_int(raw)
    if found is None or found < minimum:
        raise ConfigError(
            f"invalid value {raw!r} for {key} from {source}: expected an integer >= {minimum}"
            + (f", {ASCII_NUMBER_RULE}" if isinstance(raw, str) else "")
        )
    return found


def parse_assumptions(
    items: Mapping[str, object] | Iterable[str] | str | None, source: str
) -> dict[str, object]:
    """``{"cuda.available": True}`` or ``["cuda.available=true"]`` into a key -> raw map."""
    if items is None:
        return {}
    if isinstance(items, Mapping):
        return dict(items)
    if isinstance(items, str):  # one KEY=VALUE, not a sequence of characters
        items = [items]
    parsed: dict[str, object] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"invalid {source} {item!r}: expected KEY=VALUE, e.g. cuda.available=true"
            )
        parsed[key.strip()] = value.strip()
    return parsed


def _assume_device(
    name: str, device: DeviceFacts, given: Mapping[str, object], source: str
) -> DeviceFacts:
    """Apply the assumed ``available``/``device_count``/``initialized`` of one backend.

    The three are related (a device that is initialized is available and has a device), so an
    assumption about one implies the others unless they are assumed too; contradictions are
    errors rather than a plan made from facts that cannot all be true.
    """

    def value(attr: str, convert: Callable[[str, object, str], Any]) -> Any:
        if attr not in given:
            return None
        return convert(f"{name}.{attr}", given[attr], f"{source} {name}.{attr}={given[attr]}")

    available: bool | None = value("available", _bool)
    count: int | None = value("device_count", _count)
    initialized: bool | None = value("initialized", _bool)
    if available is None:
        available = count > 0 if count is not None else bool(initialized) or device.available
    if count is None:
        count = max(device.device_count, 1) if available else 0
    if initialized is None:
        initialized = device.initialized and available
    if available != (count > 0) or (initialized and not available):
        raise ConfigError(
            f"contradictory assumptions in {source} for {name}: available={available}, "
            f"device_count={count}, initialized={initialized} (an available backend has at least "
            "one device; an initialized one is available)"
        )
    return DeviceFacts(available, count, initialized)


def _one_of(key: str, raw: object, where: str, allowed: tuple[str, ...]) -> str:
    """An assumed value that must be one of ``allowed``, else an error with a did-you-mean."""
    value = str(raw).strip()
    if value not in allowed:
        raise ConfigError(
            f"invalid value {raw!r} for {key} from {where}"
            f"{did_you_mean(value, allowed)} (allowed: {', '.join(allowed)})"
        )
    return value


def _assumed_launcher(raw: object, where: str) -> LauncherInfo:
    """What this launcher's variables say here, if any: a what-if for another machine."""
    name = _one_of("launcher", raw, where, LAUNCHERS)
    known = LAUNCHERS[LAUNCHERS.index(name)]  # the Literal, typed
    return replace(launcher_of(known), evidence=where)


THREADS_HELP = (
    "expected none, or a comma-separated list of: a Python thread's name, or a library's "
    "threads as NAME[:N] (N threads; NAME one of openblas, gomp or openmp (GNU OpenMP, torch's "
    "pool), iomp (Intel OpenMP), grpc, native (a library hwlaunch does not know)), e.g. "
    "threads=openblas,gomp:2,my-poller"
)
# What an assumed library thread looks like: as the probe finds it in the wheels users have.
_ASSUMABLE: dict[str, ThreadInfo] = {
    "openblas": ThreadInfo("assumed", "native", "libscipy_openblas64_.so", "numpy", OPENBLAS),
    "gomp": ThreadInfo("assumed", "native", "libgomp.so.1", "torch", GNU_OPENMP),
    "openmp": ThreadInfo("assumed", "native", "libgomp.so.1", "torch", GNU_OPENMP),
    "iomp": ThreadInfo("assumed", "native", "libiomp5.so", None, INTEL_OPENMP),
    "grpc": ThreadInfo("assumed", "native", "cygrpc.so", "grpc", GRPC),
    "native": ThreadInfo("assumed", "native"),
}


def _assumed_threads(raw: object, where: str, probed: ThreadFacts) -> ThreadFacts:
    """``threads=openblas,gomp:2,my-poller``: the other threads of a process, for what-if."""
    text = str(raw).strip()
    items = [] if text in ("", "0", "none") else [part.strip() for part in text.split(",")]
    others: list[ThreadInfo] = []
    for item in items:
        kind, sep, count = item.partition(":")
        n = (text_int(count) if count.strip().isascii() else None) if sep else 1
        n = -1 if n is None else n  # -1: not a count
        if kind in _ASSUMABLE and n >= 0:
            others += [_ASSUMABLE[kind]] * n
        elif item and not sep:
            others.append(ThreadInfo(item, "python"))
        else:
            raise ConfigError(f"invalid value {raw!r} for threads from {where}: {THREADS_HELP}")
    return replace(probed, others=tuple(others), source="assumed")


def _assumed_main_guard(raw: object, where: str) -> MainGuard:
    status = _one_of("main_guard", raw, where, MAIN_GUARD_VALUES)
    return MainGuard(MAIN_GUARD_VALUES[MAIN_GUARD_VALUES.index(status)], detail="assumed")


def apply_assumptions(
    facts: RuntimeFacts, assume: Mapping[str, object], source: str
) -> RuntimeFacts:
    """Replace probed facts with assumed ones.

    Every assumed key is recorded in ``assumed``, and so is every fact an assumption changed by
    implication (assuming ``cuda.device_count=2`` makes ``cuda.available`` true, assumed too).
    """
    devices = dict(facts.devices)
    changes: dict[str, Any] = {}
    assumed = set(facts.assumed)
    per_device: dict[str, dict[str, object]] = {}
    valid = [*GLOBAL_KEYS, *(f"{b}.{k}" for b in devices for k in DEVICE_KEYS)]
    for key, raw in assume.items():
        where = f"{source} {key}={raw}"
        backend, dot, attr = key.partition(".")
        if dot and backend in devices and attr in DEVICE_KEYS:
            per_device.setdefault(backend, {})[attr] = raw
        elif key == "main_guard":
            changes["main_guard"] = _assumed_main_guard(raw, where)
        elif key == "start_methods":
            methods = tuple(m.strip() for m in str(raw).split(",") if m.strip())
            bad = [m for m in methods if m not in START_METHODS]
            if bad or not methods:
                raise ConfigError(
                    f"invalid value {raw!r} for start_methods from {where}: expected a comma-"
                    f"separated list of {', '.join(START_METHODS)}"
                )
            changes["os_start_methods"] = methods
        elif key == "launcher":
            changes["launcher"] = _assumed_launcher(raw, where)
        elif key == "threads":
            changes["threads"] = _assumed_threads(raw, where, changes.get("threads", facts.threads))
        elif key == "free_threaded":
            base = changes.get("threads", facts.threads)
            changes["threads"] = replace(base, free_threaded=_bool(key, raw, where))
        elif key == "usable_cpus":
            changes["usable_cpus"] = _count(key, raw, where, minimum=1)
        elif key in GLOBAL_KEYS:
            changes[key] = _bool(key, raw, where)
        else:
            raise ConfigError(
                f"unknown fact {key!r} in {source}{did_you_mean(key, valid)} "
                f"(known: {', '.join(valid)})"
            )
        assumed.add(key)
    for backend, given in per_device.items():
        old = devices[backend]
        new = _assume_device(backend, old, given, source)
        for attr in DEVICE_KEYS:
            if getattr(new, attr) != getattr(old, attr):
                assumed.add(f"{backend}.{attr}")
        devices[backend] = new
    return replace(facts, devices=devices, assumed=frozenset(assumed), **changes)
