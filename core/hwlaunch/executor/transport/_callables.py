"""Callables that travel to the mp workers once, then by digest.

The parent caches a callable's pickled form (``hwlaunch.executor._callable_cache``: a
``CachedPickle`` only where pickling again would give the same bytes). Such a form travels
whole the first time and as its 16-byte digest after that; each worker keeps the form and the
function unpickled from it. Both sides hold the last ``KEPT`` digests, least recently used
going first, and both update their lists from the same sequence of requests (every worker
reads every request, in order), so the parent knows what the workers hold without asking.
A worker records a request's digest before anything else in it is decoded, so a request
that fails (an argument that does not unpickle) leaves both lists in step; a form that did
not unpickle is tried again on the next call that names it.
"""

from __future__ import annotations

import pickle
from collections import OrderedDict
from typing import Any, Protocol

import cloudpickle

from hwlaunch.executor._runtime import Request, adopt_main_objects
from hwlaunch.executor.transport._messages import NO_CALLABLE, SHUTDOWN, Body, parse_request
from hwlaunch.executor.transport._wire import FRAME_BYTE, decode

__all__ = ["KEPT", "CachedPickle", "CallReader", "KeptCallables", "SentCallables"]


class CachedPickle(bytes):
    """A pickled callable that was cached: the same bytes object on every call, with the
    ``digest`` (16 bytes of BLAKE2b) that names it to a worker that keeps it."""

    digest: bytes


class Endpoint(Protocol):
    @property
    def lending(self) -> list[memoryview] | None: ...  # see ShmEndpoint.recv

    def recv(self) -> Body: ...


KEPT = 64


class SentCallables:
    """The parent's list of the digests every worker holds (one per channel: a new group of
    workers starts empty)."""

    def __init__(self) -> None:
        self._held: OrderedDict[bytes, None] = OrderedDict()

    def reference(self, method: object) -> tuple[bytes, bytes]:
        """``(digest, pickled)`` for a request's method: NO_CALLABLE and b"" for a name; the
        digest and b"" for a form the workers hold, else the digest and the form (from now on
        held). An uncached callable travels whole in the request itself (no digest)."""
        if type(method) is not CachedPickle:
            return NO_CALLABLE, b""
        digest = method.digest
        if digest in self._held:
            self._held.move_to_end(digest)
            return digest, b""
        self._held[digest] = None
        if len(self._held) > KEPT:
            self._held.popitem(last=False)
        return digest, method


class KeptCallables:
    """A worker's forms and functions, by digest."""

    def __init__(self) -> None:
        self._kept: OrderedDict[bytes, list[Any]] = OrderedDict()  # [form, function or None]

    def note(self, digest: bytes, pickled: Body | None) -> list[Any] | None:
        """Record a request's callable (in step with the parent's list); its entry, None for
        a call by name. KeyError: a digest this worker never received (a broken invariant)."""
        if digest == NO_CALLABLE:
            return None
        if pickled is not None:
            entry = [bytes(pickled), None]
            self._kept[digest] = entry
            if len(self._kept) > KEPT:
                self._kept.popitem(last=False)
            return entry
        self._kept.move_to_end(digest)
        return self._kept[digest]

    @staticmethod
    def function(entry: list[Any]) -> Any:
        """The entry's function, unpickled the first time it is needed."""
        if entry[1] is None:
            fn = cloudpickle.loads(entry[0])
            adopt_main_objects(fn)
            entry[1] = fn
        return entry[1]


class CallReader:
    """A worker's side of the requests: what each one asks, then its call, decoded where it
    lies (and the message released at once, before the call runs)."""

    def __init__(self) -> None:
        self.kept = KeptCallables()

    def next(self, channel: Endpoint) -> tuple[bytes, int, int | None, Any]:
        """``(kind, rpc_id, reply_rank, call)`` of the next request (blocking); ``call`` goes
        to :meth:`take`. EOFError or OSError when the parent is gone."""
        message = channel.recv()
        kind, rpc_id, reply_rank, digest, pickled, body = parse_request(message)
        if kind == SHUTDOWN:
            _release(message, body)
            return kind, rpc_id, reply_rank, None
        return kind, rpc_id, reply_rank, (message, digest, pickled, body, channel.lending)

    def take(self, call: tuple[Body, bytes, Body | None, Body, list[memoryview] | None]) -> Request:
        """The call ``(method or function, args, kwargs)``; raises what decoding raised. Its
        tensors view the channel's memory where the channel lends it (``lending``)."""
        message, digest, pickled, body, lending = call
        try:
            entry = None if digest == NO_CALLABLE else self.kept.note(digest, pickled)
            # A plain pickle (the usual small call) without the call to decode().
            if body[0] != FRAME_BYTE:
                method, args, kwargs = pickle.loads(body)
            else:
                method, args, kwargs = decode(body, lending)
        finally:
            if type(message) is not bytes:  # a small call is copies: nothing to release
                _release(message, body, pickled)
        return (method if entry is None else self.kept.function(entry), args, kwargs)


def _release(*views: Body | None) -> None:
    for view in views:
        if isinstance(view, memoryview):
            view.release()
