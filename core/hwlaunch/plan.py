"""Plan: the resolver's decision, with a source and a reason for every setting.

This module is the data a resolution produces and a worker receives: plain frozen dataclasses
(the plan and its decisions; the runtime facts it was made from are ``hwlaunch.runtime_facts``)
that import nothing of the planning layer, so a worker that unpickles a Plan loads only these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hwlaunch._data import fields_of
from hwlaunch._start_methods import StartMethodKind, kind_of
from hwlaunch.channels import DEFAULT_RPC_CHANNEL
from hwlaunch.console import DEFAULT_CONSOLE_PREFIX
from hwlaunch.runtime_facts import RuntimeFacts
from hwlaunch.spec import StartMethod

SIGKILL_AFTER = 2.0  # seconds from SIGTERM to SIGKILL, once a worker's shutdown grace is over

# An executor is named by its registered ExecutorSpec (built-in or a plugin's): any string the
# registry knows, checked when a plan is resolved.
ExecutorName = str


@dataclass(frozen=True)
class Decision:
    """One setting of a plan: its value, where the value came from, and why.

    ``source`` names the winning layer (``--start-method``, ``env HWLAUNCH_START_METHOD``,
    ``hwlaunch.toml:3``, ``rule of backend cuda``, ``fact: cuda.initialized``); ``reason`` says
    why the rules kept or changed it. ``explain()`` and ``--json`` show one row per Decision.
    """

    setting: str
    value: Any
    source: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return fields_of(self)


@dataclass(frozen=True)
class Plan:
    """How to start the workers. Pure data: it can be pickled, printed and compared."""

    backend: str
    world_size: int
    nnodes: int
    executor: ExecutorName
    start_method: StartMethod | None
    dist_backend: str
    worker: str
    device_control_env_var: str | None
    ray_resource: str
    env: dict[str, str] = field(default_factory=dict)
    preload: tuple[str, ...] = ()
    ray_address: str | None = None
    ray_pg_timeout: float = 60.0
    startup_timeout: float = 600.0
    rpc_channel: str = DEFAULT_RPC_CHANNEL
    rpc_spin: float | None = None  # None: SPIN_WITH_FREE_CPUS if each worker has a CPU, else 0
    max_restarts: int = 0
    cpu_threads: int | None = None  # torch.set_num_threads in each worker; None: left alone
    decisions: tuple[Decision, ...] = ()
    warnings: tuple[str, ...] = ()
    facts: RuntimeFacts | None = None
    device_binding: str = "none"
    propagate_env: tuple[str, ...] = ()  # names and prefixes ("HABANA_*"), never values
    ray_noset_visibility_var: str | None = None
    worker_setup: tuple[str, ...] = ()  # plugins whose hwlaunch_worker_setup runs, in order
    # A launcher started the ranks (the executor declares needs_launcher): each worker takes its
    # rank, rendezvous and device from the launcher's variables.
    ranks_from_launcher: bool = False
    # Operating the workers (docs/operations.md): the stall watchdog's first warning (0: off),
    # the grace the workers' own shutdown() has before SIGTERM, the signals forwarded to them.
    rpc_warn_after: float = 60.0
    shutdown_timeout: float = 5.0
    forward_signals: tuple[str, ...] = ()
    # Worker output, for an executor that declares worker_output (docs/operations.md): the
    # template each console line starts with, the ranks shown there (None: all), the directory
    # of the log files (absolute), and this run's directory under it, <log_dir>/<run id>, which
    # the executor chooses and creates when it starts (None until then).
    console_prefix: str = DEFAULT_CONSOLE_PREFIX
    console_ranks: tuple[int, ...] | None = None
    log_dir: str | None = None
    log_run_dir: str | None = None

    @property
    def start_kind(self) -> StartMethodKind | None:
        """The start method as an object (what it copies, re-imports, preloads); None for an
        executor that starts no local processes. ``start_method`` stays its name, as in JSON."""
        return None if self.start_method is None else kind_of(self.start_method)

    def decision(self, setting: str) -> Decision:
        for decision in self.decisions:
            if decision.setting == setting:
                return decision
        raise KeyError(
            f"no decision for {setting!r}; decided: {[d.setting for d in self.decisions]}"
        )

    def to_dict(self) -> dict[str, Any]:
        return fields_of(self)

    def explain(self, width: int = 110) -> str:
        """A table of settings, values, sources and reasons, then the warnings."""
        from hwlaunch._plan_table import plan_table

        return plan_table(self, width)
