"""The settings a user can give, as one table: one row per setting.

A row names the setting's keyword (``resolve(world_size=)`` and the config key), its command-line
flag, its environment variable, its parser and allowed values. Everything else is generated from
the table: the ``HWLAUNCH_*`` variables read, the source labels in a plan (``--world-size``,
``env HWLAUNCH_WORLD_SIZE``, ``resolve(world_size=)``), the keys a config file may hold, the
click options of ``hwlaunch resolve`` and ``hwlaunch run``, and the values ``resolve()`` reads
from its keywords. Adding a setting is adding a row, then what the tests ask for where people
read it: its keyword in ``resolve()``'s typed signature (tests/unit/test_settings_keywords.py)
and its row in docs/configuration.md (tests/unit/test_docs.py).

Reading settings has no side effects: nothing here writes the environment or any file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from hwlaunch._checks import ASCII_NUMBER_RULE, closest, did_you_mean, text_float, text_int
from hwlaunch._discovery import PLUGIN_VARIABLES
from hwlaunch.channels import DEFAULT_RPC_CHANNEL, RPC_CHANNELS
from hwlaunch.console import DEFAULT_CONSOLE_PREFIX, RANKS_FORM, parse_ranks, prefix_problem
from hwlaunch.errors import ConfigError
from hwlaunch.spec import START_METHODS

__all__ = [
    "BACKEND_TABLE_KEYS",
    "ENV_CONFIG",
    "ENV_VARS",
    "SETTINGS",
    "TOP_LEVEL_KEYS",
    "ConfigFile",
    "Overrides",
    "Setting",
    "Sourced",
    "parse_setting",
    "read_environment",
    "sources",
    "unknown_variables",
]

T = TypeVar("T")
# Signals a job scheduler or a user sends that a worker may want to act on (SLURM sends SIGUSR1
# before preemption with --signal); not SIGKILL or SIGSTOP, which no process can catch, nor
# SIGHUP, which tells an mp worker that its parent died.
FORWARDABLE_SIGNALS = ("SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGCONT")
ENV_CONFIG = "HWLAUNCH_CONFIG"  # the config file to read; --config and config= beat it
Parser = Callable[[str, object, str], Any]


@dataclass(frozen=True)
class Sourced(Generic[T]):
    """A value and where it came from."""

    value: T
    source: str


def _text(name: str, raw: object, source: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(f"invalid {name} {raw!r} from {source}: must be a non-empty string")
    return raw.strip()


def _path(name: str, raw: object, source: str) -> str:
    """A path: a string, or (from Python) an ``os.PathLike`` such as ``pathlib.Path``."""
    return _text(name, os.fspath(raw) if isinstance(raw, os.PathLike) else raw, source)


def _number(name: str, raw: object, source: str, kind: type, minimum: float) -> Any:
    value: Any = raw
    if isinstance(raw, str):
        value = text_int(raw) if kind is int else text_float(raw)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (kind is int and not isinstance(value, int))
    ):
        what = "an integer" if kind is int else "a number"
        written = f", {ASCII_NUMBER_RULE}" if isinstance(raw, str) else ""
        raise ConfigError(
            f"invalid {name} {raw!r} from {source}: must be {what} >= {minimum:g}{written}"
        )
    if value < minimum or value != value or value == float("inf"):
        raise ConfigError(f"invalid {name} {raw!r} from {source}: must be >= {minimum:g}")
    return value


def _count(name: str, raw: object, source: str) -> int:
    return int(_number(name, raw, source, int, 1))


def _restarts(name: str, raw: object, source: str) -> int:
    return int(_number(name, raw, source, int, 0))


def _seconds(name: str, raw: object, source: str) -> float:
    return float(_number(name, raw, source, float, 0.001))


def _seconds_from_zero(name: str, raw: object, source: str) -> float:
    """Seconds where 0 is meaningful: no polling window (rpc_spin), no watchdog (rpc_warn_after)."""
    return float(_number(name, raw, source, float, 0.0))


# The shortest stall-watchdog wait: each warning first reads the silent ranks' stacks (up to
# 0.3 s, executor._watchdog.FAULT_STACKS) and must be written before the next one is due, at
# twice the wait; and a call of a few milliseconds is no stall.
RPC_WARN_AFTER_MIN = 0.5


def _warn_after(name: str, raw: object, source: str) -> float:
    """``rpc_warn_after``: 0 (no watchdog), or at least ``RPC_WARN_AFTER_MIN`` seconds."""
    value = _seconds_from_zero(name, raw, source)
    if 0 < value < RPC_WARN_AFTER_MIN:
        raise ConfigError(
            f"invalid {name} {raw!r} from {source}: must be 0 (no stall warnings) or at least "
            f"{RPC_WARN_AFTER_MIN:g} seconds: each warning reads the silent ranks' stacks "
            "first, which takes up to 0.3 s, and the next one comes when the wait has doubled"
        )
    return value


def _signal_names(name: str, raw: object, source: str) -> tuple[str, ...]:
    """``"SIGUSR1,SIGTERM"`` (or a list of names; ``USR1`` and any case too) -> names."""
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ConfigError(
            f"invalid {name} {raw!r} from {source}: must be signal names such as "
            f"'SIGUSR1,SIGTERM' (allowed: {', '.join(FORWARDABLE_SIGNALS)})"
        )
    found = []
    for item in (i.strip().upper() for i in items if i.strip()):
        signal_name = item if item.startswith("SIG") else f"SIG{item}"
        if signal_name not in FORWARDABLE_SIGNALS:
            hint = did_you_mean(signal_name, FORWARDABLE_SIGNALS)
            raise ConfigError(
                f"invalid {name} {raw!r} from {source}: {item!r} is not a signal hwlaunch "
                f"forwards{hint} (allowed: {', '.join(FORWARDABLE_SIGNALS)})"
            )
        found.append(signal_name)
    return tuple(dict.fromkeys(found))


def _choice(allowed: tuple[str, ...]) -> Parser:
    def parse(name: str, raw: object, source: str) -> str:
        if not isinstance(raw, str) or raw not in allowed:
            hint = did_you_mean(raw, allowed) if isinstance(raw, str) else ""
            raise ConfigError(
                f"invalid {name} {raw!r} from {source}{hint} (allowed: {', '.join(allowed)})"
            )
        return raw

    return parse


def _prefix(name: str, raw: object, source: str) -> str:
    problem = prefix_problem(raw) if isinstance(raw, str) else "must be a string"
    if problem is not None:
        raise ConfigError(f"invalid {name} {raw!r} from {source}: {problem}")
    assert isinstance(raw, str)
    return raw


def _ranks(name: str, raw: object, source: str) -> tuple[int, ...] | None:
    try:
        return parse_ranks(raw)
    except ValueError as exc:
        raise ConfigError(
            f"invalid {name} {raw!r} from {source}: {exc} (allowed: {RANKS_FORM})"
        ) from None


@dataclass(frozen=True)
class Setting:
    """One row of the table. ``per_backend``: may also be set in a ``[backends.<name>]`` table;
    ``default``: the value when no layer sets it (None: the rules decide)."""

    name: str
    flag: str
    metavar: str
    help: str
    parse: Parser
    allowed: tuple[str, ...] = ()
    per_backend: bool = False
    default: Any = None
    short: str | None = None

    @property
    def env_var(self) -> str:
        return f"HWLAUNCH_{self.name.upper()}"


SETTINGS: tuple[Setting, ...] = (
    Setting("backend", "--backend", "NAME", "Backend name (see `hwlaunch backends`).", _text),
    Setting(
        "world_size",
        "--world-size",
        "N",
        "Number of workers.",
        _count,
        per_backend=True,
        short="-n",
    ),
    Setting(
        "nnodes",
        "--nnodes",
        "N",
        "Number of nodes (more than 1 means Ray).",
        _count,
        per_backend=True,
    ),
    Setting(
        "executor",
        "--executor",
        "NAME",
        "How workers are started: uni, mp, ray, external or a plugin's executor "
        "(see `hwlaunch backends --verbose`).",
        _text,  # checked against the registered executors when a plan is resolved
        per_backend=True,
    ),
    Setting(
        "start_method",
        "--start-method",
        "|".join(START_METHODS),
        "multiprocessing start method for the mp executor.",
        _choice(START_METHODS),
        allowed=START_METHODS,
        per_backend=True,
    ),
    Setting("ray_address", "--ray-address", "ADDR", "Ray cluster to join.", _text),
    Setting(
        "ray_pg_timeout",
        "--ray-pg-timeout",
        "SECONDS",
        "Seconds to wait for Ray to place the workers.",
        _seconds,
        default=60.0,
    ),
    Setting(
        "startup_timeout",
        "--startup-timeout",
        "SECONDS",
        "Seconds every worker has to become ready.",
        _seconds,
        default=600.0,
    ),
    Setting(
        "rpc_channel",
        "--rpc-channel",
        "|".join(RPC_CHANNELS),
        "How the mp executor carries calls: shared memory or each worker's pipe.",
        _choice(RPC_CHANNELS),
        allowed=RPC_CHANNELS,
        default=DEFAULT_RPC_CHANNEL,
    ),
    Setting(
        "rpc_spin",
        "--rpc-spin",
        "SECONDS",
        "Seconds a side of the shm channel polls before it blocks (default: by free CPUs).",
        _seconds_from_zero,
    ),
    Setting(
        "max_restarts",
        "--max-restarts",
        "N",
        "Times a failed worker group is restarted, by an executor that declares restarts "
        "(mp, ray; 0: fail-stop).",
        _restarts,
        default=0,
    ),
    # -- operating the workers: the stall watchdog, the shutdown grace, forwarded signals --
    Setting(
        "rpc_warn_after",
        "--rpc-warn-after",
        "SECONDS",
        "Seconds a collective_rpc waits before a warning shows the silent ranks' stacks "
        f"(again at each doubling; 0: never; else at least {RPC_WARN_AFTER_MIN:g}).",
        _warn_after,
        default=60.0,
    ),
    Setting(
        "shutdown_timeout",
        "--shutdown-timeout",
        "SECONDS",
        "Seconds the workers' own shutdown() may take before SIGTERM (default: the backend's).",
        _seconds,
        per_backend=True,
    ),
    Setting(
        "forward_signals",
        "--forward-signals",
        "SIGNALS",
        "Signals this process forwards to every worker, e.g. SIGUSR1,SIGTERM (default: none; "
        "no handler is installed).",
        _signal_names,
        allowed=FORWARDABLE_SIGNALS,
    ),
    Setting(
        "cpu_threads",
        "--cpu-threads",
        "N",
        "Intra-op CPU threads per worker (default: this process's CPUs / workers on the node).",
        _count,
        per_backend=True,
    ),
    # Worker output (docs/operations.md): read by executors that declare worker_output.
    Setting(
        "console_prefix",
        "--console-prefix",
        "TEMPLATE",
        "Prefix of each line a worker prints; fields {rank}, {local_rank}, {pid}, {backend}, "
        "{node}.",
        _prefix,
        default=DEFAULT_CONSOLE_PREFIX,
    ),
    Setting(
        "console_ranks",
        "--console-ranks",
        "RANKS",
        "Ranks whose output reaches the console: all, or a list like 0,2-3.",
        _ranks,
    ),
    Setting(
        "log_dir",
        "--log-dir",
        "DIR",
        "Directory for each rank's stdout and stderr files (one set per restart attempt).",
        _path,
    ),
)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
ENV_VARS: dict[str, str] = {s.name: s.env_var for s in SETTINGS}
TOP_LEVEL_KEYS = (*BY_NAME, "env", "backends")
BACKEND_TABLE_KEYS = (*(s.name for s in SETTINGS if s.per_backend), "env")


def sources(kind: str) -> dict[str, str]:
    """The label of each setting given explicitly: ``"cli"`` (``--world-size``) or ``"python"``
    (``resolve(world_size=)``)."""
    if kind == "cli":
        return {s.name: s.flag for s in SETTINGS}
    return {s.name: f"resolve({s.name}=)" for s in SETTINGS}


def parse_setting(name: str, raw: object, source: str) -> Any:
    """Validate one setting's raw value (a string from env/CLI, or a native TOML/Python value)."""
    if name not in BY_NAME:
        raise ConfigError(f"unknown setting {name!r} from {source}{did_you_mean(name, BY_NAME)}")
    return BY_NAME[name].parse(name, raw, source)


