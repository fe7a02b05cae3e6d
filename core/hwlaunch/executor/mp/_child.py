"""The worker process's main loop for the mp executor.

Liveness: the worker ends when the parent dies, through independent paths. A thread
blocks on the read end of a *death pipe* whose only write end lives in the parent, so the
parent's death (even by SIGKILL) is an EOF here; the call channel ends too. PR_SET_PDEATHSIG
adds a kernel signal (PARENT_DEATH_SIGNAL); it is set only when the thread that forked us is
a main thread (the launcher's, or the fork server's), because the kernel fires it when that
*thread* exits, and a launch from a short-lived thread must not kill us. Each path first runs
the worker's own ``shutdown()`` within the grace (``_driver_death``). The parent that ends a
worker on purpose writes END_NOW on the death pipe first, then SIGTERM: that ends it now.

Whatever ends the worker, its descendants go first (``process_tree``): every exit path runs
through ``_end_process_tree``.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import pickle
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from hwlaunch.executor import _driver_death as driver_death
from hwlaunch.executor._capture import capture_output
from hwlaunch.executor._children import start_children_as_a_plain_process
from hwlaunch.executor._mainprep import (
    STDIN,
    refuse_reimport,
    refuse_stdin_reimport,
    reimport_main,
)
from hwlaunch.executor._proctitle import set_title
from hwlaunch.executor._runtime import Failure, flush_output, outcome, start_worker
from hwlaunch.executor._stacks import start_stack_thread
from hwlaunch.executor._worker_signals import install_dispatch
from hwlaunch.executor.mp import _process_tree as process_tree
from hwlaunch.executor.mp._pipe_channel import Endpoint
from hwlaunch.executor.transport._callables import CallReader
from hwlaunch.executor.transport._messages import SHUTDOWN
from hwlaunch.executor.transport.codec import FRAMES, encoded
from hwlaunch.plan import Plan
from hwlaunch.runtime_facts import REIMPORT_UNSAFE

PR_SET_PDEATHSIG = 1
# Not SIGTERM, which the live parent sends to end a worker now: the kernel sends this one when
# the parent's thread ends, before the parent process is gone (its other threads exiting, its
# pipes still open), so only a signal of its own tells the two apart. SIGHUP: the hangup of
# what the worker depends on, and never sent by the parent.
PARENT_DEATH_SIGNAL = signal.SIGHUP


_exiting = threading.Lock()
_exiting_thread: int | None = None
_death_r: Connection | None = None


def _parent_gone() -> bool:
    """EOF on the death pipe: the parent, its only writer, has ended."""
    try:
        return _death_r is not None and _death_r.poll(0)
    except (EOFError, OSError):
        return True


def _end_process_tree(code: int, *, exit_now: bool = True) -> None:
    """Stop this worker's descendants (compile pools, DataLoader workers, Popen), then exit now.

    Every exit path of the worker comes here: the death-pipe thread, the SIGTERM handler
    (PR_SET_PDEATHSIG or the parent's shutdown), the end of ``serve`` and a start-up failure.
    The first caller does the work; a re-entry on the same thread (a second SIGTERM
    interrupting the first handler) returns at once, and any other thread waits for the first
    to end the process, so that no path exits while another is still killing descendants.
    When the parent is gone the end is SIGKILL to the worker's own group, which also takes a
    child forked at that instant (a Pool replacing the processes being killed).
    Without ``exit_now`` (the end of ``serve``) a worker whose parent lives returns, to end
    the ordinary way (atexit handlers, flushed output). No import lock is taken here.
    """
    global _exiting_thread
    if not _exiting.acquire(blocking=False):
        if _exiting_thread == threading.get_ident():
            return
        time.sleep(process_tree.END_LIMIT + 1.0)  # the first caller ends the process first
        os._exit(code)
    _exiting_thread = threading.get_ident()
    try:
        process_tree.end_descendants()
        if _parent_gone():
            process_tree.end_group_and_self()
    except Exception:
        pass
    if not exit_now:
        _exiting_thread = None
        _exiting.release()  # a later SIGTERM (a shutdown that escalates) ends the process again
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _watch_parent(death_r: Connection) -> None:
    """The parent writes END_NOW when it ends this worker on purpose; EOF alone means that it
    died, and the worker runs its own shutdown() first (``_driver_death``)."""
    told = b""
    with contextlib.suppress(OSError):
        told = os.read(death_r.fileno(), 1)
    if told:
        _end_process_tree(1)
    else:
        driver_death.begin(_end_process_tree)


def _on_parent_death(*_: object) -> None:
    """PARENT_DEATH_SIGNAL: the thread that started this worker has ended (its process is
    dying; its descriptors may not be closed yet), so the worker shuts down in order."""
    driver_death.begin(_end_process_tree)


def _default_handlers() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(PARENT_DEATH_SIGNAL, signal.SIG_DFL)


def _install_liveness(death_r: Connection, pdeathsig: bool, parent_pid: int | None) -> None:
    global _death_r
    _death_r = death_r
    process_tree.arm()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGTERM, lambda *_: _end_process_tree(128 + signal.SIGTERM))
    signal.signal(PARENT_DEATH_SIGNAL, _on_parent_death)
    # A child this worker forks (a multiprocessing or DataLoader worker) must not inherit the
    # handlers above: its own SIGTERM should end it the ordinary way (exit code -15).
    os.register_at_fork(after_in_child=_default_handlers)
    if pdeathsig and sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, PARENT_DEATH_SIGNAL, 0, 0, 0)
        if parent_pid is not None and os.getppid() != parent_pid:
            os._exit(1)  # the parent died before the signal was armed
    threading.Thread(
        target=_watch_parent, args=(death_r,), name="hwlaunch-death-pipe", daemon=True
    ).start()


def worker_main(
    *,
    rank: int,
    local_rank: int,
    plan: Plan,
    extension: bytes | str | None,
    master_addr: str,
    master_port: int,
    init_distributed: bool,
    env: dict[str, str],
    replace_environ: bool,
    conn: Connection,
    channel: Endpoint,
    stacks: Connection,
    death_r: Connection,
    inherited_fds: tuple[int, ...],
    pdeathsig: bool,
    parent_pid: int | None,
    driver_pid: int,
    main: tuple[str, str] | None = None,
    output: tuple[Connection, Connection] | None = None,
    line_buffered: bool = False,
) -> None:
    """Start the worker, report ready (or the start-up failure), then serve RPCs until told.

    ``main``: the ``__main__`` that spawn's ``prepare()`` was kept from re-importing (see
    ``hwlaunch.executor._mainprep``); re-imported here, before any other import, so that a failure
    comes back to the parent with its traceback. The plan's env is set before that, on the only
    thread: what the program's imports read (OMP_NUM_THREADS when torch is imported) is there.
    ``output``: the driver's pipes for fds 1 and 2 (``hwlaunch.executor._capture``).
    """
    _close_inherited(inherited_fds)
    if output is not None:
        capture_output(output, line_buffered, forked=_forked(plan))
        channel.watch_output((1, 2))
    set_title(plan.backend, rank)
    if replace_environ:  # the parent's whole environment, as it was at launch
        os.environ.clear()
    os.environ.update(env)
    _install_liveness(death_r, pdeathsig, parent_pid)
    start_stack_thread(stacks, driver_pid)
    start_children_as_a_plain_process(_keeps_fork(plan))  # before __main__'s own set_start_method
    if main is not None:
        _reimport_or_fail(main, conn, plan.start_method)
    _refuse_forked_unsafe_main(plan)
    worker = _build_worker(
        plan,
        conn,
        rank=rank,
        local_rank=local_rank,
        extension=extension,
        rendezvous=(master_addr, master_port),
        init_distributed=init_distributed,
    )
    driver_death.register(worker, rank, plan.shutdown_timeout)
    conn.send_bytes(pickle.dumps(("ready", os.getpid())))
    if not serve(worker, rank, channel):  # the channel ended: the parent is gone
        driver_death.begin(_end_process_tree)
        driver_death.wait()
    _end_process_tree(0, exit_now=False)  # told to shut down


def _build_worker(
    plan: Plan,
    conn: Connection,
    *,
    rank: int,
    local_rank: int,
    extension: bytes | str | None,
    rendezvous: tuple[str, int],
    init_distributed: bool,
) -> Any:
    """The worker, started; a failure ends this process, reported to the parent. The
    forwarded signals' dispatchers come first, so that a handler the worker installs itself
    replaces them; SIGTERM stays this worker's end (the driver's escalation, its "end now")."""
    built: list[Any] = []
    install_dispatch(
        plan.forward_signals, lambda: built[0] if built else None, skip=(signal.SIGTERM,)
    )
    try:
        built.append(
            start_worker(
                plan,
                extension,
                rank=rank,
                local_rank=local_rank,
                master_addr=rendezvous[0],
                master_port=rendezvous[1],
                init_distributed=init_distributed,
            )
        )
    except BaseException as exc:
        _fail_startup(conn, Failure.current(exc))
    return built[0]


def _forked(plan: Plan) -> bool:
    """This worker is a copy of the driver (its memory, its fds, its ``__main__``)."""
    return plan.start_kind is not None and plan.start_kind.copies_parent


def _keeps_fork(plan: Plan) -> bool:
    """A forked worker whose __main__ no spawn or forkserver child may re-run keeps fork as
    its children's default (Python 3.14's own default would be forkserver)."""
    guard = plan.facts.main_guard if plan.facts is not None else None
    unsafe = guard is not None and (
        guard.status in REIMPORT_UNSAFE or os.path.basename(guard.file or "") == STDIN
    )
    return _forked(plan) and unsafe


def _refuse_forked_unsafe_main(plan: Plan) -> None:
    """Under fork this worker's __main__ is the parent's: its own spawned children would re-run
    the launch, or code read from stdin. (Under spawn/forkserver the resolver made sure the
    main is safe, and reimport_main handles stdin.)"""
    guard = plan.facts.main_guard if plan.facts is not None else None
    if guard is not None and guard.file and _forked(plan):
        if guard.status == "unguarded":
            refuse_reimport(guard.where() or guard.file)
        elif os.path.basename(guard.file) == STDIN:
            refuse_stdin_reimport()


def _close_inherited(fds: tuple[int, ...]) -> None:
    """Under fork: the parent's ends of the pipes must not stay open in the worker."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _reimport_or_fail(main: tuple[str, str], conn: Connection, method: str | None) -> None:
    """Re-import the program as ``__mp_main__``; a failure ends the worker, reported as such."""
    try:
        reimport_main(main)
    except BaseException as exc:
        failure = Failure.current(exc)
        what = "module" if main[0] == "init_main_from_name" else "file"
        message = (
            f"{failure.message} (raised while the worker re-imported the program's __main__, "
            f"{what} {main[1]}, as __mp_main__, as {method} does in every child process)"
        )
        _fail_startup(conn, dataclasses.replace(failure, message=message))


