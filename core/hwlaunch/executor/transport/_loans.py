"""Shared memory lent out as views, and the flag bytes that say it is still in use.

Both sides of the shm channel lend memory where decoding a message lets tensors view it
instead of copying it (``hwlaunch.executor.transport._wire.decode``): the parent lends a worker's
reply area to a result, a lone worker lends the ring chunk of a request to its arguments. The
other side must not write that memory while anything views it, so the lender keeps the views
it gave out, sets a flag byte in shared memory while any of them is referenced from outside,
and clears the byte (and releases the views) once none is.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

__all__ = ["Loans", "referenced", "release"]


def referenced(views: list[memoryview]) -> bool:
    """Whether anything besides ``views`` references one of them: a tensor made from it
    (``torch.frombuffer`` keeps a reference to the view it is given, for as long as any tensor
    uses that memory). Counted against a probe that only this function and the list hold, so
    that the count does not depend on how the interpreter holds a loop's items."""
    probe = memoryview(b"")
    views.append(probe)
    try:
        counts = [sys.getrefcount(view) for view in views]
    finally:
        views.pop()
    free = counts.pop() - 1  # the probe has this function's name for it, the views do not
    return any(count > free for count in counts)


def release(views: list[memoryview]) -> None:
    for view in views:
        with contextlib.suppress(BufferError):  # exported after all: it goes with its holder
            view.release()


class Loans:
    """The views still lent, each list under the offset of the flag byte that marks its
    memory in use."""

    __slots__ = ("_views",)

    def __init__(self) -> None:
        self._views: dict[int, list[memoryview]] = {}

    def __bool__(self) -> bool:
        return bool(self._views)

    def __contains__(self, flag_at: int) -> bool:
        return flag_at in self._views

    def settle(self, memory: Any, flag_at: int, views: list[memoryview]) -> None:
        """After a message lent ``views``: keep them and set the flag at ``flag_at`` while
        anything but the list references one of them, else release them now."""
        if views and referenced(views):
            self._views[flag_at] = views
            memory[flag_at] = 1
        else:
            release(views)

    def take_back(self, memory: Any) -> None:
        """Clear the flag of every loan whose views nobody references any more."""
        for flag_at, views in list(self._views.items()):
            if not referenced(views):
                del self._views[flag_at]
                release(views)
                memory[flag_at] = 0

    def forget(self) -> None:
        """Drop every loan without touching the memory (it is being unmapped)."""
        self._views.clear()
