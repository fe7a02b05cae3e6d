"""The three start methods as objects: what each copies, re-imports and preloads, and how it
starts a process.

Why objects: a start method matters to the rules (which facts make it unsafe), to the executor
(which file descriptors a child inherits, whether the plan is pickled, whether ``__main__`` is
re-imported, whether the fork server starts the child) and to the worker (whose ``__main__`` it
runs). Asked as ``plan.start_method == "fork"`` in a dozen places, each reader had to recall what
that meant there; here each method says it once, and callers ask by meaning
(``kind.copies_parent``), never by name.

Names stay strings where they are data: a backend's rule, the settings, the CLI, the Plan and its
JSON. ``kind_of`` turns a name into its object, here and nowhere else. A contract-layer module:
planning, executors and worker-side code may all import it; it imports only the standard library.

=================  ==============  ===============  ===========  ================================
method             copies parent   re-imports main  fork server  preload
=================  ==============  ===============  ===========  ================================
fork               yes             no               no           none
spawn              no              yes              no           none
forkserver         no              yes              yes          the rule's modules, the worker's
=================  ==============  ===============  ===========  ================================
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from types import MappingProxyType
from typing import Literal

__all__ = [
    "FORK",
    "FORKSERVER",
    "SPAWN",
    "START_METHODS",
    "StartMethod",
    "StartMethodKind",
    "kind_of",
]

StartMethod = Literal["fork", "spawn", "forkserver"]


@dataclass(frozen=True)
class StartMethodKind:
    """One start method and what follows from it.

    ``copies_parent``: the child is a copy of this process (fork): its threads' locks, an
    initialized device runtime and its open file descriptors come along, so the fork-safety
    facts matter (``<backend>.initialized``, ``threads``, ``in_ray_actor``), the child must
    close the parent's pipe ends, and its ``__main__`` is the parent's.
    ``reimports_main``: the child re-imports the caller's ``__main__`` (spawn and forkserver),
    so the ``main_guard`` fact matters; its arguments, the plan among them, travel pickled.
    ``fork_server``: children fork from hwlaunch's fork server (``executor.mp._forkserver``),
    which imports the preload once and holds the environment the workers start from.
    ``starts``: how a worker starts, in a sentence for people (``{backend}`` and ``{preload}``
    are filled in by ``how_workers_start``).
    """

    name: StartMethod
    copies_parent: bool
    reimports_main: bool
    fork_server: bool
    starts: str

    def __str__(self) -> str:
        return self.name

    @property
    def pickles_arguments(self) -> bool:
        """The child receives its arguments (the plan too) pickled, not as a copied memory."""
        return not self.copies_parent

    def preload(self, modules: tuple[str, ...]) -> tuple[str, ...]:
        """What is imported once before workers start: ``modules`` for the fork server,
        nothing for a method that has none."""
        return modules if self.fork_server else ()

    def context(self) -> BaseContext:
        """The multiprocessing context whose pipes and processes this method uses."""
        return multiprocessing.get_context(self.name)

    def how_workers_start(self, backend: str, preload: tuple[str, ...]) -> str:
        """How each worker starts with this method, for a plan's reason."""
        return self.starts.format(backend=backend, preload=", ".join(self.preload(preload)))


FORK = StartMethodKind(
    "fork",
    copies_parent=True,
    reimports_main=False,
    fork_server=False,
    starts="each worker is a copy of this process, made in milliseconds, without re-importing "
    "__main__",
)
SPAWN = StartMethodKind(
    "spawn",
    copies_parent=False,
    reimports_main=True,
    fork_server=False,
    starts="each worker starts a fresh interpreter and imports everything itself",
)
FORKSERVER = StartMethodKind(
    "forkserver",
    copies_parent=False,
    reimports_main=True,
    fork_server=True,
    starts="a fork server, started fresh, imports {preload} once and each worker is forked from "
    "it, so workers start fast and none inherits the {backend} state of this process",
)

_KINDS: Mapping[str, StartMethodKind] = MappingProxyType(
    {kind.name: kind for kind in (FORK, SPAWN, FORKSERVER)}
)
START_METHODS: tuple[StartMethod, ...] = tuple(kind.name for kind in _KINDS.values())


def kind_of(name: str) -> StartMethodKind:
    """The object of a start method's name; a KeyError listing the known names otherwise
    (names are checked where they enter: settings, rules, proposals)."""
    try:
        return _KINDS[name]
    except KeyError:
        raise KeyError(
            f"unknown start method {name!r}; known: {', '.join(START_METHODS)}"
        ) from None
