"""Keep multiprocessing from re-running a ``__main__`` that would launch again.

Why: once workers were launched at module level, outside a main guard, any later spawn or
forkserver child of this process (a ``multiprocessing.Pool``, a DataLoader, a compile pool, in
the program or inside a forked worker) re-runs ``__main__`` and reaches that launch again. The
child then dies during start-up, and a Pool replaces it for ever: a hang with a screen of
tracebacks. From then on, CPython's ``spawn.get_preparation_data`` is shown a ``__main__``
without ``__spec__`` and ``__file__``, so such a child re-runs nothing: one that runs an
importable function works (a DataLoader, a Pool of a module's functions: Python 3.14's default
forkserver), and one that needs a function or class of ``__main__``, which it would not have,
fails at once, in the process that starts it, with one clear error naming it.

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
from hwlaunch.executor._main_refs import main_global_in, main_reference

_REASON = "__hwlaunch_reimport_refused__"
STDIN = "<stdin>"  # the file name CPython gives code read from stdin
_MAIN_ENTRIES = ("init_main_from_name", "init_main_from_path")

# The process name whose main entries get_preparation_data must not see, per thread.
_withheld = threading.local()
_hook_lock = threading.Lock()
_hook_users = 0  # starts in progress that need the hooked class on __main__
_hook_added = False  # the class was plain ModuleType before the first of them


def _preparing(caller: types.FrameType) -> bool:
    """Is ``caller`` CPython's ``get_preparation_data``, telling a child what to re-run?"""
    return (
        caller.f_code.co_name == "get_preparation_data"
        and caller.f_globals.get("__name__") == "multiprocessing.spawn"
    )


def _withholding_for(caller: types.FrameType) -> bool:
    """Is ``caller`` get_preparation_data preparing the process this thread withholds for?"""
    name = getattr(_withheld, "name", None)
    return name is not None and _preparing(caller) and caller.f_locals.get("name") == name


def _check_child(caller: types.FrameType, reason: tuple[str, str]) -> None:
    """The child being started re-runs nothing of ``__main__``: refuse it if it needs a
    function or class from there, and check a Pool's tasks as they are sent.

    The process object is that of CPython's ``Popen._launch(process_obj)`` (spawn and
    forkserver), which calls ``get_preparation_data``; the fork server's own start has none.
    """
    launching = caller.f_back
    process = launching.f_locals.get("process_obj") if launching is not None else None
    if process is None:
        return
    target = getattr(process, "_target", None)
    args, kwargs = getattr(process, "_args", ()), getattr(process, "_kwargs", {})
    needed = main_reference((target, args, kwargs))
    if needed is not None:
        raise MissingMainGuardError(_needs_main(needed, reason))
    pool_worker = (getattr(target, "__module__", None), getattr(target, "__name__", None))
    if pool_worker == ("multiprocessing.pool", "worker") and args:
        _check_tasks(args[0], reason)


def _check_tasks(inqueue: Any, reason: tuple[str, str]) -> None:
    """Make the Pool's task pipe refuse a task that refers to ``__main__``.

    The Pool's task thread catches the error and fails that task's result with it (``map``
    raises it), where the child would have died unpickling it and the Pool waited for ever.
    """
    writer = getattr(inqueue, "_writer", None)
    if writer is None or getattr(writer, "_hwlaunch_checked", False):
        return
    send_bytes = writer._send_bytes

    def send_checked(buf: Any) -> None:
        needed = main_global_in(bytes(buf))
        if needed is not None:
            raise MissingMainGuardError(_needs_main(needed, reason))
        send_bytes(buf)

    writer._send_bytes = send_checked
    writer._hwlaunch_checked = True


def _needs_main(name: str, reason: tuple[str, str]) -> str:
    why, fix = reason
    return (
        f"{name} is defined in __main__, which a spawn or forkserver child started here does "
        f"not have: {why}. Fix: move {name} into a module the child can import{fix}, or start "
        "this child with multiprocessing.get_context('fork')"
    )


class _RefusingMain(types.ModuleType):
    """A ``__main__`` that answers multiprocessing's preparation differently; others see it as is.

    Once a re-import was refused (:func:`refuse_reimport`), ``get_preparation_data`` sees no
    ``__spec__`` or ``__file__`` (the child re-runs nothing), after checking that the child
    needs nothing of ``__main__``; while one of hwlaunch's workers starts, that worker's
    ``get_preparation_data`` only sees them as absent.
    """

    @property
    def __spec__(self) -> Any:
        caller = sys._getframe(1)
        if caller.f_globals.get("__name__") == "multiprocessing.spawn":
            if _REASON in self.__dict__ and _preparing(caller):
                _check_child(caller, self.__dict__[_REASON])
                return None
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
        caller = sys._getframe(1)
        if _withholding_for(caller) or (_REASON in self.__dict__ and _preparing(caller)):
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
        refuse_stdin_reimport()  # this worker's own children cannot re-run it either
        return  # the extension and the callables come by value
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
    """From now on, spawn/forkserver children started in this process re-run no ``__main__``
    (it reaches the launch at ``where``); one that needs a function or class of ``__main__``
    is refused, naming it (see :func:`_check_child`)."""
    _refuse(
        f"the child must not re-run __main__, which reaches {where} outside "
        '`if __name__ == "__main__":` and would launch the workers again',
        ', put the launch under `if __name__ == "__main__":`',
    )


def refuse_stdin_reimport() -> None:
    """As :func:`refuse_reimport`, for a program read from stdin, which no child can re-run:
    CPython's child would die trying to run ``<cwd>/<stdin>`` (a Pool then waits for ever)."""
    _refuse("__main__ is code read from stdin, which the child cannot re-run", "")


def _refuse(why: str, fix: str) -> None:
    main = sys.modules.get("__main__")
    if main is None or type(main) not in (types.ModuleType, _RefusingMain):
        return  # a custom module class (IPython's): leave it alone
    main.__dict__[_REASON] = (why, fix)
    with _hook_lock:
        main.__class__ = _RefusingMain
