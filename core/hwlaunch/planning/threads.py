"""Which threads of this process a forked child would lack, and the library each runs in, read
without importing anything.

A forked child has one thread: the one that forked. Locks that other threads held stay locked
in the child for ever, and a thread pool the parent had started is gone while the library that
owns it may still believe it is there. Whether that matters depends on the library: GNU libgomp
(torch's OpenMP) surely hangs a child, OpenBLAS stops its pool around a fork and is harmless.
This module only finds out which library each thread runs in (the facts); what a fork does
beside it is the rule's (``planning.fork_safety``).

Threads are read from ``/proc/self/task``, where it exists: Python's own ``threading`` names
the Python threads, and each native thread is placed in the shared library it is running in.
Its program counter (``/proc/self/task/<tid>/syscall``) is in libgomp for an idle OpenMP
worker, which calls futex itself; a thread blocked in libc (a condition variable) is placed by
the first return address above its stack pointer that lies in another library's code (a word
that follows a call instruction there: a function's address kept as data is not taken for
one). The kernel gives a thread's registers only while it waits in a system call: one on a
CPU, or spinning before it sleeps, reads ``running`` and is looked at again for a while.
Reading those files needs no privilege for one's own threads and stops nothing.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import platform
import re
import struct
import sys
import threading
import time
from typing import NamedTuple

from hwlaunch.runtime_facts import ThreadFacts, ThreadInfo

__all__ = ["KNOWN_LIBRARIES", "OWN_THREADS", "known_library", "probe_threads"]

# hwlaunch's threads that only wait in poll or recv and hold no lock a forked child needs (named
# where they are started). The uni executor's worker thread is not one: it runs user code. The
# output threads write to sys.stdout, whose lock a forked worker never uses: it gets streams of
# its own (executor._capture).
OWN_THREADS = frozenset(
    (
        "hwlaunch-monitor",
        "hwlaunch-rpc",
        "hwlaunch-collect",  # executor._deferred: reads a non-blocking call's unread replies
        "hwlaunch-restart",
        "hwlaunch-ray-monitor",
        "hwlaunch-watchdog",  # executor._watchdog: sleeps on an Event between calls
        "hwlaunch-stacks",  # executor._stacks, in a worker: waits in recv on its pipe
        "hwlaunch-output",  # executor.mp._output_pipes, in the driver: reads the workers' output pipes
        "hwlaunch-ray-output",  # executor.ray._output, in the driver: collects the actors' output
        "hwlaunch-forward-signal",  # executor.ray: sends one forwarded signal to the actors, ends
        "hwlaunch-stop",  # executor.base: ends the workers after a timeout's error was raised
    )
)
OPENBLAS, GNU_OPENMP, INTEL_OPENMP, GRPC = (
    "OpenBLAS",
    "GNU OpenMP pool",
    "Intel OpenMP pool",
    "gRPC",
)
# The libraries whose behaviour at fork the rules know, by the file a thread runs in, as the
# wheels that ship them name it: numpy's libscipy_openblas64_-32a4b2a6.so, opencv's
# libopenblasp-r0-2ecf47d5.3.13.so, a distribution's libopenblas.so.0; torch's libgomp.so.1
# (libgomp-a34b3233.so.1.0.0 where auditwheel renamed it); intel-openmp's libiomp5.so (MKL's
# threads are its threading layer's: Intel OpenMP by default); grpcio's cygrpc extension.
KNOWN_LIBRARIES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^lib(?:scipy_)?openblas"), OPENBLAS),
    (re.compile(r"^libgomp[-.]"), GNU_OPENMP),
    (re.compile(r"^libiomp5[-.]"), INTEL_OPENMP),
    (re.compile(r"^cygrpc\."), GRPC),
)
_SYSTEM = re.compile(r"^(libc\.so|libpthread|ld-linux|ld-musl|libc\.musl|\[vdso\]|libstdc\+\+)")
_PACKAGE = re.compile(r"[/\\](?:site|dist)-packages[/\\]([A-Za-z_][\w]*?)(?:\.libs)?[/\\]")
_STACK_BYTES = 65536  # how much of a thread's stack, from its pointer up, to read at most
# A thread on a CPU (or waiting for one) shows no registers: look again, backing off from 1 ms,
# until every thread is placed or this much time has passed for the whole probe. A pool thread
# spins a while after its work before it sleeps (OpenBLAS about 2**28 CPU cycles, 0.11 s at
# 2.4 GHz; Intel OpenMP 200 ms, its KMP_BLOCKTIME), and a busy machine keeps it waiting to run.
RUNNING_WAIT_S = 0.3
_MACHINE = platform.machine()


class _Maps(NamedTuple):
    """This process's mappings from ``/proc/self/maps``, sorted by start address: every one
    (``starts``, ``ends``) and those of files' code (``code_starts``, ``code``)."""

    starts: list[int]
    ends: list[int]
    code_starts: list[int]
    code: list[tuple[int, int, str]]


def probe_threads(settle: float = RUNNING_WAIT_S) -> ThreadFacts:
    """The other threads of this process, hwlaunch's own counted apart. ``settle``: how long
    to keep looking at native threads that the kernel shows running."""
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
    places = _places(native, settle) if native else {}
    others = tuple(
        ThreadInfo(named[tid], "python") if tid in named else _native(tid, places.get(tid, ""))
        for tid in foreign
    )
    return ThreadFacts(others, len(own), free_threaded, source)


