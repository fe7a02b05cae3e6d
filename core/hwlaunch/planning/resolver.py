"""resolve(): gather the inputs (settings, facts, plugins), then apply the rules.

The rules themselves (``rules.decide``) are pure; this module is where the environment, the
config file and the probes are read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

from hwlaunch._checks import did_you_mean
from hwlaunch.errors import BackendUnavailableError
from hwlaunch.plan import Plan
from hwlaunch.planning import settings
from hwlaunch.planning._config import collect_overrides
from hwlaunch.planning.facts import apply_assumptions, gather_facts, parse_assumptions
from hwlaunch.planning.policy import settle
from hwlaunch.planning.registry import Registry, default_registry, strict_from_env
from hwlaunch.planning.rules import decide, draft_plan
from hwlaunch.planning.settings import Sourced

__all__ = ["decide", "resolve", "resolve_with_sources"]


def resolve_with_sources(
    explicit: Mapping[str, object | None],
    sources: Mapping[str, str],
    *,
    config: str | os.PathLike[str] | None = None,
    config_source: str = "resolve(config=)",
    assume: Mapping[str, object] | Iterable[str] | None = None,
    assume_source: str = "resolve(assume=)",
    registry: Registry | None = None,
    defaults: Mapping[str, Sourced[Any]] | None = None,
) -> Plan:
    """resolve() for callers (the CLI) that name their own sources, e.g. ``--start-method``,
    and their own defaults below every user setting."""
    registry = registry or default_registry()
    overrides = collect_overrides(explicit, sources, config, config_source, defaults=defaults)
    specs = registry.specs
    facts = gather_facts(specs)
    assumed = parse_assumptions(assume, assume_source)
    if assumed:
        facts = apply_assumptions(facts, assumed, assume_source)
    problems = [
        f"{p.describe()} failed to load: {p.error} (see `hwlaunch backends`)"
        for p in registry.failures
    ]
    problems += registry.selection_warnings + settings.unknown_variables(os.environ)
    problems += overrides.warnings
    requested = overrides.lookup("backend")
    if requested is not None and requested.value in set(registry.excluded) - set(specs):
        raise BackendUnavailableError(registry.unknown_backend(requested.value, requested.source))
    draft = draft_plan(specs, facts, overrides, problems, registry.executor_specs)
    # The plugins' part, after the pure rules and before the plan is frozen: their hooks are
    # plugin code (policy.settle).
    strict = strict_from_env(os.environ)
    settle(draft, registry, specs[draft.values["backend"]], overrides, os.environ, strict)
    return draft.freeze()


def resolve(
    *,
    backend: str | None = None,
    world_size: int | None = None,
    nnodes: int | None = None,
    executor: str | None = None,
    start_method: str | None = None,
    config: str | os.PathLike[str] | None = None,
    assume: Mapping[str, object] | Iterable[str] | None = None,
    ray_address: str | None = None,
    ray_pg_timeout: float | None = None,
    startup_timeout: float | None = None,
    rpc_channel: str | None = None,
    rpc_spin: float | None = None,
    max_restarts: int | None = None,
    cpu_threads: int | None = None,
    rpc_warn_after: float | None = None,
    shutdown_timeout: float | None = None,
    forward_signals: str | Iterable[str] | None = None,
    console_prefix: str | None = None,
    console_ranks: str | int | list[int] | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    **unknown: NoReturn,
) -> Plan:
    """Decide backend, world size, executor and start method, with a reason for each.

    Explicit arguments beat the environment (``HWLAUNCH_*``), which beats the config file
    (``config``, ``HWLAUNCH_CONFIG``, ./hwlaunch.toml or ``[tool.hwlaunch]`` in
    ./pyproject.toml), which beats the backend's rule. ``assume`` replaces probed facts for
    what-if analysis (``{"cuda.available": True, "cuda.device_count": 2}``).

    The keywords other than ``config`` and ``assume`` are the settings table's rows
    (``hwlaunch.planning.settings.SETTINGS``), read from it; the signature spells them out for
    type checkers and readers, and tests/unit/test_settings_keywords.py holds the two, and
    docs/configuration.md, in step. An unknown keyword is a TypeError with a did-you-mean.
    """
    given = locals()  # first: the keywords as passed, each setting's read by its table row
    if unknown:
        raise TypeError(_unknown_keywords(unknown))
    explicit = {s.name: given[s.name] for s in settings.SETTINGS}
    return resolve_with_sources(explicit, settings.sources("python"), config=config, assume=assume)


def _unknown_keywords(unknown: Mapping[str, object]) -> str:
    known = [*(s.name for s in settings.SETTINGS), "config", "assume"]
    names = ", ".join(f"{n!r}{did_you_mean(n, known)}" for n in sorted(unknown))
    return (
        f"resolve() got an unexpected keyword argument {names}; its keywords are the settings "
        f"({', '.join(s.name for s in settings.SETTINGS)}), config and assume "
        "(docs/configuration.md#every-setting)"
    )
