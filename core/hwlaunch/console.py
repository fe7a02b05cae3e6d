"""What the worker-output settings accept: the console prefix's fields and the rank lists.

Shared by the settings table (which validates a value where it is given, naming its source) and
the executors (which format the prefix for each rank), so here, below both. Pure functions of
strings: no process, no file.
"""

from __future__ import annotations

import string
from collections.abc import Iterable

from hwlaunch._checks import text_int

__all__ = [
    "DEFAULT_CONSOLE_PREFIX",
    "PREFIX_FIELDS",
    "RANKS_FORM",
    "format_prefix",
    "parse_ranks",
    "prefix_problem",
]

# The fields a console_prefix template may name, each with a sample value for validation.
PREFIX_FIELDS = {"rank": 0, "local_rank": 0, "pid": 1234, "backend": "cpu", "node": "host"}
DEFAULT_CONSOLE_PREFIX = "[rank{rank} pid={pid}] "
RANKS_FORM = "'all', or ranks and ranges separated by commas, like '0' or '0,2-3'"


def prefix_problem(template: str) -> str | None:
    """Why ``template`` is not a usable prefix (an unknown field, a bad format), or None."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        return f"{exc} (write a literal brace as {{{{ or }}}})"
    fields = ", ".join(f"{{{name}}}" for name in PREFIX_FIELDS)
    for name in names:
        if name not in PREFIX_FIELDS:
            shown = f"{{{name}}}" if name else "{} (a field needs a name)"
            return f"unknown field {shown} (fields: {fields})"
    try:
        template.format(**PREFIX_FIELDS)
    except (ValueError, TypeError) as exc:
        return f"{exc} (fields: {fields})"
    return None


def format_prefix(
    template: str, *, rank: int, local_rank: int, pid: int | None, backend: str, node: str
) -> str:
    """The prefix of one rank's lines (a template that ``prefix_problem`` accepted)."""
    return template.format(
        rank=rank,
        local_rank=local_rank,
        pid="?" if pid is None else pid,
        backend=backend,
        node=node,
    )


def parse_ranks(raw: object) -> tuple[int, ...] | None:
    """``"all"`` -> None (every rank); ``"0,2-3"``, ``2`` or ``[0, 2]`` -> the sorted ranks.

    Raises ValueError with the part that is wrong; the caller adds where the value came from.
    """
    if isinstance(raw, str):
        text = raw.strip()
        if text.lower() == "all":
            return None
        return _sorted_unique(_rank_part(part) for part in text.split(","))
    if isinstance(raw, int) and not isinstance(raw, bool):
        return _sorted_unique([[_rank(raw, raw)]])
    if isinstance(raw, list | tuple) and raw:
        return _sorted_unique([[_rank(item, item)] for item in raw])
    raise ValueError(f"{raw!r} is not a rank list")


def _sorted_unique(groups: Iterable[list[int]]) -> tuple[int, ...]:
    return tuple(sorted({rank for group in groups for rank in group}))


def _rank(raw: object, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{raw!r} is not a rank (an integer >= 0)")
    return value


def _rank_part(part: str) -> list[int]:
    text = part.strip()
    first, dash, last = text.partition("-")
    low = text_int(first)
    high = text_int(last) if dash else low
    if low is None or high is None:
        raise ValueError(f"{text!r} is not a rank or a range like 2-3")
    low, high = _rank(text, low), _rank(text, high)
    if high < low:
        raise ValueError(f"range {text!r} ends before it starts")
    return list(range(low, high + 1))
