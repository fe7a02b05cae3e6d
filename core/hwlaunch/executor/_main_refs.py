"""Find what a child process would need from ``__main__``, before the child needs it.

Why: once ``__main__`` must not be re-run in a spawn or forkserver child (it launches the job
at module level), such a child runs nothing of it, so it cannot unpickle a function or class
that pickle sends by reference as ``__main__.name``. Unpickling that fails in the child: a
``Process`` dies at start, and a ``Pool`` worker dies on its task and is replaced for ever
(a hang). Found here, in the process that starts the child, it becomes one clear error naming
the function; anything importable travels and works.
"""

from __future__ import annotations

import pickletools
from multiprocessing.reduction import ForkingPickler
from types import FunctionType
from typing import Any


class _NeedsMain(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class _Discard:
    """A file that keeps nothing: finding costs one pickling's time, not its memory."""

    def write(self, data: bytes) -> int:
        return len(data)


class _MainFinder(ForkingPickler):
    """Pickles into the void; stops at the first function or class of ``__main__``.

    multiprocessing's own objects (queues, locks, connections) may be pickled only while a
    child is being started, and never refer to ``__main__``: they are skipped.
    """

    def persistent_id(self, obj: Any) -> str | None:
        if isinstance(obj, (type, FunctionType)):
            return None
        module = type(obj).__module__ or ""
        return "skipped" if module.startswith("multiprocessing.") else None

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, FunctionType)) and getattr(obj, "__module__", "") == "__main__":
            raise _NeedsMain(obj.__qualname__)
        return NotImplemented


def main_reference(obj: Any) -> str | None:
    """The qualified name of the first ``__main__`` function or class that pickling ``obj``
    sends by reference; None when there is none, or when ``obj`` does not pickle at all (the
    real pickling then reports that)."""
    try:
        _MainFinder(_Discard()).dump(obj)
    except _NeedsMain as needs:
        return needs.name
    except Exception:
        return None
    return None


_STRINGS = ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE")
_GETS = ("BINGET", "LONG_BINGET", "GET")


def main_global_in(data: bytes) -> str | None:
    """The name of the first ``__main__`` global a pickle refers to (``GLOBAL`` or
    ``STACK_GLOBAL`` after the strings ``"__main__"`` and the name, memoized or not)."""
    if b"__main__" not in data:
        return None  # the common case, without parsing
    pushed: list[Any] = []  # the last values pushed, as far as strings go
    memo: dict[object, Any] = {}
    try:
        for opcode, arg, _ in pickletools.genops(data):
            name = opcode.name
            if name == "GLOBAL" and isinstance(arg, str) and arg.startswith("__main__ "):
                return arg.partition(" ")[2]
            if name == "STACK_GLOBAL" and pushed[-2:-1] == ["__main__"]:
                return str(pushed[-1])
            if name == "MEMOIZE":
                memo[len(memo)] = pushed[-1] if pushed else None
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = pushed[-1] if pushed else None
            elif name in _GETS:
                pushed.append(memo.get(arg))
            elif name in _STRINGS:
                pushed.append(arg)
            elif opcode.stack_after:
                pushed.append(None)
            del pushed[:-2]
    except Exception:
        return None
    return None
