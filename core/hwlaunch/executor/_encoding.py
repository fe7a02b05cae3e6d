"""What the driver sends its workers by value: the worker extension and callables.

Why on the driver's side only: workers decode these with plain pickle; encoding them needs
cloudpickle's by-value pickler, the callable cache and the picklability check, none of which a
worker imports (import-linter holds the wall between the two sides).
"""

from __future__ import annotations

import io
import marshal
import pickle
import types
from collections import ChainMap
from collections.abc import Callable
from typing import Any, ClassVar

import cloudpickle

from hwlaunch.executor._callable_cache import pickled_once
from hwlaunch.executor._picklecheck import check_picklable
from hwlaunch.executor._runtime import WorkerExtension

__all__ = ["by_value", "encode_extension", "encode_method", "method_label"]


def _code_with_its_file(code: types.CodeType) -> tuple[Any, tuple[bytes]]:
    """A code object whole, as marshal (and every ``.pyc``) keeps it."""
    return marshal.loads, (marshal.dumps(code),)


class _ByValuePickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle, except that code objects keep their file name.

    Why: cloudpickle replaces every ``co_filename`` with ``"<dynamic-code>"`` (for payloads that
    do not depend on where a function was defined), so a remote traceback of a function sent by
    value could not say which file and line raised. Workers run the caller's Python version, so
    marshal's format is theirs too.
    """

    dispatch_table: ClassVar[ChainMap[Any, Any]] = ChainMap(
        {types.CodeType: _code_with_its_file}, cloudpickle.Pickler.dispatch_table
    )


def by_value(obj: Any) -> bytes:
    """``obj`` pickled by value (functions and classes of scripts and notebooks included)."""
    buffer = io.BytesIO()
    _ByValuePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def encode_extension(extension: WorkerExtension) -> bytes | str | None:
    """Classes travel by value (cloudpickle), so a class defined in a script or notebook works.

    One that does not pickle (a lock as a class attribute, a method that reads a module-level
    lock) fails here, in the caller, naming the attribute (NotPicklableError).
    """
    if extension is None or isinstance(extension, str):
        return extension
    if not isinstance(extension, type):
        raise TypeError(
            f"worker_extension must be a class or 'package.module:ClassName', got {extension!r}"
        )
    try:
        return by_value(extension)
    except Exception:
        name = f"worker_extension {extension.__qualname__}"
        check_picklable(extension, name, by_value, _WHY, _FIX)
        raise


_WHY = "the worker extension travels to each worker by value, pickled with cloudpickle"
_FIX = (
    "create it in the worker (in init_device, or on first use in a method) instead of at class "
    "or module level, or pass the extension as 'package.module:ClassName' to import it there"
)


def encode_method(method: str | Callable[..., Any]) -> str | bytes:
    """A method name stays a name; a callable travels by value, pickled once while what it
    holds stays the same (``hwlaunch.executor._callable_cache``)."""
    if isinstance(method, str):
        return method
    if not callable(method):
        raise TypeError(f"method must be a worker method name or a callable, got {method!r}")
    return pickled_once(method, by_value)


def method_label(method: str | Callable[..., Any]) -> str:
    return method if isinstance(method, str) else getattr(method, "__qualname__", repr(method))
