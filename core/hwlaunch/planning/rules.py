"""The rules: specs + facts + overrides -> Plan, as small functions with no side effects.

``decide()`` is a pure function: it writes no environment variable, sets no global start method
and starts no process, so every rule is a table test. Each rule records its decision (value,
source, reason) in the resolution's Notes; the start-method rules live in ``start_method``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hwlaunch._checks import did_you_mean, unknown_name_message
from hwlaunch.channels import SPIN_WITH_FREE_CPUS
from hwlaunch.errors import BackendUnavailableError, ConfigError
from hwlaunch.executor_spec import ExecutorSpec
from hwlaunch.plan import SIGKILL_AFTER, ExecutorName, Plan
from hwlaunch.planning.drafting import Draft
from hwlaunch.planning.notes import Notes
from hwlaunch.planning.output import worker_output
from hwlaunch.planning.room import check_room
from hwlaunch.planning.settings import BY_NAME, Overrides, Sourced
from hwlaunch.planning.start_method import preload_decision, start_method
from hwlaunch.planning.threads_budget import thread_budget
from hwlaunch.runtime_facts import RuntimeFacts
from hwlaunch.spec import BackendSpec, backend_aliases

__all__ = ["decide", "draft_plan"]

# How close (difflib ratio) a [backends.<name>] must be to a registered name to count as a typo:
# 'cdua' (0.75) is a typo of 'cuda', while 'npu' or 'tpu' (0.67 to 'cpu') are other vendors.
TYPO_CUTOFF = 0.75
# The built-in executors the rules choose when the user names none: by size, and under a
# launcher. What each may do is read from its ExecutorSpec, never from these names.
SINGLE, LOCAL, ACROSS_NODES, UNDER_LAUNCHER = "uni", "mp", "ray", "external"
STARTUP_REASON = "seconds every worker has to be ready"


def decide(
    specs: Mapping[str, BackendSpec],
    facts: RuntimeFacts,
    overrides: Overrides,
    plugin_problems: Iterable[str] = (),
    executors: Mapping[str, ExecutorSpec] | None = None,
) -> Plan:
    """The pure core of resolution: the rules applied in order, into a Plan. ``executors``
    defaults to the registered ones."""
    return draft_plan(specs, facts, overrides, plugin_problems, executors).freeze()


def draft_plan(
    specs: Mapping[str, BackendSpec],
    facts: RuntimeFacts,
    overrides: Overrides,
    plugin_problems: Iterable[str] = (),
    executors: Mapping[str, ExecutorSpec] | None = None,
) -> Draft:
    """The rules applied in order, into a draft the plugins' proposals may still change
    (``policy.settle``) before it is frozen."""
    executors = _registered_executors() if executors is None else executors
    notes = Notes(facts, warnings=list(plugin_problems))
    check_backend_tables(specs, overrides, notes)
    check_executor_names(overrides, executors)
    spec = backend(specs, overrides, notes)
    adopting = adopts_launcher(spec, overrides, executors, facts)
    if adopting is not None:
        world, nodes, executor = launcher_sizes(spec, adopting, overrides, notes)
    else:
        world, nodes, executor = sized_executor(spec, overrides, notes, executors)
    runs = executors[executor]
    method = start_method(spec, runs, overrides, notes)
    _note_backend_rules(spec, notes)
    _note_binding(spec, runs, notes)
    env, threads = _env_and_threads(
        spec, runs, adopting is not None, (world.value, nodes.value), overrides, notes
    )
    preload = _preload(spec, method, notes)
    ray_address, pg_timeout = _ray_settings(runs, overrides, notes)
    startup = _startup_timeout(spec, overrides, notes)
    rpc_channel, rpc_spin = _rpc_settings(runs, overrides, notes)
    operation = _operation(spec, overrides, notes)
    values: dict[str, Any] = dict(
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
        max_restarts=max_restarts(runs, overrides, notes),
        **worker_output(runs, overrides, notes, world.value),
        cpu_threads=threads,
        facts=facts,
        device_binding=str(spec.device_binding),
        propagate_env=spec.propagate_env,
        ray_noset_visibility_var=spec.ray_noset_visibility_var if runs.ray else None,
        ranks_from_launcher=runs.needs_launcher,
        **operation,
    )
    return Draft(values, notes)


DEFAULT_SHUTDOWN_TIMEOUT = 5.0  # seconds, for a backend that declares no shutdown_timeout


def _operation(spec: BackendSpec, overrides: Overrides, notes: Notes) -> dict[str, Any]:
    """The stall watchdog, the shutdown grace and the forwarded signals, each noted."""
    warn = overrides.value("rpc_warn_after")
    notes.note(
        "rpc_warn_after",
        warn.value,
        warn.source,
        "seconds a call waits before the silent ranks' stacks are logged, again at each doubling"
        if warn.value
        else "no stall warnings",
    )
    grace = overrides.lookup("shutdown_timeout", spec.name)
    if grace is None:
        declared = spec.shutdown_timeout
        grace = Sourced(
            DEFAULT_SHUTDOWN_TIMEOUT if declared is None else declared,
            f"rule of backend {spec.name}" if declared is not None else "default",
        )
    notes.note(
        "shutdown_timeout",
        grace.value,
        grace.source,
        "seconds the workers' own shutdown() may take; then SIGTERM, and SIGKILL "
        f"{SIGKILL_AFTER:g} s later",
    )
    signals = overrides.value("forward_signals")
    forwarded: tuple[str, ...] = tuple(signals.value or ())
    if forwarded:
        notes.note(
            "forward_signals",
            list(forwarded),
            signals.source,
            "handlers installed at launch forward these to every worker; restored at shutdown",
        )
    return {
        "rpc_warn_after": float(warn.value),
        "shutdown_timeout": float(grace.value),
        "forward_signals": forwarded,
    }


def _startup_timeout(spec: BackendSpec, overrides: Overrides, notes: Notes) -> Sourced[float]:
    startup: Sourced[float] = overrides.value("startup_timeout", spec.name)
    notes.note("startup_timeout", startup.value, startup.source, STARTUP_REASON)
    return startup


def _preload(spec: BackendSpec, method: str | None, notes: Notes) -> tuple[str, ...]:
    """What the fork server imports; nothing for a start method without one."""
    decision = preload_decision(spec, method)
    if decision is None:
        return ()
    notes.decisions.append(decision)
    return tuple(decision.value)


def _registered_executors() -> dict[str, ExecutorSpec]:
    from hwlaunch.planning.registry import default_registry

    return default_registry().executor_specs


def max_restarts(executor: ExecutorSpec, overrides: Overrides, notes: Notes) -> int:
    """How often a failed worker group is restarted (0: fail-stop); only an executor that
    declares ``restarts`` replaces a group."""
    found = overrides.value("max_restarts")
    value = int(found.value)
    if not executor.restarts and value:
        if executor.in_process:
            why = "runs the worker in this process, which a restart cannot replace"
        elif executor.needs_launcher:
            why = "does not restart worker groups (under a launcher, restarts are the launcher's)"
        else:
            why = "does not restart worker groups"
        notes.warnings.append(
            f"max_restarts {value} (from {found.source}) is not used: the {executor.name} "
            f"executor {why}"
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
            f"{unknown_name_message('backend', chosen.value, specs, backend_aliases(specs))} from "
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
def sized_executor(
    spec: BackendSpec,
    overrides: Overrides,
    notes: Notes,
    executors: Mapping[str, ExecutorSpec],
) -> tuple[Sourced[int], Sourced[int], ExecutorName]:
    """World size and nodes from the settings, then the executor that runs them."""
    world = size("world_size", spec.name, overrides, notes)
    nodes = size("nnodes", spec.name, overrides, notes)
    name = choose_executor(spec, world, nodes, overrides, notes, executors)
    channel = overrides.value("rpc_channel").value
    check_room(executors[name], world.value, world.source, channel, notes.facts.room)
    return world, nodes, name


def choose_executor(
    spec: BackendSpec,
    world: Sourced[int],
    nodes: Sourced[int],
    overrides: Overrides,
    notes: Notes,
    executors: Mapping[str, ExecutorSpec],
) -> ExecutorName:
    """The requested executor if it can run the sizes; else uni, mp or ray by size."""
    if nodes.value > world.value:
        raise ConfigError(
            f"nnodes {nodes.value} (from {nodes.source}) exceeds world_size {world.value} "
            f"(from {world.source}); every node needs at least one worker"
        )
    chosen = overrides.lookup("executor", spec.name)
    if chosen is not None:
        _check_requested_executor(spec, chosen, world, nodes, notes.facts, executors)
        return notes.note("executor", chosen.value, chosen.source, "requested")  # type: ignore[no-any-return]
    device = notes.facts.devices[spec.name]
    count_fact = f"{spec.name}.device_count"
    if nodes.value > 1:
        why = f"{nodes.value} nodes requested; workers span machines"
        return notes.note("executor", ACROSS_NODES, f"nnodes (from {nodes.source})", why)  # type: ignore[no-any-return]
    if world.value == 1:
        return notes.note("executor", SINGLE, "rule", "world size 1 runs in-process")  # type: ignore[no-any-return]
    if spec.is_accelerator and world.value > device.device_count:
        why = (
            f"world size {world.value} exceeds the {device.device_count} local "
            f"{spec.name} devices{notes.facts.mark(count_fact)}; Ray places workers on "
            "other nodes"
        )
        return notes.note("executor", ACROSS_NODES, notes.fact(count_fact), why)  # type: ignore[no-any-return]
    where = (
        f"{device.device_count} local {spec.name} devices" if spec.is_accelerator else "one node"
    )
    why = f"world size {world.value} fits on {where}: local processes"
    return notes.note("executor", LOCAL, "rule", why)  # type: ignore[no-any-return]


def check_executor_names(overrides: Overrides, executors: Mapping[str, ExecutorSpec]) -> None:
    """Every executor named anywhere (flag, env, config file, any backend table) is a
    registered one: a typo in a table for another machine's backend fails here too."""
    named = [overrides.lookup("executor")]
    if overrides.config is not None:
        named += [table.get("executor") for table in overrides.config.backends.values()]
    for found in named:
        if found is not None and found.value not in executors:
            names = list(executors)
            raise ConfigError(
                f"invalid executor {found.value!r} from {found.source}"
                f"{did_you_mean(found.value, names)} (allowed: {', '.join(names) or 'none'}; "
                "`hwlaunch backends --verbose` lists them with their plugins, and any plugin "
                "that failed to load)"
            )


