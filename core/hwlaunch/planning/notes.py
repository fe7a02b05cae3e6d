"""The accumulator of one resolution: the decisions made so far and the warnings raised.

The rules are functions; this is the only state they share, so a rule can record why it chose
a value without returning the reason through every caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hwlaunch.plan import Decision
from hwlaunch.runtime_facts import RuntimeFacts

__all__ = ["Notes"]


@dataclass
class Notes:
    facts: RuntimeFacts
    decisions: list[Decision] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def note(self, setting: str, value: Any, source: str, reason: str) -> Any:
        """Record the decision for ``setting`` and return its value."""
        self.decisions.append(Decision(setting, value, source, reason))
        return value

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    def fact(self, key: str) -> str:
        """The source label of a fact, marked when it was assumed."""
        return f"fact: {key}{self.facts.mark(key)}"
