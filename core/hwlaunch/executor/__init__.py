"""Executors (uni, mp, ray, external) and what an executor plugin builds one from.

An executor plugin subclasses :class:`Executor` and implements its public extension points
(``start_ranks``, ``exchange``, ``stop_ranks``; ``start()`` calls the first, never the
constructor). The uni, mp and ray executors and a plugin's build their worker with
``start_worker`` (the backend's worker class with the extension, then its start-up), and the
external executor from the same parts, so a worker starts the same whichever executor hosts
it. Every request and reply is encoded in one place, ``hwlaunch.executor.transport.codec``:
``answer`` runs one pickled request and pickles the reply (``(ok, value)``; a Failure when not
ok), which the ray executor's actors and a plugin's workers use; the mp executor's workers run
each request through the same step (``_runtime.outcome``) and encode the reply with the mp
channels' frames (``FRAMES`` there); the uni and external executors call the worker in this
process, with nothing encoded. The parent encodes requests with ``encode_method`` and
``dumps``, raises a rank's Failure with ``raise_first_failure``, and gives each worker
``worker_environment``.
"""

from __future__ import annotations

from hwlaunch.executor._encoding import encode_extension, encode_method, method_label
from hwlaunch.executor._runtime import Failure, start_worker
from hwlaunch.executor.base import (
    Executor,
    ExecutorOptions,
    StatusCallback,
    free_port,
    raise_first_failure,
    worker_environment,
)
from hwlaunch.executor.transport.codec import answer, dumps, loads

__all__ = [
    "Executor",
    "ExecutorOptions",
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
