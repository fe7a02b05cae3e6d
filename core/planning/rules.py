"""The rules: specs + facts + overrides -> Plan, as small functions with no side effects.

``decide()`` is a pure function: it writes no environment variable, sets no global start method
and starts no process, so every rule is a table test. Each rule records its decision (value,
source, reason) in the resolution's Notes; the start-method rules live in ``start_method``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hwlaunch._checks import did_you_mean, unknown_name_message
from hwlaunch.errors import BackendUnavailableError, ConfigError
from hwlaunch.plan import SPIN_WITH_FREE_CPUS, ExecutorName, Plan, RuntimeFacts
from hwlaunch.planning.notes import Notes
from hwlaunch.planning.settings import BY_NAME, Overrides, Sourced
from hwlaunch.planning.start_method import preload_of, start_method
from hwlaunch.spec import BackendSpec

__all__ = ["decide"]

# How close (difflib ratio) a [backends.<name>] must be to a registered name to count as a typo:
# 'cdua' (0.75) is a typo of 'cuda', while 'npu' or 'tpu' (0.67 to 'cpu') are other vendors.
TYPO_CUTOFF = 0.75


def decide(
    specs: Mapping[str, BackendSpec],
    facts: RuntimeFacts,
    overrides: Overrides,
    plugin_problems: Iterable[str] = (),
) -> Plan:
    """The pure core of resolution: the rules applied in order, into a Plan."""
    notes = Notes(facts, warnings=list(plugin_problems))
    check_backend_tables(specs, overrides, notes)
    spec = backend(specs, overrides, notes)
    world = size("world_size", spec.name, overrides, notes)
    nodes = size("nnodes", spec.name, overrides, notes)
    executor = choose_executor(spec, world, nodes, overrides, notes)
    method = start_method(spec, executor, overrides, notes)
    _note_backend_rules(spec, notes)
    _note_binding(spec, executor, notes)
    env = worker_env(spec, overrides, notes)
    preload: tuple[str, ...] = ()
    if method == "forkserver":
        preload = preload_of(spec)
        notes.note(
            "preload",
            list(preload),
            f"rule of backend {spec.name}",
            "imported once by the fork server so workers start fast",
        )
    ray_address, pg_timeout = _ray_settings(executor, overrides, notes)
    startup = overrides.value("startup_timeout", spec.name)
    notes.note(
        "startup_timeout", startup.value, startup.source, "seconds every worker has to be ready"
    )
    rpc_channel, rpc_spin = _rpc_settings(executor, overrides, notes)
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
        startup_timeout=startup.value,
        rpc_channel=rpc_channel,
        rpc_spin=rpc_spin,
        max_restarts=max_restarts(executor, overrides, notes),
        decisions=tuple(notes.decisions),
        warnings=tuple(dict.fromkeys(notes.warnings)),
        facts=facts,
        device_binding=str(spec.device_binding),
        propagate_env=spec.propagate_env,
        ray_noset_visibility_var=spec.ray_noset_visibility_var if executor == "ray" else None,
    )


def max_restarts(executor: str, overrides: Overrides, notes: Notes) -> int:
    """How often a failed worker group is restarted (0: fail-stop); uni never restarts."""
    found = overrides.value("max_restarts")
    value = int(found.value)
    if executor == "uni" and value:
        notes.warnings.append(
            f"max_restarts {value} (from {found.source}) is not used: the uni executor runs "
            "the worker in this process, which a restart cannot replace"
        )
        value = 0
    notes.note(
        "max_restarts",
        value,
        found.source,
        "fail-stop: the first worker death ends the executor"
        if value == 0
        else "a failed worker group is stopped and started again, this many times at most",
    )
    return value


# -- backend -------------------------------------------------------------------------------
def backend(specs: Mapping[str, BackendSpec], overrides: Overrides, notes: Notes) -> BackendSpec:
    """The requested backend if it is available; else the highest-priority available one."""
    chosen = overrides.lookup("backend")
    if chosen is not None:
        return _requested_backend(specs, chosen, notes)
    facts = notes.facts
    ranked = sorted(
        (s for s in specs.values() if facts.devices[s.name].available),
        key=lambda s: (-s.priority, s.name),
    )
    if ranked:
        spec = ranked[0]
        others = ", ".join(s.name for s in ranked[1:]) or "none"
        reason = (
            f"highest-priority available backend (priority {spec.priority}"
            f"{facts.mark(spec.name + '.available')}; other available: {others})"
        )
        notes.note("backend", spec.name, "auto-detected", reason)
        return spec
    if "cpu" in specs:
        notes.note("backend", "cpu", "built-in default", "no backend reports itself available")
        return specs["cpu"]
    raise BackendUnavailableError(
        "no backend is available and the cpu plugin is not loaded; check "
        "`hwlaunch backends` and HWLAUNCH_DISABLE_PLUGINS / HWLAUNCH_PLUGINS"
    )


def _requested_backend(
    specs: Mapping[str, BackendSpec], chosen: Sourced[str], notes: Notes
) -> BackendSpec:
    if chosen.value not in specs:
        raise BackendUnavailableError(
            f"{unknown_name_message('backend', chosen.value, specs)} from "
            f"{chosen.source}; `hwlaunch backends` lists them and any plugin that failed"
        )
    spec, facts = specs[chosen.value], notes.facts
    device = facts.devices[spec.name]
    if not device.available:
        available = [n for n, d in facts.devices.items() if d.available]
        why = f" (probe failed: {device.probe_error})" if device.probe_error else ""
        raise BackendUnavailableError(
            f"backend {spec.name!r} from {chosen.source} is not available on this "
            f"machine{why}{facts.mark(spec.name + '.available')}. Fix: choose an "
            f"available backend ({', '.join(available) or 'none'}), or see what would "
            f"happen with --assume {spec.name}.available=true"
        )
    notes.note("backend", spec.name, chosen.source, "requested")
    return spec


# -- sizes ---------------------------------------------------------------------------------
def size(name: str, backend: str, overrides: Overrides, notes: Notes) -> Sourced[int]:
    found = overrides.lookup(name, backend)
    if found is None:
        value, reason = Sourced(1, "built-in default"), "default"
    elif found is overrides.defaults.get(name):
        value, reason = found, "default of this command"
    else:
        value, reason = found, "requested"
    notes.note(name, value.value, value.source, reason)
    return value


# -- executor ------------------------------------------------------------------------------
def choose_executor(
    spec: BackendSpec,
    world: Sourced[int],
    nodes: Sourced[int],
    overrides: Overrides,
    notes: Notes,
) -> ExecutorName:
    """The requested executor if it can run the sizes; else uni, mp or ray by size."""
    if nodes.value > world.value:
        raise ConfigError(
            f"nnodes {nodes.value} (from {nodes.source}) exceeds world_size {world.value} "
            f"(from {world.source}); every node needs at least one worker"
        )
    chosen = overrides.lookup("executor", spec.name)
    if chosen is not None:
        _check_requested_executor(spec, chosen, world, nodes, notes.facts)
        return notes.note("executor", chosen.value, chosen.source, "requested")  # type: ignore[no-any-return]
    device = notes.facts.devices[spec.name]
    count_fact = f"{spec.name}.device_count"
    if nodes.value > 1:
        why = f"{nodes.value} nodes requested; workers span machines"
        return notes.note("executor", "ray", f"nnodes (from {nodes.source})", why)  # type: ignore[no-any-return]
    if world.value == 1:
        return notes.note("executor", "uni", "rule", "world size 1 runs in-process")  # type: ignore[no-any-return]
    if spec.is_accelerator and world.value > device.device_count:
        why = (
            f"world size {world.value} exceeds the {device.device_count} local "
            f"{spec.name} devices{notes.facts.mark(count_fact)}; Ray places workers on "
            "other nodes"
        )
        return notes.note("executor", "ray", notes.fact(count_fact), why)  # type: ignore[no-any-return]
    where = (
        f"{device.device_count} local {spec.name} devices" if spec.is_accelerator else "one node"
    )
    why = f"world size {world.value} fits on {where}: local processes"
    return notes.note("executor", "mp", "rule", why)  # type: ignore[no-any-return]


def _check_requested_executor(
    spec: BackendSpec,
    chosen: Sourced[str],
    world: Sourced[int],
    nodes: Sourced[int],
    facts: RuntimeFacts,
) -> None:
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
    count = facts.devices[spec.name].device_count
    if chosen.value == "mp" and spec.is_accelerator and world.value > count:
        raise ConfigError(
            f"executor 'mp' from {chosen.source} binds one {spec.name} device per worker, "
            f"but world_size {world.value} (from {world.source}) exceeds the "
            f"{count} local devices{facts.mark(f'{spec.name}.device_count')}. Fix: use "
            f"executor 'ray' or world_size <= {count}"
        )


# -- what the backend's rule fixes, and the rest -------------------------------------------
def _note_backend_rules(spec: BackendSpec, notes: Notes) -> None:
    source = f"rule of backend {spec.name}"
    notes.note("dist_backend", spec.dist_backend, source, "communication backend of the device")
    notes.note("worker", spec.worker, source, "worker class")
    notes.note(
        "device_control_env_var",
        spec.device_control_env_var,
        source,
        "binds each worker to its device"
        if spec.device_control_env_var
        else "no device-visibility variable: workers share the host",
    )
    notes.note(
        "ray_resource", spec.ray_resource, source, "the Ray resource each worker (actor) requests"
    )


BINDING_REASONS = {
    "per_worker": "each worker sees only its own device (device index 0 in the worker)",
    "job_wide": "each worker sees every device of the job on its node and selects its local rank",
    "none": "the device-visibility variable is left as it is",
}


def _note_binding(spec: BackendSpec, executor: str, notes: Notes) -> None:
    """The device binding, the variables copied from the driver, and Ray's opt-out."""
    source = f"rule of backend {spec.name}"
    binding = str(spec.device_binding)
    notes.note("device_binding", binding, source, BINDING_REASONS[binding])
    if spec.propagate_env:
        notes.note(
            "propagate_env",
            list(spec.propagate_env),
            source,
            "copied from the driver's environment into every worker (names only: values are "
            "never shown)",
        )
    if executor == "ray" and spec.ray_noset_visibility_var:
        notes.note(
            "ray_noset_visibility_var",
            spec.ray_noset_visibility_var,
            source,
            "set on every actor so that Ray leaves the visibility variable to the binding",
        )


