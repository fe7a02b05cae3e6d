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

    from hwlaunch._cells import Cell, column_widths

    header = ("setting", "value", "source", "reason")
    rows = [header]
    for d in plan.decisions:
        value = d.value if not isinstance(d.value, dict) else _env_text(d.value)
        rows.append((d.setting, "-" if value is None else str(value), d.source, d.reason))
    # Widths that keep every name whole (a Cell wraps a dotted name only at its dots), as far as
    # the width allows; else rich's own layout.
    widths = column_widths(rows, width, weights=(0, 3, 3, 5))
    table = Table(
        title=Text(f"hwlaunch plan: {plan.backend} x{plan.world_size}"),
        title_justify="left",
        expand=widths is None,
    )
    for index, name in enumerate(header):
        table.add_column(
            name, no_wrap=index == 0, overflow="fold", width=widths[index] if widths else None
        )
    for cells in rows[1:]:
        # Text and Cell, not str: "hwlaunch.toml:3 [backends.cuda]" is not markup.
        table.add_row(Text(cells[0]), *(Cell(cell) for cell in cells[1:]))
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, no_color=True, highlight=False)
    console.print(table)
    for warning in plan.warnings:
        console.print(f"warning: {warning}", soft_wrap=True, markup=False)
    if plan.facts is not None and plan.facts.assumed:
        console.print(f"assumed facts: {', '.join(sorted(plan.facts.assumed))}", markup=False)
    return _tidy(buffer.getvalue())


def _tidy(text: str) -> str:
    """Lines without the padding rich adds (the title is padded to the table's width), and one
    newline at the end, as a printed block of text should have."""
    return "".join(f"{line.rstrip()}\n" for line in text.splitlines())


def _env_text(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "{}"