def known_library(path: str) -> str | None:
    """The library hwlaunch knows a file as (``OpenBLAS`` for ``.../libopenblas.so.0``)."""
    name = os.path.basename(path)
    return next((known for pattern, known in KNOWN_LIBRARIES if pattern.match(name)), None)


def _native(tid: int, path: str | None) -> ThreadInfo:
    """``path``: the library file; None where the thread was running; "" where it could not
    be told otherwise (gone, no /proc/self/mem, no library on its stack)."""
    if not path:
        return ThreadInfo(_comm(tid), "native", running=path is None)
    owner = _PACKAGE.search(path)
    return ThreadInfo(
        _comm(tid),
        "native",
        os.path.basename(path),
        owner.group(1) if owner else None,
        known_library(path),
    )


def _comm(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return str(tid)


def _places(tids: list[int], settle: float) -> dict[int, str | None]:
    """The library each native thread runs in (full path), None for a thread still running
    after ``settle`` seconds, "" where it cannot be told."""
    maps = _mappings()
    if maps is None:
        return {}
    registers = _registers(tids, settle)
    try:
        memory = os.open("/proc/self/mem", os.O_RDONLY)
    except OSError:
        memory = -1
    try:
        return {
            tid: _place(registers[tid], maps, memory) if tid in registers else None for tid in tids
        }
    finally:
        if memory >= 0:
            os.close(memory)


def _place(registers: tuple[int, int] | None, maps: _Maps, memory: int) -> str:
    if registers is None:  # the thread has ended
        return ""
    sp, pc = registers
    library = _library_at(pc, maps)
    if library is not None and not _SYSTEM.match(os.path.basename(library)):
        return library
    return (_starting_library(sp, maps, memory) if memory >= 0 else library) or ""


def _registers(tids: list[int], settle: float) -> dict[int, tuple[int, int] | None]:
    """(stack pointer, program counter) of each thread blocked in the kernel, None for one
    that has ended; running ones are left out."""
    found: dict[int, tuple[int, int] | None] = {}
    pending = list(tids)
    deadline = time.monotonic() + settle
    pause = 0.001
    while True:
        running = []
        for tid in pending:
            try:
                with open(f"/proc/self/task/{tid}/syscall") as f:
                    fields = f.read().split()
            except OSError:  # the thread has ended
                found[tid] = None
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


def _starting_library(sp: int, maps: _Maps, memory: int) -> str | None:
    """The library of the thread's outermost frame: the first return address into a library
    outside libc, read from the stack's base (where libc's ``start_thread`` called the
    thread's function) towards ``sp``. The frames near ``sp`` are a wait's in libc, whose
    unused slots still hold return addresses of earlier calls that went deeper (an OpenMP
    worker's into the parallel region's code); the outer frames are written once, when the
    thread starts. Above ``start_thread`` lie the thread's own data, not frames."""
    i = bisect.bisect_right(maps.starts, sp) - 1
    end = min(maps.ends[i], sp + _STACK_BYTES) if i >= 0 and sp < maps.ends[i] else sp
    data = b""
    with contextlib.suppress(OSError, OverflowError, ValueError):
        data = os.pread(memory, end - sp, sp)
    outermost, started = None, False
    for (word,) in reversed(list(struct.iter_unpack("<Q", data[: len(data) // 8 * 8]))):
        library = _library_at(word, maps)
        if library is None or not _after_call(word, memory):
            continue
        if _SYSTEM.match(os.path.basename(library)):
            started = True
        elif started:
            return library
        else:
            outermost = outermost or library
    return outermost


def _after_call(address: int, memory: int) -> bool:
    """Whether the instruction before ``address`` is a call, as it is before a return address
    (x86-64: ``call rel32``, or ``call`` through a register or memory, 2 to 7 bytes; arm64:
    ``bl``, ``blr``). Elsewhere every address passes."""
    if _MACHINE not in ("x86_64", "aarch64"):
        return True
    before = b""
    with contextlib.suppress(OSError, OverflowError, ValueError):
        before = os.pread(memory, 8, address - 8)
    if len(before) < 8:
        return False
    if _MACHINE == "aarch64":
        insn = int.from_bytes(before[4:], "little")
        return insn >> 26 == 0b100101 or insn & 0xFFFFFC1F == 0xD63F0000
    indirect = any(before[8 - k] == 0xFF and (before[9 - k] >> 3) & 7 == 2 for k in range(2, 8))
    return before[3] == 0xE8 or indirect


def _mappings() -> _Maps | None:
    """This process's mappings, and which of them hold a file's code."""
    spans: list[tuple[int, int, str]] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                start, _, end = parts[0].partition("-")
                file = parts[5].strip() if len(parts) == 6 and "x" in parts[1] else ""
                spans.append((int(start, 16), int(end, 16), file))
    except OSError:
        return None
    spans.sort()
    code = [span for span in spans if span[2]]
    return _Maps([s[0] for s in spans], [s[1] for s in spans], [s[0] for s in code], code)


def _library_at(address: int, maps: _Maps) -> str | None:
    i = bisect.bisect_right(maps.code_starts, address) - 1
    if i >= 0 and maps.code[i][0] <= address < maps.code[i][1]:
        return maps.code[i][2]
    return None