def worker_env(spec: BackendSpec, overrides: Overrides, notes: Notes) -> dict[str, str]:
    """The backend's worker_env, then the config file's [env], then its [backends.<name>.env]."""
    env = dict(spec.worker_env)
    sources = [f"rule of backend {spec.name}"] if env else []
    config = overrides.config
    if config is not None:
        for layer in (config.env, config.backend_env.get(spec.name)):
            if layer is not None:
                env.update(layer.value)
                sources.append(layer.source)
    notes.note("env", env, " < ".join(sources) or "none", "extra environment for workers")
    return env


def _ray_settings(executor: str, overrides: Overrides, notes: Notes) -> tuple[str | None, float]:
    """The cluster to join and the placement timeout; decided only for the ray executor."""
    if executor != "ray":
        return None, float(BY_NAME["ray_pg_timeout"].default)
    found = overrides.lookup("ray_address")
    notes.note(
        "ray_address",
        found.value if found else None,
        found.source if found else "default",
        "cluster to join"
        if found
        else "the Ray instance already initialized here, else a new local one",
    )
    timeout = overrides.value("ray_pg_timeout")
    notes.note(
        "ray_pg_timeout", timeout.value, timeout.source, "seconds to wait for the placement group"
    )
    return (found.value if found else None), float(timeout.value)


