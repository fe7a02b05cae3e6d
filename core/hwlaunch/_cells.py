"""Table cells that wrap between words, and inside a long dotted name only at its dots.

Why: rich folds a word wider than its column at any character, so a table showed
``hwlaunch.plugins.cpu.wo`` / ``rker:CPUWorker``, which nobody can search for or copy. A cell
here breaks at spaces first; a word still too wide breaks only after ``.``, ``:``, ``/``, ``,``,
``=`` or ``(``, and the column is never narrower than the widest piece between those, so an
identifier stays whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rich is imported by the callers that render tables, only then
    from rich.console import Console, ConsoleOptions
    from rich.measure import Measurement
    from rich.text import Text

__all__ = ["Cell", "column_widths", "wrap"]

_BREAK = re.compile(r"(?<=[.:/,=(])(?=[\w-])")


def _pieces(word: str) -> list[str]:
    """``hwlaunch.plugins.cpu.worker:CPUWorker`` -> ``hwlaunch.``, ``plugins.``, ...,
    ``CPUWorker``: a word may break after a separator that a name follows."""
    return [piece for piece in _BREAK.split(word) if piece] or [word]


def _wrap_line(text: str, width: int) -> list[str]:
    lines: list[str] = []
    line = ""
    for word in text.split():
        sep = " " if line else ""
        if len(line) + len(sep) + len(word) <= width:
            line += sep + word
            continue
        if len(word) <= width:
            lines.append(line)
            line = word
            continue
        for index, piece in enumerate(_pieces(word)):
            sep = " " if index == 0 and line else ""
            if line and len(line) + len(sep) + len(piece) > width:
                lines.append(line)
                line = piece
            else:
                line += sep + piece
    lines.append(line)
    return lines


def wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters where its pieces allow it."""
    return [line for part in text.split("\n") for line in _wrap_line(part, max(width, 1))]


def narrowest(text: str) -> int:
    """The widest piece of ``text`` that never breaks: a column's least width."""
    return max((len(piece) for word in text.split() for piece in _pieces(word)), default=0)


def widest(text: str) -> int:
    return max(len(line) for line in text.split("\n"))


def column_widths(
    rows: Sequence[Sequence[str]], width: int, weights: tuple[int, ...]
) -> list[int] | None:
    """Content widths for a bordered table of ``rows`` (the header first) that is ``width``
    wide, no column narrower than its widest unbreakable piece: the room left goes, a column
    at a time, to the one that wraps most for its ``weight`` (rich's ``ratio``), up to what
    its text needs; what is left after that to the last column. None when the pieces alone
    are wider than ``width``. (rich's own layout narrows the widest column first, below its
    pieces, which splits names.)"""
    count = len(rows[0])
    widths = [max(narrowest(row[i]) for row in rows) for i in range(count)]
    most = [max(widest(row[i]) for row in rows) for i in range(count)]
    room = width - 3 * count - 1  # a border and a space of padding on each side of a cell
    if room < sum(widths):
        return None
    for _ in range(room - sum(widths)):
        growing = [i for i in range(count) if weights[i] and widths[i] < most[i]]
        if not growing:
            break
        widths[min(growing, key=lambda i: widths[i] / weights[i])] += 1
    widths[-1] += room - sum(widths)
    return widths


class Cell:
    """A rich renderable of plain text (never markup), wrapped by :func:`wrap`."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        from rich.measure import Measurement

        least, most = narrowest(self.text), widest(self.text)
        return Measurement(least, most).clamp(max_width=options.max_width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Text]:
        from rich.text import Text

        yield Text("\n".join(wrap(self.text, options.max_width)), overflow="fold")
