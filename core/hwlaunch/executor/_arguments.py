"""The checks of ``collective_rpc``'s arguments, made before anything is sent.

Why before: a bad timeout (0, negative, NaN) used to "time out" at once and shut the executor
down, and a bad ``args`` failed deep in the call as a raw TypeError. A caller's mistake must be
an error naming the argument that leaves the executor as usable as it was.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["check_call", "check_timeout"]


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
