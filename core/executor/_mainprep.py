"""Keep multiprocessing from re-running a ``__main__`` that would launch again.

Why: once workers were launched at module level, outside a main guard, any later spawn or
forkserver child of this process (a ``multiprocessing.Pool``, a DataLoader, a compile pool, in
the program or inside a forked worker) re-runs ``__main__`` and reaches that launch again. The
child then dies during start-up, and a Pool replaces it for ever: a hang with a screen of
tracebacks. Refusing at the moment CPython's ``spawn.get_preparation_data`` reads
``__main__.__spec__`` turns that into one clear error in the process that starts the child.

Also here: hwlaunch's own spawn/forkserver workers re-import ``__main__`` themselves, inside the
worker's start-up handshake, instead of in CPython's ``spawn.prepare()``. Why: ``prepare()``
runs before any hwlaunch code exists in the child, so an exception there (an error at the
program's top level, the "bootstrapping phase" RuntimeError) killed the worker with only a
traceback on its stderr, and the parent could say no more than "ended without a Python
exception". While one of our workers starts, ``get_preparation_data`` is shown a ``__main__``
without ``__spec__`` and ``__file__`` (for that process name, in that thread only), so
``prepare()`` skips the import; the worker gets the entry it would have had and runs CPython's
own ``_fixup_main_from_name`` / ``_fixup_main_from_path`` with it, at the same point in its
start-up (before any user code, with ``_inheriting`` set, after sys.path and cwd are set),
and reports a failure through the handshake like any other start-up error.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import multiprocessing.spawn
import os
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

from hwlaunch.errors import MissingMainGuardError

_REASON = "__hwlaunch_reimport_refused__"
STDIN = "<stdin>"  # the file name CPython gives code read from stdin
_MAIN_ENTRIES = ("init_main_from_name", "init_main_from_path")

# The process name whose main entries get_preparation_data must not see, per thread.
_withheld = threading.local()
_hook_lock = threading.Lock()
_hook_users = 0  # starts in progress that need the hooked class on __main__
_hook_added = False  # the class was plain ModuleType before the first of them


def _withholding_for(caller: types.FrameType) -> bool:
    """Is ``caller`` get_preparation_data preparing the process this thread withholds for?"""
    name = getattr(_withheld, "name", None)
    return (
        name is not None
        and caller.f_code.co_name == "get_preparation_data"
        and caller.f_globals.get("__name__") == "multiprocessing.spawn"
        and caller.f_locals.get("name") == name
    )


class _RefusingMain(types.ModuleType):
    """A ``__main__`` that answers multiprocessing's preparation differently; others see it as is.

    Reading ``__spec__`` from ``multiprocessing.spawn`` raises once a re-import was refused
    (:func:`refuse_reimport`); while one of hwlaunch's workers starts, ``__spec__`` and
    ``__file__`` read as absent by that worker's ``get_preparation_data`` only.
    """

    @property
    def __spec__(self) -> Any:
        caller = sys._getframe(1)
        if caller.f_globals.get("__name__") == "multiprocessing.spawn":
            if _REASON in self.__dict__:
                raise MissingMainGuardError(self.__dict__[_REASON])
            if _withholding_for(caller):
                return None
        return self.__dict__.get("__spec__")

    @__spec__.setter
    def __spec__(self, value: Any) -> None:
        self.__dict__["__spec__"] = value

    @__spec__.deleter
    def __spec__(self) -> None:
        del self.__dict__["__spec__"]

    @property
    def __file__(self) -> Any:
        if _withholding_for(sys._getframe(1)):
            return None
        try:
            return self.__dict__["__file__"]
        except KeyError:
            raise AttributeError(f"module {self.__name__!r} has no attribute '__file__'") from None

    @__file__.setter
    def __file__(self, value: Any) -> None:
        self.__dict__["__file__"] = value

    @__file__.deleter
    def __file__(self) -> None:
        del self.__dict__["__file__"]


def main_entry(name: str) -> tuple[str, str] | None:
    """What a spawn/forkserver child named ``name`` would re-import as ``__mp_main__``.

    CPython's own answer (its ``get_preparation_data``), so that the rules (module name or path,
    relative paths, ``-m``) are the running interpreter's. None: nothing is re-imported.
    """
    data = multiprocessing.spawn.get_preparation_data(name)
    for key in _MAIN_ENTRIES:
        if key in data:
            return key, str(data[key])
    return None


@contextlib.contextmanager
def withholding_main(name: str, entry: tuple[str, str] | None) -> Iterator[bool]:
    """While this block starts the process ``name``, its ``prepare()`` re-imports no ``__main__``.

    ``entry`` is :func:`main_entry`'s answer. Yields False where there is nothing to withhold,
    or where it cannot be done (a ``__main__`` of a custom module class, such as IPython's): the
    child then re-imports it in ``prepare()`` as usual.
    """
    global _hook_users, _hook_added
    main = sys.modules.get("__main__")
    if entry is None or main is None or type(main) not in (types.ModuleType, _RefusingMain):
        yield False
        return
    with _hook_lock:
        if _hook_users == 0 and type(main) is types.ModuleType:
            main.__class__ = _RefusingMain
            _hook_added = True
        _hook_users += 1
    _withheld.name = name
    try:
        yield True
    finally:
        _withheld.name = None
        with _hook_lock:
            _hook_users -= 1
            if _hook_users == 0 and _hook_added and _REASON not in main.__dict__:
                main.__class__ = types.ModuleType
                _hook_added = False


def reimport_main(entry: tuple[str, str]) -> None:
    """In the worker: what ``spawn.prepare()`` was kept from doing, done the same way.

    ``_inheriting`` is set as during ``prepare()``, so a launch at the program's top level meets
    the same check (multiprocessing's bootstrapping error, hwlaunch's re-import error). Code
    read from stdin is left alone: ``prepare()`` would die trying to run ``<cwd>/<stdin>``, and
    what the worker needs of it (the extension class, the callables) travels by value.
    """
    key, value = entry
    if key == "init_main_from_path" and os.path.basename(value) == STDIN:
        return  # code read from stdin cannot be re-run; its callables came by value
    process: Any = multiprocessing.process.current_process()
    process._inheriting = True
    try:
        if key == "init_main_from_name":
            multiprocessing.spawn._fixup_main_from_name(value)  # type: ignore[attr-defined]
        else:
            multiprocessing.spawn._fixup_main_from_path(value)  # type: ignore[attr-defined]
    finally:
        del process._inheriting


def refuse_reimport(where: str) -> None:
    """From now on, starting a spawn/forkserver child in this process raises, naming ``where``."""
    main = sys.modules.get("__main__")
    if main is None or type(main) not in (types.ModuleType, _RefusingMain):
        return  # a custom module class (IPython's): leave it alone
    main.__dict__[_REASON] = (
        f"a spawn or forkserver child started here would re-run __main__, which reaches "
        f'{where} outside `if __name__ == "__main__":` and would launch the workers again (the '
        "child would die while starting, and a Pool would wait for ever). Fix: put the launch "
        'under `if __name__ == "__main__":`, or start this child with '
        "multiprocessing.get_context('fork')"
    )
    with _hook_lock:
        main.__class__ = _RefusingMain