def _fail_startup(conn: Connection, failure: Failure) -> NoReturn:
    """Send the start-up failure to the parent and end this worker and its children."""
    conn.send_bytes(pickle.dumps(("startup_error", failure)))
    _end_process_tree(1)
    os._exit(1)  # not reached: another path is ending the process


def serve(worker: Any, rank: int, channel: Endpoint) -> bool:
    """Answer requests (``hwlaunch.executor.transport._messages``) with ``(rpc_id, ok, value)``;
    return True when told to shut down, False when the channel ended (the parent is gone).

    ``channel`` is this rank's end of the pipe or shared-memory channel; both give whole
    messages. With a ``reply_rank`` other than this rank, the value stays here (None travels).
    A result that cannot be pickled comes back as a Failure (``encoded``). The hot path of
    every call: one loop, no helper objects per call.
    """
    reader = CallReader()
    take, receive, send = reader.take, reader.next, channel.send
    while True:
        try:
            kind, rpc_id, reply_rank, request = receive(channel)
        except (EOFError, OSError):
            return False
        if kind == SHUTDOWN:
            try:
                worker.shutdown()
            finally:
                send(FRAMES.encode_reply((rpc_id, True, None)))
            return True
        ok, value = outcome(worker, request, take)
        if reply_rank is not None and reply_rank != rank and ok:
            value = None
        flush_output()
        reply = encoded(FRAMES.encode_reply, (rpc_id, ok, value))
        value = request = None  # so that a lent argument (see ShmEndpoint) can be free
        send(reply)