def _rpc_settings(executor: str, overrides: Overrides, notes: Notes) -> tuple[str, float | None]:
    """How the mp executor carries calls; the other executors have their own transport, so
    the setting is noted only for mp."""
    channel = overrides.value("rpc_channel")
    spin = overrides.lookup("rpc_spin")
    values = (str(channel.value), None if spin is None else float(spin.value))
    if executor != "mp":
        return values
    notes.note(
        "rpc_channel",
        values[0],
        channel.source,
        "requests written once to shared memory that every worker reads; replies in a "
        "slot per worker"
        if values[0] == "shm"
        else "requests and replies through each worker's pipe",
    )
    if values[0] == "shm":
        notes.note(
            "rpc_spin",
            values[1],
            spin.source if spin else "default",
            "seconds a waiting side polls shared memory before it blocks"
            if spin
            else f"at start: {SPIN_WITH_FREE_CPUS:g} s where every worker has a CPU of its "
            "own, else 0 (polling workers would take CPU from working ones)",
        )
    return values


def check_backend_tables(specs: Mapping[str, Any], overrides: Overrides, notes: Notes) -> None:
    """A ``[backends.<name>]`` close to a registered name is a typo (error); any other is
    taken for a vendor whose plugin is not installed here (warning), so that one config
    file serves machines with different plugins."""
    config = overrides.config
    if config is None:
        return
    for name in config.backends:
        if name in specs:
            continue
        where = config.backend_tables.get(name, f"[backends.{name}] in {config.path}")
        close = did_you_mean(name, list(specs), cutoff=TYPO_CUTOFF)
        if close:
            raise ConfigError(
                f"{where} names no registered backend{close} "
                f"(registered: {', '.join(sorted(specs))})"
            )
        notes.warn(
            f"{where} names no registered backend, so it is ignored (registered: "
            f"{', '.join(sorted(specs))}; is its plugin installed?)"
        )