def read_environment(environ: Mapping[str, str]) -> dict[str, Sourced[Any]]:
    """The ``HWLAUNCH_*`` settings present (empty values count as unset)."""
    found: dict[str, Sourced[Any]] = {}
    for setting in SETTINGS:
        raw = environ.get(setting.env_var, "")
        if raw.strip():
            source = f"env {setting.env_var}"
            found[setting.name] = Sourced(parse_setting(setting.name, raw, source), source)
    return found


ENV_PREFIX = "HWLAUNCH_"


def known_variables() -> tuple[str, ...]:
    """Every ``HWLAUNCH_*`` variable hwlaunch reads: one per setting, the config file, and the
    plugin selection variables."""
    return (*ENV_VARS.values(), ENV_CONFIG, *PLUGIN_VARIABLES)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning for each ``HWLAUNCH_*`` variable (any case) that hwlaunch does not read: a
    misspelt one would otherwise be ignored without a word."""
    known = known_variables()
    found = []
    for name in sorted(environ):
        if name.upper().startswith(ENV_PREFIX) and name not in known:
            # Compared without the shared prefix, which would make every name look close.
            meant = closest(name[len(ENV_PREFIX) :], [k[len(ENV_PREFIX) :] for k in known])
            hint = f"; did you mean {ENV_PREFIX + meant}?" if meant else ""
            found.append(
                f"environment variable {name} is not one hwlaunch reads, so it is ignored"
                f"{hint} (known: {', '.join(sorted(known))})"
            )
    return found


@dataclass
class ConfigFile:
    """A parsed config file: top-level settings and per-backend tables, each value sourced.

    ``backend_tables`` maps each ``[backends.<name>]`` to where it is written, so that a table
    naming no registered backend can be reported at its line.
    """

    path: Path
    settings: dict[str, Sourced[Any]] = field(default_factory=dict)
    env: Sourced[dict[str, str]] | None = None
    backends: dict[str, dict[str, Sourced[Any]]] = field(default_factory=dict)
    backend_env: dict[str, Sourced[dict[str, str]]] = field(default_factory=dict)
    backend_tables: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Overrides:
    """All user-supplied settings, by layer."""

    explicit: dict[str, Sourced[Any]] = field(default_factory=dict)
    environment: dict[str, Sourced[Any]] = field(default_factory=dict)
    config: ConfigFile | None = None
    defaults: dict[str, Sourced[Any]] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()  # about the layers themselves (a config file skipped)

    def lookup(self, name: str, backend: str | None = None) -> Sourced[Any] | None:
        """The winning value for ``name``: explicit > env > [backends.<b>] > top-level file >
        the caller's defaults (``hwlaunch run`` defaults to world size 2)."""
        if name in self.explicit:
            return self.explicit[name]
        if name in self.environment:
            return self.environment[name]
        if self.config is not None:
            if backend is not None and name in self.config.backends.get(backend, {}):
                return self.config.backends[backend][name]
            if name in self.config.settings:
                return self.config.settings[name]
        return self.defaults.get(name)

    def value(self, name: str, backend: str | None = None) -> Sourced[Any]:
        """The winning value, or the table's default (source ``default``)."""
        found = self.lookup(name, backend)
        return found if found is not None else Sourced(BY_NAME[name].default, "default")