def _check_requested_executor(
    spec: BackendSpec,
    chosen: Sourced[str],
    world: Sourced[int],
    nodes: Sourced[int],
    facts: RuntimeFacts,
    executors: Mapping[str, ExecutorSpec],
) -> None:
    """The registered executor's limits (world size, nodes, one device per local worker)."""
    executor = executors[chosen.value]
    limit, node_limit = executor.max_world_size, executor.max_nodes
    what = f"executor {chosen.value!r} from {chosen.source}"
    if limit is not None and world.value > limit:
        raise ConfigError(
            f"{what} runs at most {limit} worker{'s' if limit > 1 else ''} "
            f"({executor.description}), but world_size is {world.value} (from "
            f"{world.source}). Fix: use {alternatives(executors, world.value, 1)}, or "
            f"world_size {limit}"
        )
    if node_limit is not None and nodes.value > node_limit:
        where = "one node" if node_limit == 1 else f"at most {node_limit} nodes"
        raise ConfigError(
            f"{what} runs on {where}, but nnodes is {nodes.value} (from {nodes.source}). "
            f"Fix: use {alternatives(executors, world.value, nodes.value)}"
        )
    count = facts.devices[spec.name].device_count
    if node_limit == 1 and spec.is_accelerator and world.value > count:
        raise ConfigError(
            f"{what} binds one {spec.name} device per worker, "
            f"but world_size {world.value} (from {world.source}) exceeds the "
            f"{count} local devices{facts.mark(f'{spec.name}.device_count')}. Fix: use "
            f"{alternatives(executors, world.value, 2)} or world_size <= {count}"
        )


