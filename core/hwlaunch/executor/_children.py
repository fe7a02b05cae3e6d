"""How an mp worker's own children start: as a plain process's would.

Why: CPython's ``BaseProcess._bootstrap`` makes a child's default start method the one that
started it. A worker that hwlaunch started with forkserver or spawn then started its own
``multiprocessing.Pool``, ``DataLoader`` workers or compile pool the same way, and each of
those re-imported ``__main__`` and torch: a ``DataLoader(num_workers=2)`` took seconds to start
where a plain process's forks in a tenth of one. The worker puts the default back to the
platform's (fork on Linux before Python 3.14, forkserver from 3.14), which a plain process
has; code that wants another method for its children still asks for it
(``get_context("spawn")``, ``DataLoader(multiprocessing_context=...)``). The plan says
otherwise in one case: a forked worker of a program whose ``__main__`` cannot be re-run (an
unguarded launch, code read from stdin) keeps fork, under which its children need no re-run.

A fork is then unsafe in one case: the worker's own GNU OpenMP pool has started (torch ran a
parallel operation on more than one thread) and the child runs parallel work, which waits for
ever for pool threads that a child does not have. A child forked from a worker whose torch
runs on more than one thread therefore runs torch on one (``torch.set_num_threads(1)``, as
torch's DataLoader does in its own workers): its parallel operations run inline, and finish.
"""

from __future__ import annotations

import multiprocessing
import os
import sys

__all__ = ["start_children_as_a_plain_process"]

_torch_threads = 1  # the worker's, read just before each fork


def start_children_as_a_plain_process(keep_fork: bool) -> None:
    """The platform's default start method for this worker's children (``keep_fork``: the
    fork CPython set, for a forked worker whose ``__main__`` a spawn or forkserver child must
    not re-run), and one torch thread in a forked child where the worker's torch has more."""
    if not keep_fork:
        multiprocessing.set_start_method(None, force=True)  # None: the platform's, lazily
    os.register_at_fork(before=_note_torch_threads, after_in_child=_one_torch_thread)


def _note_torch_threads() -> None:
    global _torch_threads
    torch = sys.modules.get("torch")
    get = getattr(torch, "get_num_threads", None)
    _torch_threads = get() if callable(get) else 1


def _one_torch_thread() -> None:
    if _torch_threads > 1:
        sys.modules["torch"].set_num_threads(1)
