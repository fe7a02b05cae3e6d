"""Executors (uni, mp, ray, external) and what an executor plugin builds one from.

An executor plugin subclasses :class:`Executor` and implements its public extension points
(``start_ranks``, ``exchange``, ``stop_ranks``; ``start()`` calls the first, never the
constructor). Its worker side uses the same functions as
the built-in executors, so a worker behaves the same whichever executor hosts it:
``start_worker`` builds the backend's worker and runs its start-up, ``answer`` runs one
encoded request on it and encodes the reply (``(ok, value)``; a Failure when not ok), and the
parent encodes requests with ``encode_method`` and ``dumps``, raises a rank's Failure with
``raise_first_failure``, and gives each worker ``worker_environment``.
"""

from __future__ import annotations

from hwlaunch.executor._runtime import (
    Failure,
    answer,
    dumps,
    encode_extension,
    encode_method,
    loads,
    method_label,
    start_worker,
)
from hwlaunch.executor.base import (
    Executor,
    StatusCallback,
    free_port,
    raise_first_failure,
    worker_environment,
)

__all__ = [
    "Executor",
    "Failure",
    "StatusCallback",
    "answer",
    "dumps",
    "encode_extension",
    "encode_method",
    "free_port",
    "loads",
    "method_label",
    "raise_first_failure",
    "start_worker",
    "worker_environment",
]
