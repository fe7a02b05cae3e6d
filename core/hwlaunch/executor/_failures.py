"""A rank's failure, as the caller meets it: the error vocabulary's start-up and call errors.

Kept apart so that everything that turns a worker's ``Failure`` into an exception (the executor
skeleton, its call path, the restart controller, a plugin's executor) raises the same one.
"""

from __future__ import annotations

from collections.abc import Mapping

from hwlaunch.errors import ReplyDecodeError, WorkerError, WorkerStartupError
from hwlaunch.executor._runtime import Failure

__all__ = ["raise_first_failure", "startup_failure"]


def startup_failure(rank: int, failure: Failure, note: str = "") -> WorkerStartupError:
    """A worker's own start-up exception, with its traceback (and ``note``: what the driver
    knows of why, such as a machine out of room for more processes)."""
    return WorkerStartupError(
        rank, f"{failure.exc_type}: {failure.message}{note}", failure.traceback
    )


def raise_first_failure(failures: Mapping[int, Failure], label: str = "") -> None:
    """Raise the lowest failing rank's exception as WorkerError, naming the other ranks; a
    reply the driver could not decode (``Failure.undecodable``) as ReplyDecodeError, which
    names the driver, not the worker, and the call ``label``."""
    if not failures:
        return
    rank = min(failures)
    failure = failures[rank]
    others = sorted(set(failures) - {rank})
    if failure.undecodable:
        alike = [r for r in others if failures[r].undecodable]
        rest = [r for r in others if not failures[r].undecodable]
        note = (
            f"; rank {alike[0]}'s reply could not be decoded either"
            if len(alike) == 1
            else f"; ranks {alike}' replies could not be decoded either"
            if alike
            else ""
        ) + (f" (ranks {rest} failed too)" if rest else "")
        raise ReplyDecodeError(
            rank, failure.exc_type, failure.message, failure.traceback, label, note
        )
    message = failure.message + (f" (ranks {others} failed too)" if others else "")
    raise WorkerError(rank, failure.exc_type, message, failure.traceback)
