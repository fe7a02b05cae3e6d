"""The codecs every executor encodes its calls and replies with, and a worker's ``answer``.

Why: "where is a reply encoded?" has one answer, this module, for the mp and the Ray executor
alike, on the driver's side and the worker's. Each wire format is one :class:`Codec`:

- ``FRAMES``: the mp channels' (``hwlaunch.executor.transport._wire``): pickle protocol 5 with
  large buffers out of band, a reply ``(rpc_id, ok, value)`` decoded in place from shared memory
  (``decode_reply(view, lent)``); the request's header and cached callable are
  ``_messages`` and ``_callables``;
- ``PICKLES``: Ray's: one ``bytes`` object each way (Ray's object store takes bytes), plain
  pickle with cloudpickle for what plain pickle cannot take, a reply ``(ok, value)``.

Either way a reply whose value cannot be encoded travels as the Failure that raised
(:func:`encoded`), so the driver always gets an answer.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import cloudpickle

from hwlaunch.executor._runtime import Failure, flush_output, outcome
from hwlaunch.executor.transport._wire import decode, decode_reply, encode_call, encode_reply
from hwlaunch.worker import Worker

__all__ = ["FRAMES", "PICKLES", "Codec", "answer", "dumps", "encoded", "loads"]

T = TypeVar("T")


@dataclass(frozen=True)
class Codec:
    """One wire format: how a request and a reply are encoded and decoded."""

    encode_request: Callable[[Any], Any]
    decode_request: Callable[..., Any]
    encode_reply: Callable[[tuple[Any, ...]], Any]
    decode_reply: Callable[..., Any]


def dumps(obj: Any) -> bytes:
    """Plain pickle (fast) for data; cloudpickle for what plain pickle cannot take by value."""
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        return bytes(cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def loads(data: bytes | memoryview) -> Any:
    return pickle.loads(data)


FRAMES = Codec(encode_call, decode, encode_reply, decode_reply)
PICKLES = Codec(dumps, loads, dumps, loads)


def encoded(encode: Callable[[tuple[Any, ...]], T], reply: tuple[Any, ...]) -> T:
    """``encode(reply)``, where ``reply`` ends with ``(ok, value)``; a value that cannot be
    encoded becomes the Failure it raised, so the channel always carries an answer."""
    try:
        return encode(reply)
    except Exception as exc:
        return encode((*reply[:-2], False, Failure.current(exc)))


def answer(worker: Worker | None, payload: Any, *, keep_value: bool = True) -> bytes:
    """One request's reply ``(ok, value)``, encoded by ``PICKLES`` (Ray's actors).

    A result that cannot be pickled comes back as a Failure too, so the channel always
    carries an answer. With ``keep_value`` false a successful call's value stays here and
    None travels (the caller asked for another rank's result only).
    """
    ok, value = outcome(worker, payload, PICKLES.decode_request)
    flush_output()
    reply: bytes = encoded(PICKLES.encode_reply, (ok, value if keep_value or not ok else None))
    return reply
