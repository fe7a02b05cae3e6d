"""The fork rule for threads: what a fork does beside each thread, by the library it runs in.

A forked child keeps only the thread that forked. Whether the others matter is a property of
the library that runs them, and each verdict here is one a test showed by forking beside that
library's live threads (``tests/integration/test_fork_beside_libraries.py``; the table in
docs/threads.md names each test):

- ``safe``: children forked beside the thread work, and the parent goes on (OpenBLAS stops its
  pool in a ``pthread_atfork`` handler and starts it again when next used; Intel OpenMP gives
  the child a fresh runtime). The plan counts such threads and keeps fork without a word.
- ``fatal``: forked children fail for sure (GNU libgomp keeps no fork handler: a child's first
  parallel region waits for ever for pool threads it does not have). The default plan falls
  back; an explicit fork is an error.
- ``risk``: a fork may work or not, depending on what the thread holds at that moment: any
  Python thread (it may hold a lock), a native thread of a library not in the table, a thread
  the kernel showed running (busy: OpenBLAS's fork handler, for one, may hang the parent when its
  pool is working for another thread), and gRPC (a child that does not use it runs; one that
  calls through it, on a channel of its own or the parent's, fails now and then). The default
  plan falls back with a warning; an explicit fork is kept, with a warning.

Pure data and functions of the facts: the probe (``planning.threads``) says which library a
thread runs in, this module what follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hwlaunch.planning.threads import GNU_OPENMP, GRPC, INTEL_OPENMP, OPENBLAS
from hwlaunch.runtime_facts import ThreadFacts, ThreadInfo

__all__ = ["AT_FORK", "AtFork", "ThreadVerdicts", "at_fork", "judge_threads", "reasons"]

Verdict = Literal["safe", "risk", "fatal"]


@dataclass(frozen=True)
class AtFork:
    """What a fork does beside a thread of one library, and why."""

    verdict: Verdict
    why: str
    fix: str = ""  # for a fatal one: what lets the program fork all the same


AT_FORK: dict[str, AtFork] = {
    OPENBLAS: AtFork(
        "safe",
        "OpenBLAS stops its threads in a pthread_atfork handler and starts them again when "
        "next used",
    ),
    INTEL_OPENMP: AtFork(
        "safe", "Intel OpenMP's fork handler gives the child a fresh runtime with a pool of its own"
    ),
    GNU_OPENMP: AtFork(
        "fatal",
        "GNU libgomp keeps no fork handler: forked workers deadlock in their first parallel "
        "operation, waiting for OpenMP pool threads that do not exist in a child",
        "launch the workers before the first parallel torch operation in this process, or set "
        "OMP_NUM_THREADS=1 before this process imports torch (no pool is started)",
    ),
    GRPC: AtFork(
        "risk",
        "gRPC skips its fork handlers while its threads run: a child that calls through "
        "gRPC (a channel of its own or the parent's) fails now and then",
    ),
}
_PYTHON = AtFork(
    "risk", "a lock another thread holds at that moment stays locked in the child for ever"
)
_UNKNOWN = _PYTHON
_RUNNING = AtFork(
    "risk",
    "a thread on a CPU cannot be placed, and a busy pool is not what it is when idle "
    "(OpenBLAS's fork handler may hang the parent while its threads work for another thread)",
)


def at_fork(thread: ThreadInfo) -> AtFork:
    """The verdict on one thread: its library's, where the kernel showed it waiting."""
    if thread.kind == "python":
        return _PYTHON
    if thread.running:
        return _RUNNING
    return AT_FORK.get(thread.known_library or "", _UNKNOWN)


@dataclass(frozen=True)
class ThreadVerdicts:
    """The other threads of this process, by what a fork does beside them."""

    safe: tuple[ThreadInfo, ...] = ()
    risk: tuple[ThreadInfo, ...] = ()
    fatal: tuple[ThreadInfo, ...] = ()

    @property
    def gravest(self) -> Verdict | Literal["none"]:
        return "fatal" if self.fatal else "risk" if self.risk else "safe" if self.safe else "none"


def reasons(threads: tuple[ThreadInfo, ...], field: Literal["why", "fix"] = "why") -> str:
    """Why (or the fix), once per distinct text: ``OpenBLAS stops its threads ...``."""
    texts = (getattr(at_fork(t), field) for t in threads)
    return "; ".join(dict.fromkeys(text for text in texts if text))


def judge_threads(facts: ThreadFacts) -> ThreadVerdicts:
    """Each other thread by its verdict (hwlaunch's own are not among them: they only wait in
    poll or recv, and are fork-safe by construction)."""
    groups: dict[Verdict, list[ThreadInfo]] = {"safe": [], "risk": [], "fatal": []}
    for thread in facts.others:
        groups[at_fork(thread).verdict].append(thread)
    return ThreadVerdicts(*(tuple(groups[v]) for v in ("safe", "risk", "fatal")))