def alternatives(executors: Mapping[str, ExecutorSpec], world: int, nodes: int) -> str:
    """ "executor 'ray'": the registered executors that run this many workers and nodes."""
    fits = [
        name
        for name, e in executors.items()
        if not e.needs_launcher
        and (e.max_world_size is None or e.max_world_size >= world)
        and (e.max_nodes is None or e.max_nodes >= nodes)
    ]
    return " or ".join(f"executor {name!r}" for name in fits) or "another executor"


# -- a launcher started the ranks ----------------------------------------------------------
def adopts_launcher(
    spec: BackendSpec,
    overrides: Overrides,
    executors: Mapping[str, ExecutorSpec],
    facts: RuntimeFacts,
) -> str | None:
    """The executor that adopts the launcher's ranks, when a launcher started this process
    and the user chose no executor (or one that adopts a launcher's ranks)."""
    chosen = overrides.lookup("executor", spec.name)
    if chosen is not None and not executors[chosen.value].needs_launcher:
        return None
    if chosen is not None and not facts.launcher.detected:
        raise ConfigError(
            f"executor {chosen.value!r} from {chosen.source} adopts the ranks that torchrun, "
            "srun or mpirun started, but none of them started this process"
            f"{facts.mark('launcher')} (no TORCHELASTIC_RUN_ID, SLURM_PROCID with "
            "SLURM_STEP_NUM_TASKS, OMPI_COMM_WORLD_RANK or PMI_RANK). Fix: start the program "
            "under one of them, choose executor 'uni', 'mp' or 'ray', or see the plan with "
            "--assume launcher=torchrun"
        )
    if not facts.launcher.detected:
        return None
    return str(chosen.value) if chosen is not None else UNDER_LAUNCHER


