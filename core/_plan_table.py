"""``plan.explain()``: the plan as a table for people (rich is imported only here)."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hwlaunch.plan import Plan


def plan_table(plan: Plan, width: int) -> str:
    """A table of settings, values, sources and reasons, then the warnings and assumed facts."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title=Text(f"hwlaunch plan: {plan.backend} x{plan.world_size}"),
        title_justify="left",
        expand=True,
    )
    table.add_column("setting", no_wrap=True)
    table.add_column("value", overflow="fold", ratio=3)
    table.add_column("source", overflow="fold", ratio=3)
    table.add_column("reason", overflow="fold", ratio=5)
    for d in plan.decisions:
        value = d.value if not isinstance(d.value, dict) else _env_text(d.value)
        cells = (d.setting, "-" if value is None else str(value), d.source, d.reason)
        # Text, not str: a source such as "hwlaunch.toml:3 [backends.cuda]" is not markup.
        table.add_row(*(Text(cell) for cell in cells))
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, no_color=True, highlight=False)
    console.print(table)
    for warning in plan.warnings:
        console.print(f"warning: {warning}", soft_wrap=True, markup=False)
    if plan.facts is not None and plan.facts.assumed:
        console.print(f"assumed facts: {', '.join(sorted(plan.facts.assumed))}", markup=False)
    return buffer.getvalue()


def _env_text(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "{}"
