"""Starting one mp worker group: each rank's process, its pipes and channel end, its options.

Why apart from the executor: this is the one place where the plan's start method object meets
multiprocessing (a context's processes, or hwlaunch's fork server), where what a forked child
inherits is listed, and where a rank's ready message (or its start-up error, or its silent end)
is awaited. The executor then only drives the started group.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing import connection
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.forkserver import ForkServer
from typing import Any

from hwlaunch.errors import WorkerStartupError, describe_exitcode
from hwlaunch.executor._mainprep import main_entry, withholding_main
from hwlaunch.executor._output import is_terminal
from hwlaunch.executor.base import (
    StatusCallback,
    free_port,
    gather,
    propagated_environment,
    startup_failure,
    worker_environment,
)
from hwlaunch.executor.mp import _process_tree as process_tree
from hwlaunch.executor.mp._child import worker_main
from hwlaunch.executor.mp._forkserver import ServerProcess, server_for, start_through
from hwlaunch.executor.mp._group import EXIT_CODE_WAIT, WorkerGroup
from hwlaunch.executor.mp._output_pipes import OutputPipes
from hwlaunch.executor.mp._pipe_channel import open_channel
from hwlaunch.executor.mp._quiet_fork import quiet_safe_fork
from hwlaunch.executor.mp._room import room_note
from hwlaunch.plan import Plan

__all__ = ["GroupStart"]


@contextlib.contextmanager
def _global_start_method_kept() -> Iterator[None]:
    """Leave multiprocessing's global start method unset if it was.

    Starting a spawn or forkserver child asks ``multiprocessing.get_start_method()`` (CPython's
    ``spawn.get_preparation_data``), which fixes the global default as a side effect; a later
    ``multiprocessing.set_start_method()`` in the user's program would then fail with "context
    has already been set".
    """
    default: Any = multiprocessing.context._default_context  # private: no public way to unset
    was_unset = default._actual_context is None
    try:
        yield
    finally:
        if was_unset:
            default._actual_context = None


class GroupStart:
    """Starts the processes of one group (``processes``), then waits for them (``await_ready``).

    ``starting`` is the rank being started (a process or pipe that cannot be made for lack of
    room is that rank's error); ``server`` the fork server of a forkserver plan.
    """

    def __init__(
        self, plan: Plan, group: WorkerGroup, output: OutputPipes, report_status: StatusCallback
    ) -> None:
        self.plan = plan
        self.group = group
        self.output = output
        self.report_status = report_status
        self.starting = 0
        self.server: ForkServer | None = None

    def processes(self, extension: bytes | str | None, init_distributed: bool) -> None:
        """Start each rank's process (``starting``: the rank being started)."""
        plan, group = self.plan, self.group
        kind = plan.start_kind
        assert kind is not None
        ctx = kind.context()
        if kind.fork_server:
            # The server's environment holds what every worker gets before it preloads torch.
            env = {**propagated_environment(plan), **plan.env}
            self.server = server_for(env, plan.preload)
        master_port = free_port()
        death_r, death_w = ctx.Pipe(duplex=False)
        group.death_w = death_w
        group.channel = open_channel(plan.rpc_channel, plan.world_size, plan.rpc_spin)
        with quiet_safe_fork(kind):  # the threads are looked at once per launch
            for rank in range(plan.world_size):
                self.starting = rank
                options = self._child_options(rank, extension, init_distributed, master_port)
                self._spawn(ctx, rank, options, death_r, death_w)
        death_r.close()

    def _child_options(
        self, rank: int, extension: bytes | str | None, init_distributed: bool, master_port: int
    ) -> dict[str, Any]:
        """The keywords of ``worker_main`` for one rank (without its pipes)."""
        plan, master_addr = self.plan, "127.0.0.1"
        # fork and spawn children start from this process's environment as it is now; the fork
        # server's children from the server's, as it was when the server started. Sending ours
        # makes every start method see the same variables.
        forkserver = plan.start_kind is not None and plan.start_kind.fork_server
        environ = dict(os.environ) if forkserver else {}
        # One node: gloo's sockets stay on loopback (by default they bind the address the host
        # name resolves to, often an external one). The user's own setting wins.
        if sys.platform.startswith("linux") and "GLOO_SOCKET_IFNAME" not in os.environ:
            environ["GLOO_SOCKET_IFNAME"] = "lo"
        return dict(
            rank=rank,
            local_rank=rank,
            plan=plan,
            extension=extension,
            master_addr=master_addr,
            master_port=master_port,
            init_distributed=init_distributed,
            env=environ | worker_environment(plan, rank, rank, master_addr, master_port),
            replace_environ=forkserver,
            # The kernel sends PR_SET_PDEATHSIG when the *thread* that forked the child ends:
            # only safe from the main thread, or from the fork server's.
            pdeathsig=threading.current_thread() is threading.main_thread() or forkserver,
            parent_pid=None if forkserver else os.getpid(),
            driver_pid=os.getpid(),  # its py-spy reads the worker's stacks (_stacks)
            line_buffered=is_terminal(sys.stdout),
        )

    def _spawn(
        self,
        ctx: BaseContext,
        rank: int,
        options: dict[str, Any],
        death_r: Connection,
        death_w: Connection,
    ) -> None:
        group, channel = self.group, self.group.channel
        assert channel is not None
        parent_conn, child_conn = ctx.Pipe()
        group.conns.append(parent_conn)
        channel.conns.append(parent_conn)
        stacks_conn, child_stacks = ctx.Pipe()
        group.stack_conns.append(stacks_conn)
        output = self.output.open(rank)
        kind = self.plan.start_kind
        assert kind is not None
        inherited: tuple[int, ...] = ()
        if kind.copies_parent:
            inherited = (death_w.fileno(), *(c.fileno() for c in group.conns))
            inherited += (*(c.fileno() for c in group.stack_conns), *channel.child_fds(rank))
            inherited += self.output.parent_fds()
        options = dict(
            options,
            conn=child_conn,
            channel=channel.endpoint(rank, child_conn),
            stacks=child_stacks,
            output=output,
        )
        name = f"hwlaunch-{self.plan.backend}-rank{rank}"
        with _global_start_method_kept():
            entry = main_entry(name) if kind.reimports_main else None
        # The worker re-imports __main__ itself (a failure there comes back with its traceback).
        with withholding_main(name, entry) as withheld, _global_start_method_kept():
            make = ServerProcess if kind.fork_server else ctx.Process  # type: ignore[attr-defined]
            process = make(
                target=worker_main,
                name=name,
                kwargs=dict(
                    options,
                    death_r=death_r,
                    inherited_fds=inherited,
                    main=entry if withheld else None,
                ),
                daemon=False,
            )
            if self.server is not None:
                start_through(self.server, process)
            else:
                process.start()
        group.processes.append(process)
        group.pids.append(process.pid)
        group.identities.append(process_tree.identify(process.pid))
        child_conn.close()
        child_stacks.close()
        self.output.started(rank, process.pid)
        self.report_status(rank, "started")

    def await_ready(self, timeout: float, timed_out: Callable[[list[int]], BaseException]) -> None:
        """Wait for every rank's ready message; the first failure raises WorkerStartupError."""
        group = self.group
        sentinels = {p.sentinel: rank for rank, p in enumerate(group.processes)}
        pending = {conn: rank for rank, conn in enumerate(group.conns)}

        def wait(conns: list[Connection], remaining: float | None) -> list[Connection]:
            alive = [s for s, r in sentinels.items() if group.conns[r] in conns]
            ready = connection.wait([*conns, *alive], timeout=remaining)
            for obj in ready:
                if isinstance(obj, int) and not group.conns[sentinels[obj]].poll():
                    raise self._startup_death(sentinels[obj])
            return [obj for obj in ready if not isinstance(obj, int)]  # type: ignore[misc]

        def take(conn: Connection, rank: int) -> bool:
            try:
                kind, value = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):
                raise self._startup_death(rank) from None
            if kind == "startup_error":
                raise startup_failure(rank, value, room_note())
            self.report_status(rank, "ready")
            return True

        gather(pending, wait, take, time.monotonic() + timeout, timed_out)

    def _startup_death(self, rank: int) -> WorkerStartupError:
        process = self.group.processes[rank]
        process.join(EXIT_CODE_WAIT)
        return WorkerStartupError(
            rank,
            f"the process (pid {process.pid}) ended while starting, without a Python "
            f"exception: {describe_exitcode(process.exitcode)}{room_note()}",
        )