def launcher_sizes(
    spec: BackendSpec, adopting: str, overrides: Overrides, notes: Notes
) -> tuple[Sourced[int], Sourced[int], ExecutorName]:
    """World size, nodes and executor when a launcher started the ranks, with this rank's
    placement and rendezvous noted."""
    info, mark = notes.facts.launcher, notes.facts.mark("launcher")
    notes.note(
        "launcher",
        info.launcher,
        info.evidence + mark,
        "something else started this process as one rank of the job",
    )
    world = from_launcher("world_size", spec.name, overrides, notes)
    nodes = from_launcher("nnodes", spec.name, overrides, notes)
    executor = notes.note(
        "executor",
        adopting,
        f"fact: launcher {info.launcher}{mark}",
        f"{info.launcher} started the ranks: this process becomes its own rank's "
        "worker, hwlaunch starts no process",
    )
    launcher_decisions(notes)
    return world, nodes, str(executor)


def from_launcher(name: str, backend: str, overrides: Overrides, notes: Notes) -> Sourced[int]:
    """World size or node count as the launcher gives it; a user value must agree."""
    info = notes.facts.launcher
    given = getattr(info, name)
    if given is None:  # an assumed launcher whose variables are not set here
        return size(name, backend, overrides, notes)
    found = overrides.lookup(name, backend)
    if (
        found is not None
        and found is not overrides.defaults.get(name)
        and found.value != given.value
    ):
        raise ConfigError(
            f"{name} {found.value} (from {found.source}) disagrees with the {info.launcher} "
            f"launcher's {name} {given.value} (from {given.source}): {info.launcher} "
            f"started the ranks already. Fix: remove {found.source}, or start "
            f"{info.launcher} with {name} {found.value}"
        )
    value = Sourced(int(given.value), given.source + notes.facts.mark("launcher"))
    notes.note(name, value.value, value.source, f"set by {info.launcher}")
    return value


def launcher_decisions(notes: Notes) -> None:
    """This process's rank and the rendezvous address, each with its source."""
    info, mark = notes.facts.launcher, notes.facts.mark("launcher")
    for name, reason in (
        ("rank", "this process is this rank of the job"),
        ("local_rank", "this rank's device on its node"),
        ("master_addr", "rendezvous address of the process group"),
        ("master_port", "rendezvous port of the process group"),
    ):
        found = getattr(info, name)
        if found is not None:
            notes.note(name, found.value, found.source + mark, reason)
        else:
            notes.note(name, None, f"not set{mark}", f"{reason}: unknown here")
    if info.missing:
        them = "them" if len(info.missing) > 1 else "it"
        notes.warn(
            f"{' and '.join(info.missing)} not set and not derivable for launcher "
            f"{info.launcher}: the ranks need {them} to meet in a process group. Fix: set "
            f"{them} for every rank (e.g. mpirun -x MASTER_ADDR=<host of rank 0> "
            "-x MASTER_PORT=29500)"
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


def _note_binding(spec: BackendSpec, executor: ExecutorSpec, notes: Notes) -> None:
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
    if executor.ray and spec.ray_noset_visibility_var:
        notes.note(
            "ray_noset_visibility_var",
            spec.ray_noset_visibility_var,
            source,
            "set on every actor so that Ray leaves the visibility variable to the binding",
        )


def _env_and_threads(
    spec: BackendSpec,
    executor: ExecutorSpec,
    adopts_launcher: bool,
    sizes: tuple[int, int],
    overrides: Overrides,
    notes: Notes,
) -> tuple[dict[str, str], int | None]:
    """The workers' extra environment (the user's, then the thread budget's variables) and
    their thread count."""
    env, source = worker_env(spec, overrides)
    threads, added = thread_budget(
        spec.name, executor, adopts_launcher, sizes, env, source, overrides, notes
    )
    if added:
        env = {**env, **added}
        source = "cpu_threads" if source == "none" else f"{source} < cpu_threads"
    notes.note("env", env, source, "extra environment for workers")
    return env, threads


def worker_env(spec: BackendSpec, overrides: Overrides) -> tuple[dict[str, str], str]:
    """The backend's worker_env, then the config file's [env], then its [backends.<name>.env],
    with the layers it came from."""
    env = dict(spec.worker_env)
    sources = [f"rule of backend {spec.name}"] if env else []
    config = overrides.config
    if config is not None:
        for layer in (config.env, config.backend_env.get(spec.name)):
            if layer is not None:
                env.update(layer.value)
                sources.append(layer.source)
    return env, " < ".join(sources) or "none"


def _ray_settings(
    executor: ExecutorSpec, overrides: Overrides, notes: Notes
) -> tuple[str | None, float]:
    """The cluster to join and the placement timeout; decided only for an executor that uses
    the Ray settings."""
    if not executor.ray:
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


def _rpc_settings(
    executor: ExecutorSpec, overrides: Overrides, notes: Notes
) -> tuple[str, float | None]:
    """How an executor that carries the rpc channel settings (mp) carries calls; the others
    have their own transport, so the setting is noted only for those that do."""
    channel = overrides.value("rpc_channel")
    spin = overrides.lookup("rpc_spin")
    values = (str(channel.value), None if spin is None else float(spin.value))
    if not executor.rpc_channel:
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
