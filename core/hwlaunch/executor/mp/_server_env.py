"""Imported first by one of hwlaunch's fork servers: sets the workers' environment there.

Why a module: a fork server is started with this process's environment and a list of modules
to import, nothing else. The list's first entry is a child of this module named after a file
that holds the environment (``_forkserver._env_module``); importing it sets ``os.environ``
from the file before the next entries (torch, the worker's module) are imported, so what they
read at import time is the plan's. This runs in the fork server only, on its main thread,
before it has started any other.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types

# A package to the import system, so that its children (the environment files) can be
# imported; they are found by the finder below, never on disk.
__path__: list[str] = []
_PREFIX = f"{__name__}.p"


class _EnvironmentFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``<this module>.p<hex of a file path>`` and runs it: the file's variables are set."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_PREFIX):
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        path = bytes.fromhex(module.__name__.removeprefix(_PREFIX)).decode()
        with open(path) as file:
            env: dict[str, str] = json.load(file)
        os.environ.update(env)
        atexit.register(_remove, path)  # the server's exit; its children never run this


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


sys.meta_path.append(_EnvironmentFinder())
