"""Plan: the resolver's decision, with a source and a reason for every setting."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

from hwlaunch.facts import RuntimeFacts


@dataclass(frozen=True)
class Decision:
    setting: str
    value: Any
    source: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "setting": self.setting,
            "value": self.value,
            "source": self.source,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Plan:
    """How to start the workers. Pure data: it can be pickled, printed and compared."""

    backend: str
    world_size: int
    nnodes: int
    executor: str
    start_method: str | None
    dist_backend: str
    worker: str
    device_control_env_var: str | None
    ray_resource: str
    env: dict[str, str] = field(default_factory=dict)
    preload: tuple[str, ...] = ()
    ray_address: str | None = None
    ray_pg_timeout: float = 60.0
    max_restarts: int = 0
    decisions: tuple[Decision, ...] = ()
    warnings: tuple[str, ...] = ()
    facts: RuntimeFacts | None = None

    def decision(self, setting: str) -> Decision:
        for decision in self.decisions:
            if decision.setting == setting:
                return decision
        raise KeyError(
            f"no decision for {setting!r}; decided: {[d.setting for d in self.decisions]}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "world_size": self.world_size,
            "nnodes": self.nnodes,
            "executor": self.executor,
            "start_method": self.start_method,
            "dist_backend": self.dist_backend,
            "worker": self.worker,
            "device_control_env_var": self.device_control_env_var,
            "ray_resource": self.ray_resource,
            "env": dict(self.env),
            "preload": list(self.preload),
            "ray_address": self.ray_address,
            "ray_pg_timeout": self.ray_pg_timeout,
            "max_restarts": self.max_restarts,
            "decisions": [d.to_dict() for d in self.decisions],
            "warnings": list(self.warnings),
            "facts": self.facts.to_dict() if self.facts is not None else None,
        }

    def explain(self, width: int = 110) -> str:
        """A table of settings, values, sources and reasons, then the warnings."""
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        table = Table(
            title=Text(f"hwlaunch plan: {self.backend} x{self.world_size}"),
            title_justify="left",
            expand=True,
        )
        table.add_column("setting", no_wrap=True)
        table.add_column("value", overflow="fold", ratio=3)
        table.add_column("source", overflow="fold", ratio=3)
        table.add_column("reason", overflow="fold", ratio=5)
        for d in self.decisions:
            value = d.value if not isinstance(d.value, dict) else _env_text(d.value)
            cells = (d.setting, "-" if value is None else str(value), d.source, d.reason)
            # Text, not str: a source such as "hwlaunch.toml:3 [backends.cuda]" is not markup.
            table.add_row(*(Text(cell) for cell in cells))
        buffer = io.StringIO()
        console = Console(file=buffer, width=width, no_color=True, highlight=False)
        console.print(table)
        for warning in self.warnings:
            console.print(f"warning: {warning}", soft_wrap=True, markup=False)
        if self.facts is not None and self.facts.assumed:
            console.print(f"assumed facts: {', '.join(sorted(self.facts.assumed))}", markup=False)
        return buffer.getvalue()


def _env_text(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "{}"
