"""PlanDraft: what a plugin's ``hwlaunch_adjust_plan`` receives, part of the plugin contract.

The decided plan, read-only, and ``propose(setting, value, reason)``, which checks the value's
type and records the proposal as data. Whether a proposal holds is the planning layer's
decision (``hwlaunch.planning.policy``), made after the hook returns; this module imports
nothing of that layer, so the contract's hookspecs can name the type.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from hwlaunch._checks import did_you_mean, env_value_problem
from hwlaunch.errors import PluginError
from hwlaunch.plan import Decision
from hwlaunch.runtime_facts import RuntimeFacts
from hwlaunch.spec import START_METHODS, BackendSpec

__all__ = ["SETTINGS", "PlanDraft", "Proposal"]

SETTINGS = ("start_method", "worker", "dist_backend", "env", "preload")
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE = re.compile(r"^[A-Za-z_][\w.]*$")


@dataclass(frozen=True)
class Proposal:
    plugin: str
    setting: str
    value: Any
    reason: str


class Decided(Protocol):
    """What a draft shows of the plan being decided: a Plan, or the planning layer's draft of
    one before it is frozen."""

    @property
    def decisions(self) -> Sequence[Decision]: ...
    @property
    def facts(self) -> RuntimeFacts | None: ...
    @property
    def executor(self) -> str: ...


class PlanDraft:
    """What ``hwlaunch_adjust_plan`` receives: the decided plan, read-only, and ``propose``."""

    def __init__(self, plan: Decided, spec: BackendSpec, plugin: str) -> None:
        self._plan = plan
        self._spec = spec
        self._plugin = plugin
        self.proposals: list[Proposal] = []

    @property
    def backend(self) -> BackendSpec:
        """The chosen backend's spec (frozen)."""
        return self._spec

    @property
    def facts(self) -> RuntimeFacts:
        """The runtime facts the rules used (frozen; assumed ones are marked)."""
        assert self._plan.facts is not None
        return self._plan.facts

    @property
    def decisions(self) -> Mapping[str, Decision]:
        """Every decision so far (value, source, reason), by setting; read-only."""
        return MappingProxyType({d.setting: d for d in self._plan.decisions})

    @property
    def executor(self) -> str:
        return self._plan.executor

    def propose(self, setting: str, value: Any, reason: str) -> None:
        """Propose ``value`` for ``setting``, with the reason the plan will show."""
        what = f"plugin {self._plugin!r} proposed {setting}={value!r}"
        if setting not in SETTINGS:
            raise PluginError(
                f"plugin {self._plugin!r} proposed unknown setting {setting!r}"
                f"{did_you_mean(str(setting), SETTINGS)} (settings a plugin may propose: "
                f"{', '.join(SETTINGS)})"
            )
        if not isinstance(reason, str) or not reason.strip():
            raise PluginError(f"{what} without a reason; pass a non-empty reason string")
        self.proposals.append(
            Proposal(self._plugin, setting, _checked(setting, value, what), reason)
        )


def _checked(setting: str, value: Any, what: str) -> Any:
    if setting == "start_method" and value not in START_METHODS:
        raise PluginError(f"{what}: not a start method; allowed: {list(START_METHODS)}")
    if setting == "worker" and not (isinstance(value, str) and _IMPORT_PATH.match(value)):
        raise PluginError(f"{what}: must be an import path 'package.module:Class'")
    if setting == "dist_backend" and not (isinstance(value, str) and value):
        raise PluginError(f"{what}: must be a non-empty string")
    if setting == "env":
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and _ENV_NAME.match(k) for k in value
        ):
            raise PluginError(f"{what}: must map environment variable names to strings")
        for key, text in value.items():
            problem = env_value_problem(text)
            if problem is not None:
                raise PluginError(f"{what}: {key} = {problem}")
        return dict(value)
    if setting == "preload":
        if (
            isinstance(value, str)
            or not isinstance(value, (tuple, list))
            or not all(isinstance(m, str) and _MODULE.match(m) for m in value)
        ):
            raise PluginError(f"{what}: must be a tuple of module names")
        return tuple(value)
    return value
