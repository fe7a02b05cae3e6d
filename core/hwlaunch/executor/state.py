"""ClosedState: whether an executor, or one group of its workers, is closed, why, and the first
death.

Three owners keep this state: every executor (calls after it raise), the mp executor's process
group and the ray executor's actor group (their monitor threads record deaths there). One type,
so that "the first reason stays" and "the first death stays" mean the same in each; each owner
guards its instance with its own lock.
"""

from __future__ import annotations

from hwlaunch.errors import ExecutorClosedError, WorkerDiedError

__all__ = ["ClosedState"]


class ClosedState:
    """Closed or open; the first reason and the first death stay."""

    __slots__ = ("died", "reason")

    def __init__(self) -> None:
        self.reason: str | None = None  # why it closed; None while open
        self.died: WorkerDiedError | None = None  # the first unexpected death

    @property
    def closed(self) -> bool:
        return self.reason is not None

    def close(self, reason: str) -> bool:
        """Closed from now on (the first reason stays); True for the first call."""
        first = self.reason is None
        if first:
            self.reason = reason
        return first

    def record_death(self, died: WorkerDiedError) -> WorkerDiedError:
        """Remember ``died`` unless a death came first; returns the first."""
        if self.died is None:
            self.died = died
        return self.died

    def raise_if_closed(self) -> None:
        """What a call meets now: the first death, or ExecutorClosedError naming why."""
        if self.died is not None:
            raise self.died
        if self.reason is not None:
            raise ExecutorClosedError(
                f"this executor was shut down ({self.reason}); launch a new one"
            )

    def closed_during(self, label: str) -> ExecutorClosedError:
        """The error of a call that was running when the executor closed."""
        return ExecutorClosedError(
            f"the executor was shut down ({self.reason or 'shutdown() was called'}) "
            f"while collective_rpc {label!r} was running"
        )
