"""hwlaunch's fork servers: one per distinct (worker environment, preload), started with both.

Why not the standard library's: its fork server is one per parent, started with the parent's
environment, and it imports the preload (torch) before any worker exists. A variable of the
plan's env that torch or a vendor SDK reads when imported (``OMP_NUM_THREADS``) would reach the
workers after the server had imported them, too late. So each distinct environment gets a
server of its own (``multiprocessing.forkserver.ForkServer`` instances: CPython's code, not a
copy), whose first preload modules (``_server_setup``) set that environment before the next one
imports anything, and have the server remove this process's temporary folder (its socket's) if
this process dies without doing so. The parent's ``os.environ`` is never written (other threads
may be reading it), and the standard library's own server is left to whoever else uses it.

A server lives as long as this process (it ends when the last process holding its "alive" pipe,
this one or a worker, ends), so later launches with the same environment and preload reuse it
and start in milliseconds. Workers are started through a ``Process`` class whose ``Popen`` runs
``popen_forkserver.Popen._launch`` with that server in place of the module-level one.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import types
from collections.abc import Mapping
from multiprocessing import forkserver, popen_forkserver, util
from multiprocessing.context import ForkServerProcess
from typing import Any

__all__ = ["EXECUTOR_MODULES", "ServerProcess", "running_servers", "server_for"]

# What every mp worker runs before the plan's own modules matter: the worker loop (with the
# worker runtime and cloudpickle). Preloaded too, or each worker would import it after the fork.
EXECUTOR_MODULES = (
    "hwlaunch.executor.mp._child",
    "hwlaunch.executor.mp._forkserver",
    "multiprocessing.popen_forkserver",
)
SETUP_MODULE = "hwlaunch.executor.mp._server_setup"  # its children run first in the server

Key = tuple[tuple[tuple[str, str], ...], tuple[str, ...]]
_servers: dict[Key, forkserver.ForkServer] = {}
_servers_lock = threading.Lock()


def server_for(env: Mapping[str, str], preload: tuple[str, ...]) -> forkserver.ForkServer:
    """The fork server whose environment holds ``env`` and which preloads ``preload`` (and the
    executor's modules); created on first use, started by the first worker it forks."""
    key: Key = (tuple(sorted(env.items())), tuple(preload))
    with _servers_lock:
        server = _servers.get(key)
        if server is None:
            server = forkserver.ForkServer()
            modules = (*preload, *EXECUTOR_MODULES)
            first = _clean_up_module()
            if env:
                first.append(_env_module(dict(env)))
            server.set_forkserver_preload([*first, *dict.fromkeys(modules)])
            _servers[key] = server
        return server


def _clean_up_module() -> list[str]:
    """The preload module that has the server remove this process's ``multiprocessing``
    temporary folder if this process dies without removing it (``_server_setup``); none where
    the folder is not this process's own but one it inherited (its remover is the process
    that made it, which may outlive this one)."""
    folder = util.get_temp_dir()
    remover = getattr(util, "_remove_temp_dir", None)
    for finalizer in list(getattr(util, "_finalizer_registry", {}).values()):
        args = getattr(finalizer, "_args", None) or ()
        removes = getattr(finalizer, "_callback", None) is remover and args[1:] == (folder,)
        if removes and getattr(finalizer, "_pid", None) == os.getpid():
            return [f"{SETUP_MODULE}.t{folder.encode().hex()}"]
    return []


def _env_module(env: dict[str, str]) -> str:
    """The name of a module that sets ``env`` in the fork server when imported.

    The preload list travels on the server's command line, which other users may read
    (``/proc/<pid>/cmdline``), so the values go into a file only this user can read, and only
    its path goes into the name. The server removes the file when it ends; this process does
    too, at exit, in case the server never started.
    """
    fd, path = tempfile.mkstemp(prefix="hwlaunch-env-", suffix=".json")
    with os.fdopen(fd, "w") as file:
        json.dump(env, file)
    util.Finalize(None, _remove, (path,), exitpriority=0)
    return f"{SETUP_MODULE}.p{path.encode().hex()}"


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def running_servers() -> list[forkserver.ForkServer]:
    """The servers started so far (helpers per environment, never per launch: leak checks
    tell them apart by their ``_forkserver_pid`` and ``_forkserver_alive_fd``)."""
    with _servers_lock:
        return [s for s in _servers.values() if s._forkserver_pid is not None]  # type: ignore[attr-defined]


class _ServerModule:
    """``multiprocessing.forkserver`` as ``_launch`` sees it: with one server's
    ``connect_to_new_process`` in place of the module-level server's."""

    def __init__(self, server: forkserver.ForkServer) -> None:
        self.connect_to_new_process = server.connect_to_new_process

    def __getattr__(self, name: str) -> Any:
        return getattr(forkserver, name)


def _launch_through(server: forkserver.ForkServer) -> types.FunctionType:
    """CPython's own ``Popen._launch``, run with ``forkserver`` naming this server."""
    launch: Any = vars(popen_forkserver.Popen)["_launch"]
    names = dict(launch.__globals__, forkserver=_ServerModule(server))
    return types.FunctionType(
        launch.__code__, names, launch.__name__, launch.__defaults__, launch.__closure__
    )


class _ServerPopen(popen_forkserver.Popen):
    def __init__(self, process_obj: Any, server: forkserver.ForkServer) -> None:
        self._launch = types.MethodType(_launch_through(server), self)
        super().__init__(process_obj)


class ServerProcess(ForkServerProcess):
    """A forkserver ``Process`` started by the server :func:`start_through` names."""

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        # Taken off before the process object is pickled for the child.
        server = process_obj.__dict__.pop("_hwlaunch_server")
        return _ServerPopen(process_obj, server)


def start_through(server: forkserver.ForkServer, process: ServerProcess) -> None:
    """Start ``process`` as a child of ``server``."""
    process.__dict__["_hwlaunch_server"] = server
    process.start()
