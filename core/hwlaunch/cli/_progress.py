"""Progress of ``hwlaunch run``: a live per-rank table on a terminal, plain phase lines elsewhere.

A pipe sees a line per phase, with the seconds since the job began, on stderr: a piped run is
never silent while workers start and models load, and stdout keeps only the report (with
``--json``, one parseable object).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


def progress_style(reports: bool, as_json: bool) -> str:
    """ "live" (a per-rank table) on a terminal, "lines" (one plain line per phase, on stderr)
    where stdout is a pipe or carries JSON, "quiet" for the ranks that do not report."""
    if not reports:
        return "quiet"
    return "live" if sys.stdout.isatty() and not as_json else "lines"


@dataclass
class Progress:
    """Per-rank status, shown live on a terminal; elsewhere one line per phase on stderr (stdout
    keeps the report, and with ``--json`` stays one parseable object)."""

    world_size: int
    style: str
    status: dict[int, str] = field(default_factory=dict)
    _live: Any = None
    _started: float = field(default_factory=time.perf_counter)

    def __call__(self, rank: int, status: str) -> None:
        self.status[rank] = status
        self._refresh()

    def all(self, status: str) -> None:
        for rank in range(self.world_size):
            self.status[rank] = status
        self._refresh()

    def phase(self, text: str) -> None:
        """A phase of the job begins: the table's status, or a line with the time so far."""
        if self.style == "lines":
            elapsed = time.perf_counter() - self._started
            print(f"hwlaunch run [{elapsed:6.1f}s] {text}", file=sys.stderr, flush=True)
        self.all(text)

    def _table(self) -> Any:
        from rich.table import Table

        table = Table(title="workers", title_justify="left")
        table.add_column("rank")
        table.add_column("status")
        for rank in range(self.world_size):
            table.add_row(str(rank), self.status.get(rank, "starting"))
        return table

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._table())

    @contextmanager
    def shown(self) -> Iterator[Progress]:
        if self.style != "live":
            yield self
            return
        from rich.console import Console
        from rich.live import Live

        console = Console(stderr=True)
        with Live(self._table(), console=console, refresh_per_second=8, transient=False) as live:
            self._live = live
            try:
                yield self
            finally:
                self._live = None
        console.print()
