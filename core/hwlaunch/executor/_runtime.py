"""What every executor does on the worker side: build the worker and run calls on it.

The mp child loop, the uni executor's thread and the Ray actor all use these functions, so a
worker behaves the same whichever executor hosts it.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle

from hwlaunch.executor._setup import run_worker_setup
from hwlaunch.plan import Plan
from hwlaunch.probes import usable_cpus
from hwlaunch.worker import Worker

WorkerExtension = type | str | None
# One call as it travels: a method name or a cloudpickled callable, its args and kwargs.
Request = tuple[str | bytes, tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True)
class Failure:
    """An exception that happened in a worker, in a form that always pickles. ``undecodable``:
    it happened in the driver instead, decoding the worker's reply (the worker raised nothing)."""

    exc_type: str
    message: str
    traceback: str
    undecodable: bool = False

    @classmethod
    def current(cls, exc: BaseException, *, undecodable: bool = False) -> Failure:
        return cls(
            exc_type=f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
            message=str(exc),
            traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
            undecodable=undecodable,
        )


def import_object(path: str) -> Any:
    """``"package.module:Name"`` -> the object."""
    module_name, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def worker_class(plan: Plan, extension: bytes | str | None) -> type[Worker]:
    """The backend's worker class, with the extension mixed in first (its methods win)."""
    base = import_object(plan.worker)
    if not (isinstance(base, type) and issubclass(base, Worker)):
        raise TypeError(f"{plan.worker} is not a subclass of hwlaunch.Worker")
    if extension is None:
        return base
    ext = import_object(extension) if isinstance(extension, str) else cloudpickle.loads(extension)
    if not isinstance(ext, type):
        raise TypeError(f"worker_extension {extension!r} is not a class")
    return type(f"{ext.__name__}{base.__name__}", (ext, base), {})


def apply_cpu_threads(plan: Plan) -> None:
    """The plan's thread budget, for torch in this worker process.

    A torch that was imported earlier (in a parent that forked, in a launcher's rank) sized its
    pool already: ``set_num_threads`` holds whatever the start method. A worker that has not
    imported torch yet (spawn) does not import it here when ``OMP_NUM_THREADS`` (in its
    environment before anything was imported) gives torch the same count when the worker first
    imports it: torch takes the variable up to the CPUs it may use, no further.
    """
    if plan.cpu_threads is None:
        return
    if (
        "torch" not in sys.modules
        and os.environ.get("OMP_NUM_THREADS") == str(plan.cpu_threads)
        and plan.cpu_threads <= usable_cpus()
    ):
        return
    try:
        import torch
    except ImportError:  # a worker without torch: the variables are all there is to set
        return
    torch.set_num_threads(plan.cpu_threads)


def start_worker(
    plan: Plan,
    extension: bytes | str | None,
    *,
    rank: int,
    local_rank: int,
    master_addr: str,
    master_port: int,
    init_distributed: bool,
) -> Worker:
    """Construct the worker and run its start-up lifecycle: plugins' setup, then the device."""
    cls = worker_class(plan, extension)
    apply_cpu_threads(plan)
    worker = cls(
        rank=rank,
        local_rank=local_rank,
        world_size=plan.world_size,
        plan=plan,
        master_addr=master_addr,
        master_port=master_port,
    )
    run_worker_setup(worker)
    worker.init_device()
    if init_distributed:
        worker.init_distributed()
    return worker


def call(
    worker: Worker,
    method: str | bytes | Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    own_process: bool = False,
) -> Any:
    """Run one RPC on the worker: a named method, or ``fn(worker, *args, **kwargs)``.

    ``own_process``: the worker is a process of its own, whose ``__main__`` may adopt the
    callable's ``__main__`` functions (see :func:`adopt_main_objects`). A callable given as
    itself (one a worker kept from an earlier call) was adopted when it was unpickled.
    """
    if isinstance(method, str):  # the usual call first
        target = getattr(worker, method, None)
        if target is None or method.startswith("_") or not callable(target):
            raise AttributeError(
                f"{type(worker).__name__} has no public method {method!r}; pass a "
                "worker_extension that defines it, or send a callable fn(worker, ...)"
            )
        return target(*args, **kwargs)
    if isinstance(method, bytes):
        fn = cloudpickle.loads(method)
        if own_process:
            adopt_main_objects(fn)
        return fn(worker, *args, **kwargs)
    return method(worker, *args, **kwargs)


def adopt_main_objects(fn: Any) -> None:
    """Make the ``__main__`` functions and classes that came by value ``__main__``'s own here.

    Why: cloudpickle sends them by value, so they are new objects in the worker; when the call
    hands one to a ``multiprocessing.Pool``, plain pickle sends it by reference and insists
    that ``__main__.f`` is that very object ("not the same object as __main__.f"). Never done
    in the caller's own process (the uni executor), whose ``__main__`` is the user's program.
    """
    main = sys.modules.get("__main__")
    if main is None:
        return
    found = [fn, *getattr(fn, "__globals__", {}).values()]
    for obj in found:
        name = getattr(obj, "__qualname__", "")
        if (
            isinstance(obj, (types.FunctionType, type))
            and getattr(obj, "__module__", None) == "__main__"
            and name.isidentifier()
        ):
            setattr(main, name, obj)


def outcome(
    worker: Worker | None, payload: Any, decode: Callable[[Any], Request] = pickle.loads
) -> tuple[bool, Any]:
    """Run one encoded request on the worker: ``(True, value)``, or ``(False, Failure)`` for an
    exception from decoding or from the call (the caller's WorkerError). Every executor's
    worker side runs its requests through this (and then :func:`flush_output`)."""
    try:
        if worker is None:
            raise RuntimeError("the worker did not start")
        method, args, kwargs = decode(payload)
        return True, call(worker, method, args, kwargs, True)
    except Exception as exc:
        return False, Failure.current(exc)


def flush_output() -> None:
    """What a call printed leaves the worker before its reply does: the driver then shows it
    before whatever the caller prints after the call (buffered, it would come later)."""
    for stream in (sys.stdout, sys.stderr):
        # try, not contextlib.suppress: this runs after every call, and a suppress object per
        # stream costs more than both flushes of empty buffers.
        try:  # noqa: SIM105
            stream.flush()
        except Exception:  # a closed or replaced stream: nothing to hand on
            pass
