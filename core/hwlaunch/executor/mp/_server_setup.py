"""Imported first by one of hwlaunch's fork servers: sets the workers' environment there, and
removes what the parent leaves behind when it dies without its own exit.

Why a module: a fork server is started with this process's environment and a list of modules
to import, nothing else. The list's first entries are children of this module, named after a
path (``_forkserver._clean_up_module`` and ``_env_module``), found by the finder below, never
on disk:

- ``.t<hex of a folder>``: the parent's ``multiprocessing`` temporary folder, where the
  server's listening socket lies (and those of the workers' own fork servers and managers: a
  child inherits the folder). The parent removes that folder at its exit; a parent SIGKILLed
  (or ended by a signal it does not handle) never does. The server outlives it (it ends once
  the parent and its workers have closed its "alive" pipe), so at the server's own exit, if
  the parent that started it is gone, it removes the folder as the parent's exit would have.
- ``.p<hex of a file>``: a file that holds the plan's environment; importing the module sets
  ``os.environ`` from it before the next entries (torch, the worker's module) are imported, so
  what they read at import time is the plan's. The server removes the file when it ends.

This runs in the fork server only, on its main thread, before it has started any other; its
children (the workers) never run its exit functions (they end with ``os._exit``).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.abc
import importlib.machinery
import json
import os
import shutil
import sys
import types

# A package to the import system, so that its children can be imported.
__path__: list[str] = []
ENVIRONMENT, TEMP_FOLDER = f"{__name__}.p", f"{__name__}.t"


class _SetupFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``<this module>.p<hex>`` and ``<this module>.t<hex>`` and runs them."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith((ENVIRONMENT, TEMP_FOLDER)):
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        if name.startswith(ENVIRONMENT):
            path = bytes.fromhex(name.removeprefix(ENVIRONMENT)).decode()
            with open(path) as file:
                env: dict[str, str] = json.load(file)
            os.environ.update(env)
            atexit.register(_remove, path)
        else:
            folder = bytes.fromhex(name.removeprefix(TEMP_FOLDER)).decode()
            atexit.register(_remove_orphaned, folder, os.getppid())


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _remove_orphaned(folder: str, parent: int) -> None:
    """At the server's exit: the folder and everything in it, as the parent's own exit would
    have removed them, where that parent is gone. While it lives, the folder is its to remove."""
    if os.getppid() != parent:
        shutil.rmtree(folder, ignore_errors=True)


sys.meta_path.append(_SetupFinder())
