"""Name the object that keeps a worker's start-up arguments from pickling, before any process
starts.

Why: spawn and forkserver (the default start method on Linux from Python 3.14) pickle what a
worker is started with; fork does not. Code that only ever ran under fork then fails inside
``Process.start()`` with ``cannot pickle '_thread.lock' object`` or ``Can't pickle local
object``, naming neither the object nor how it was reached. Pickling once up front, and on a
failure pickling the parts of what failed (a class's attributes, a function's globals, closure
and defaults, an object's attributes, a container's items), finds the innermost part that
fails: ``worker_extension.Ext.pool``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import CodeType, FunctionType
from typing import Any

from hwlaunch.errors import NotPicklableError

Dumps = Callable[[Any], Any]
_DEPTH = 8  # parts of parts: deep enough for a global of a method of a class attribute
_CLASS_NOISE = ("__dict__", "__weakref__", "__module__", "__doc__", "__qualname__")


def check_picklable(obj: Any, what: str, dumps: Dumps, why: str, fix: str) -> None:
    """Raise NotPicklableError naming the part of ``obj`` (called ``what``) that fails.

    ``why`` says who pickles it, ``fix`` what to do instead.
    """
    try:
        dumps(obj)
    except Exception as exc:
        path, error = _innermost_failure(obj, what, dumps, exc, _DEPTH, set())
        raise NotPicklableError(
            f"{path}: {type(error).__name__}: {error} ({why}; nothing was started). Fix: {fix}"
        ) from exc


def _innermost_failure(
    obj: Any, path: str, dumps: Dumps, error: Exception, depth: int, seen: set[int]
) -> tuple[str, Exception]:
    seen.add(id(obj))
    if depth > 0:
        for suffix, part in _parts(obj):
            if id(part) in seen:
                continue
            try:
                dumps(part)
            except Exception as exc:
                return _innermost_failure(part, path + suffix, dumps, exc, depth - 1, seen)
    return path, error


def _parts(obj: Any) -> Iterator[tuple[str, Any]]:
    """What pickling ``obj`` by value pickles in turn, each with how it is reached."""
    if isinstance(obj, type):
        for name, value in vars(obj).items():
            if name not in _CLASS_NOISE:
                yield f".{name}", value
    elif isinstance(obj, FunctionType):
        names = _global_names(obj.__code__)
        for name in sorted(names & obj.__globals__.keys()):
            yield f".__globals__[{name!r}]", obj.__globals__[name]
        for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or (), strict=True):
            yield f" (closure variable {name})", cell.cell_contents
        yield ".__defaults__", obj.__defaults__
        yield ".__kwdefaults__", obj.__kwdefaults__
    elif isinstance(obj, (staticmethod, classmethod)):
        yield ".__func__", obj.__func__
    elif isinstance(obj, property):
        yield from ((f".{n}", getattr(obj, n)) for n in ("fget", "fset", "fdel"))
    elif isinstance(obj, dict):
        yield from ((f"[{key!r}]", value) for key, value in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        yield from ((f"[{index}]", value) for index, value in enumerate(obj))
    elif isinstance(getattr(obj, "__dict__", None), dict):
        yield from ((f".{name}", value) for name, value in vars(obj).items())


def _global_names(code: CodeType) -> set[str]:
    """The global names a function's code (and the code nested in it) may read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _global_names(const)
    return names
