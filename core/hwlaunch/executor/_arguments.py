"""The checks of ``collective_rpc``'s arguments, made before anything is sent.

Why before: a bad timeout (0, negative, NaN) used to "time out" at once and shut the executor
down, and a bad ``args`` failed deep in the call as a raw TypeError. A caller's mistake must be
an error naming the argument that leaves the executor as usable as it was.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from hwlaunch.executor._encoding import encode_method, method_label
from hwlaunch.executor._runtime import Request

__all__ = ["check_call", "check_reply_rank", "check_timeout", "request_of"]


def request_of(
    method: str | Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    timeout: float | None,
    reply_rank: int | None,
    world_size: int,
) -> tuple[Request, str, float | None]:
    """``collective_rpc``'s arguments, checked: the request to send, its label (what warnings
    and errors call it) and the timeout in seconds (None: no limit)."""
    request: Request
    if (
        type(method) is str
        and method
        and type(args) is tuple
        and (kwargs is None or (type(kwargs) is dict and not kwargs))
    ):
        request, label = (method, args, {}), method  # the usual call by name: nothing to encode
    else:
        method, args, keywords = check_call(method, args, kwargs)
        request, label = (encode_method(method), args, keywords), method_label(method)
    if timeout is not None:
        timeout = check_timeout(timeout)
    if reply_rank is not None:
        check_reply_rank(reply_rank, world_size)
    return request, label, timeout


def check_reply_rank(rank: object, world_size: int) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(
            f"unique_reply_rank={rank!r} is not a rank of this executor "
            f"(ranks 0 to {world_size - 1}), or None for every rank's result"
        )


def _shown(value: object) -> str:
    return f"{value!r} ({type(value).__name__})"


def check_timeout(timeout: object) -> float | None:
    """Seconds to wait, or None to wait as long as it takes (``math.inf`` means None too)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(
            f"collective_rpc timeout must be a number of seconds or None, got {_shown(timeout)}"
        )
    if math.isnan(timeout) or timeout <= 0:
        raise ValueError(
            f"collective_rpc timeout must be > 0 seconds (or None, or math.inf, to wait without "
            f"a limit), got {timeout!r}"
        )
    return None if math.isinf(timeout) else float(timeout)


def check_call(
    method: object, args: object, kwargs: object
) -> tuple[str | Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """``method`` a worker method name or a callable, ``args`` a tuple (or list) of positional
    arguments, ``kwargs`` None or a mapping of keyword names: as the call will travel."""
    if isinstance(method, str):
        if not method:
            raise ValueError("collective_rpc method name is empty; name a worker method")
    elif not callable(method):
        raise TypeError(
            "collective_rpc method must be a worker method name (str) or a callable "
            f"fn(worker, *args, **kwargs), got {_shown(method)}"
        )
    if not isinstance(args, tuple | list):
        raise TypeError(
            f"collective_rpc args must be a tuple of positional arguments, got {_shown(args)}"
            f"; for one argument write args=({args!r},)"
        )
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(
            f"collective_rpc kwargs must be a dict of keyword arguments or None, got "
            f"{_shown(kwargs)}"
        )
    keywords = dict(kwargs or {})
    bad = [key for key in keywords if not isinstance(key, str)]
    if bad:
        raise TypeError(f"collective_rpc kwargs keys must be strings, got {bad[0]!r}")
    return method, tuple(args), keywords
