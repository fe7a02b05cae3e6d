"""The plan while it is being decided: the rules' values and notes, then the plugins' accepted
proposals, frozen into a Plan once.

Why: a Plan is frozen data that a worker receives. Building one from the rules and then
rewriting it with ``dataclasses.replace`` for every accepted plugin proposal made the plan a
thing decided twice, with the second pass re-deriving what the first had settled. The rules
and the policy write into this draft instead, in that order, and ``freeze`` makes the one Plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from hwlaunch._start_methods import StartMethodKind, kind_of
from hwlaunch.plan import Decision, Plan
from hwlaunch.planning.notes import Notes
from hwlaunch.runtime_facts import RuntimeFacts

__all__ = ["Draft"]

_FROM_NOTES = ("decisions", "warnings")


@dataclass
class Draft:
    """``values``: the Plan's fields but its decisions and warnings, which ``notes`` holds.
    Read by a plugin's ``PlanDraft`` as ``decisions``, ``facts`` and ``executor``."""

    values: dict[str, Any]
    notes: Notes

    @classmethod
    def of(cls, plan: Plan) -> Draft:
        """A frozen plan opened again, for a caller that holds one (a table test, the
        conformance suite) and applies proposals to it."""
        assert plan.facts is not None, "a plan without facts cannot be judged"
        values = {f.name: getattr(plan, f.name) for f in fields(plan) if f.name not in _FROM_NOTES}
        return cls(values, Notes(plan.facts, list(plan.decisions), list(plan.warnings)))

    @property
    def decisions(self) -> Sequence[Decision]:
        return self.notes.decisions

    @property
    def facts(self) -> RuntimeFacts:
        return self.notes.facts

    @property
    def executor(self) -> str:
        return str(self.values["executor"])

    @property
    def start_kind(self) -> StartMethodKind | None:
        method = self.values["start_method"]
        return None if method is None else kind_of(method)

    def decide(self, setting: str, value: Any, source: str, reason: str) -> None:
        """Set ``setting``'s decision: in its place when there is one, else last."""
        new = Decision(setting, value, source, reason)
        decisions = self.notes.decisions
        at = next((i for i, d in enumerate(decisions) if d.setting == setting), None)
        if at is None:
            decisions.append(new)
        else:
            decisions[at] = new

    def forget(self, setting: str) -> None:
        """No decision for ``setting`` (a value that no longer applies)."""
        self.notes.decisions[:] = [d for d in self.notes.decisions if d.setting != setting]

    def freeze(self) -> Plan:
        """The Plan, made once; a warning said twice is kept once."""
        return Plan(
            **self.values,
            decisions=tuple(self.notes.decisions),
            warnings=tuple(dict.fromkeys(self.notes.warnings)),
        )
