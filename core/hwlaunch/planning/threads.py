"""Which threads of this process a forked child would lack, read without importing anything.

A forked child has one thread: the one that forked. Locks that other threads held stay locked
in the child for ever, and a thread pool the parent had started is gone while the library that
owns it still believes it is there. GNU libgomp (torch's OpenMP) is the case that surely
hangs: after one parallel torch operation in the parent, a forked worker waits in its first
matmul for pool threads that do not exist.

Threads are read from ``/proc/self/task``, where it exists: Python's own ``threading`` names
the Python threads, and each native thread is placed in the shared library it is running in.
Its program counter (``/proc/self/task/<tid>/syscall``) is in libgomp for an idle OpenMP
worker, which calls futex itself; a thread blocked in libc (a condition variable) is placed by
the first return address above its stack pointer that lies in another library's code. Reading
those files needs no privilege for one's own threads and stops nothing.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import re
import struct
import sys
import threading
import time

from hwlaunch.runtime_facts import ThreadFacts, ThreadInfo, ThreadKind

__all__ = ["OWN_THREADS", "probe_threads"]

# hwlaunch's threads that only wait in poll or recv and hold no lock a forked child needs (named
# where they are started). The uni executor's worker thread is not one: it runs user code. The
# output threads write to sys.stdout, whose lock a forked worker never uses: it gets streams of
# its own (executor._capture).
OWN_THREADS = frozenset(
    (
        "hwlaunch-monitor",
        "hwlaunch-rpc",
        "hwlaunch-restart",
        "hwlaunch-ray-monitor",
        "hwlaunch-watchdog",  # executor._watchdog: sleeps on an Event between calls
        "hwlaunch-stacks",  # executor._stacks, in a worker: waits in recv on its pipe
        "hwlaunch-output",  # executor.mp._output_pipes, in the driver: reads the workers' output pipes
        "hwlaunch-ray-output",  # executor.ray._output, in the driver: collects the actors' output
        "hwlaunch-forward-signal",  # executor.ray: sends one forwarded signal to the actors, ends
    )
)
OPENMP_LIBRARIES = ("libgomp",)  # GNU OpenMP keeps no fork handler: its pool breaks in a child
_SYSTEM = re.compile(r"^(libc\.so|libpthread|ld-linux|ld-musl|libc\.musl|\[vdso\]|libstdc\+\+)")
_PACKAGE = re.compile(r"[/\\](?:site|dist)-packages[/\\]([A-Za-z_][\w]*?)(?:\.libs)?[/\\]")
_STACK_BYTES = 16384  # how far above a thread's stack pointer to look for its caller
# A thread on a CPU (or waiting for one) shows no stack pointer: look again, backing off from
# 1 ms, until every thread is placed or this much time has passed for the whole probe. An idle
# OpenMP worker spins a little before it sleeps, and a busy machine keeps it waiting to run.
_RUNNING_WAIT_S = 0.05

CodeMap = tuple[list[int], list[tuple[int, int, str]]]


def probe_threads() -> ThreadFacts:
    """The other threads of this process, hwlaunch's own counted apart."""
    gil = getattr(sys, "_is_gil_enabled", None)
    free_threaded = callable(gil) and not gil()
    named = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    me = threading.get_native_id()
    own = {tid for tid, name in named.items() if name in OWN_THREADS}
    try:
        tids = sorted(int(t) for t in os.listdir("/proc/self/task"))
    except OSError:  # no /proc: the Python threads are all that can be seen
        tids, source = sorted(named), "threading"
    else:
        source = "/proc/self/task"
    foreign = [tid for tid in tids if tid != me and tid not in own]
    native = [tid for tid in foreign if tid not in named]
    places = _places(native) if native else {}
    others = tuple(
        ThreadInfo(named[tid], "python") if tid in named else _native(tid, places.get(tid))
        for tid in foreign
    )
    return ThreadFacts(others, len(own), free_threaded, source)


def _native(tid: int, path: str | None) -> ThreadInfo:
    if path is None:
        return ThreadInfo(_comm(tid), "native")
    library = os.path.basename(path)
    kind: ThreadKind = "openmp" if library.startswith(OPENMP_LIBRARIES) else "native"
    owner = _PACKAGE.search(path)
    return ThreadInfo(_comm(tid), kind, library, owner.group(1) if owner else None)


def _comm(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return str(tid)


def _places(tids: list[int]) -> dict[int, str | None]:
    """The library each native thread runs in (full path), or None where it cannot be told."""
    code = _code_mappings()
    if code is None:
        return {}
    registers = _registers(tids)
    try:
        memory = os.open("/proc/self/mem", os.O_RDONLY)
    except OSError:
        memory = -1
    try:
        return {tid: _place(registers.get(tid), code, memory) for tid in tids}
    finally:
        if memory >= 0:
            os.close(memory)


def _place(registers: tuple[int, int] | None, code: CodeMap, memory: int) -> str | None:
    if registers is None:
        return None
    sp, pc = registers
    library = _library_at(pc, code)
    if library is not None and not _SYSTEM.match(os.path.basename(library)):
        return library
    return _caller_library(sp, code, memory) if memory >= 0 else library


def _registers(tids: list[int]) -> dict[int, tuple[int, int]]:
    """(stack pointer, program counter) of each thread blocked in the kernel; running ones and
    gone ones are left out."""
    found: dict[int, tuple[int, int]] = {}
    pending = list(tids)
    deadline = time.monotonic() + _RUNNING_WAIT_S
    pause = 0.001
    while True:
        running = []
        for tid in pending:
            try:
                with open(f"/proc/self/task/{tid}/syscall") as f:
                    fields = f.read().split()
            except OSError:  # the thread has ended
                continue
            if len(fields) >= 3 and fields[0] != "running":
                found[tid] = int(fields[-2], 16), int(fields[-1], 16)
            else:
                running.append(tid)
        left = deadline - time.monotonic()
        if not running or left <= 0:
            return found
        time.sleep(min(pause, left))
        pending, pause = running, pause * 2


def _caller_library(sp: int, code: CodeMap, memory: int) -> str | None:
    """The first library outside libc whose code an address above ``sp`` points into."""
    data = b""
    with contextlib.suppress(OSError, OverflowError, ValueError):
        data = os.pread(memory, _STACK_BYTES, sp)
    for (word,) in struct.iter_unpack("<Q", data[: len(data) // 8 * 8]):
        library = _library_at(word, code)
        if library is not None and not _SYSTEM.match(os.path.basename(library)):
            return library
    return None


def _code_mappings() -> CodeMap | None:
    """The executable mappings of files, sorted by start address."""
    spans: list[tuple[int, int, str]] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and "x" in parts[1]:
                    start, _, end = parts[0].partition("-")
                    spans.append((int(start, 16), int(end, 16), parts[5].strip()))
    except OSError:
        return None
    spans.sort()
    return [s[0] for s in spans], spans


def _library_at(address: int, code: CodeMap) -> str | None:
    starts, spans = code
    i = bisect.bisect_right(starts, address) - 1
    if i >= 0 and spans[i][0] <= address < spans[i][1]:
        return spans[i][2]
    return None
