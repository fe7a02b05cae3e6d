"""Restarts: a failed worker group is replaced by a new one, up to ``plan.max_restarts`` times.

A torch.distributed group cannot take a replacement rank, so a restart replaces the whole
group, as torchrun does: the failed group is shut down, a new one starts from the same plan
(a fresh rendezvous: a new port; ``init_device`` / ``init_distributed`` run again), and every
call the caller made with ``collective_rpc(..., setup=True)`` is replayed, in order, before
any other call reaches it. Workers see ``RESTART_COUNT`` and ``TORCHELASTIC_RESTART_COUNT``.

The same controller serves the mp and ray executors: it only starts executors, watches for
deaths (their monitor threads call back) and forwards calls. A death noticed between calls is
restarted at once, in a background thread; a death during a call is restarted before that
call raises ``WorkerDiedError(restarted=True)`` (it is not retried: the caller decides). When
the budget is spent, or the new group fails to start or to replay a setup call, the executor
ends as a fail-stop one does, with a ``WorkerDiedError`` that notes every restart.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Collection
from concurrent.futures import Future
from typing import Any, Protocol

from hwlaunch.errors import (
    RpcTimeoutError,
    WorkerDiedError,
    describe_exitcode,
)
from hwlaunch.executor._encoding import method_label
from hwlaunch.executor._runtime import Failure, Request
from hwlaunch.executor.base import Executor, SetupCall, silent_ranks
from hwlaunch.plan import Plan

log = logging.getLogger("hwlaunch")

RESTART_VARS = ("RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")


class Group(Protocol):
    """What the restart controller needs of one worker group: the public side of an executor
    that declares ``restarts`` (mp, ray, a plugin's). It composes groups through these
    methods only, one group at a time."""

    warnings: list[str]

    @property
    def nodes(self) -> list[Any]: ...

    def raise_if_closed(self) -> None: ...

    def exchange(
        self, request: Request, label: str, timeout: float | None, reply_rank: int | None
    ) -> tuple[list[Any], dict[int, Failure]]: ...

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any: ...

    def check_health(self) -> None: ...

    def watch_deaths(self, callback: Callable[[WorkerDiedError], None]) -> None: ...

    waiting_on: Collection[int] | None

    def rank_stacks(self, ranks: list[int], timeout: float) -> dict[int, str]: ...

    def signal_ranks(self, signum: int) -> None: ...

    def stop_group(self) -> None: ...

    def shutdown(self) -> None: ...


Starter = Callable[[Plan], Group]


def plan_for_restart(plan: Plan, count: int) -> Plan:
    """The plan a group runs under: the same, with the restart count in its environment; the
    controller, not each group, forwards signals."""
    return dataclasses.replace(
        plan,
        env={**plan.env, **dict.fromkeys(RESTART_VARS, str(count))},
        forward_signals=(),
    )


def _how(died: WorkerDiedError) -> str:
    return died.cause or describe_exitcode(died.exitcode)


def _silent(group: Group, exc: RpcTimeoutError, cause: str) -> WorkerDiedError:
    """The failure of a group whose ranks did not answer in time: the first silent rank, with
    the pid it had (read from the group, whose processes are gone by now)."""
    rank = exc.ranks[0] if exc.ranks else 0
    pids = list(getattr(group, "pids", ()))
    return WorkerDiedError(rank, pids[rank] if rank < len(pids) else None, None, cause=cause)


class RestartingExecutor(Executor):
    """An executor that declares ``restarts`` (mp, ray, a plugin's), replacing its worker group
    when a worker fails.

    The skeleton's RPC entry, lock and closed state are this object's; its "ranks" are the
    current group, an executor of its own that ``start`` makes from a plan and drives through
    the ``Group`` protocol.
    """

    def __init__(self, plan: Plan, start: Starter) -> None:
        super().__init__(plan)
        self.restarts = 0  # restarts begun (the one in progress included)
        self._start = start
        self._lock = threading.Lock()  # held for a whole restart: calls wait for the new group
        self._setup_calls: list[SetupCall] = []
        self._notes: list[str] = []
        self._final: WorkerDiedError | None = None
        self._generation = 0
        self._restart_threads: list[threading.Thread] = []

    def start_ranks(self, extension: bytes | str | None, init_distributed: bool) -> None:
        """The first group (``start`` already holds the extension and options)."""
        del extension, init_distributed
        self._inner = self._start(plan_for_restart(self.plan, 0))
        self.warnings += getattr(self._inner, "warnings", ())
        self._watch(self._inner, 0)

    # -- deaths and restarts -----------------------------------------------------------------
    def _watch(self, inner: Group, generation: int) -> None:
        inner.watch_deaths(lambda died: self._restart_soon(generation, died))

    def _restart_soon(self, generation: int, died: WorkerDiedError) -> None:
        """From a monitor thread: restart in a thread of our own (the monitor must not wait)."""
        thread = threading.Thread(
            target=self._recover, args=(generation, died), name="hwlaunch-restart", daemon=True
        )
        thread.start()
        self._restart_threads = [t for t in self._restart_threads if t.is_alive()] + [thread]

    def _recover(self, generation: int, died: WorkerDiedError) -> None:
        """Replace the group of ``generation``, which failed with ``died``; once per group."""
        with self._lock:
            if generation != self._generation or self.closed or self._final is not None:
                return
            self._generation += 1
            retired = [self._inner]
            self._inner.stop_group()
            try:
                self._restart(died, retired)
            finally:
                # After the new group started: it may share their Ray connection.
                for executor in retired:
                    executor.shutdown()

    def _restart(self, died: WorkerDiedError, retired: list[Group]) -> None:
        """Start groups until one replays every setup call, or the executor ends."""
        cause = died
        while True:
            if self.restarts >= self.plan.max_restarts:
                self._end(cause, f"no restart left (max_restarts {self.plan.max_restarts})")
                return
            self.restarts += 1
            self._note(cause)
            try:
                new = self._start(plan_for_restart(self.plan, self.restarts))
            except Exception as exc:
                self._end(cause, f"restart {self.restarts} failed to start the group: {exc}")
                return
            try:
                self._replay(new)
            except WorkerDiedError as again:  # a worker died during the restart
                new.stop_group()
                retired.append(new)
                cause = again
                continue
            except Exception as exc:  # a setup call failed (WorkerError, a timeout)
                new.shutdown()
                self._end(cause, f"a setup call failed during restart {self.restarts}: {exc}")
                return
            if self.closed:
                new.shutdown()
                return
            self._inner = new
            self._watch(new, self._generation)
            return

    def _replay(self, new: Group) -> None:
        for method, args, kwargs, timeout in self._setup_calls:
            new.collective_rpc(method, args, kwargs, timeout)

    def _note(self, died: WorkerDiedError) -> None:
        where = f", {died.where}" if died.where else ""
        text = (
            f"restart {self.restarts} of {self.plan.max_restarts}: worker rank {died.rank} "
            f"(pid {died.pid}{where}) failed: {_how(died)}"
        )
        self._notes.append(text)
        self.plan = dataclasses.replace(self.plan, warnings=(*self.plan.warnings, text))
        log.warning("hwlaunch: %s", text)

    def _end(self, died: WorkerDiedError, why: str) -> None:
        """The executor ends as a fail-stop one does: closed from now on (``closed`` says so
        before any call asks), every call raising the error that notes every restart."""
        self._final = WorkerDiedError(
            died.rank,
            died.pid,
            died.exitcode,
            died.where,
            restarts=tuple(self._notes),
            cause=f"{_how(died)}; {why}",
        )
        self.state.record_death(self._final)
        self.state.close(f"worker rank {died.rank} failed and {why}")

    def _after_failure(self, generation: int, died: WorkerDiedError) -> WorkerDiedError:
        """Restart (unless done already), then the error the failed call raises."""
        self._recover(generation, died)
        with self._lock:
            if self._final is not None:
                return self._final
            if self.closed or self._generation == generation:
                return died
            return WorkerDiedError(
                died.rank,
                died.pid,
                died.exitcode,
                died.where,
                restarted=True,
                restarts=tuple(self._notes),
                cause=died.cause,
            )

    def _current(self) -> tuple[Group, int]:
        """The group calls go to, once any restart in progress has ended."""
        with self._lock:
            return self._inner, self._generation

    # -- the Executor interface ------------------------------------------------------------
    def _setup_made(self, call: SetupCall, result: Any, non_block: bool) -> None:
        if not non_block:
            self._setup_calls.append(call)
            return

        def record(done: Future[Any]) -> None:  # once it succeeded; calls end in call order
            if done.exception() is None:
                self._setup_calls.append(call)

        result.add_done_callback(record)

    def exchange(
        self, request: Request, label: str, timeout: float | None, reply_rank: int | None
    ) -> tuple[list[Any], dict[int, Failure]]:
        inner, generation = self._current()
        try:
            inner.raise_if_closed()
            return inner.exchange(request, label, timeout, reply_rank)
        except WorkerDiedError as died:
            raise self._after_failure(generation, died) from None
        except RpcTimeoutError as exc:
            hung = _silent(
                inner,
                exc,
                f"did not answer collective_rpc {exc.method!r} within {exc.timeout:g}s",
            )
            outcome = self._after_failure(generation, hung)
            if outcome.restarted:
                exc.restarted = True
                raise
            raise outcome from exc

    def check_health(self) -> None:
        """A dead or silent worker restarts the group; the check then raises what it found."""
        with self._calls.lock:
            self.raise_if_closed()
            inner, generation = self._current()
            try:
                inner.check_health()
            except WorkerDiedError as died:
                raise self._after_failure(generation, died) from None
            except RpcTimeoutError as exc:
                hung = _silent(inner, exc, f"no answer to the health check within {exc.timeout:g}s")
                raise self._after_failure(generation, hung) from exc

    def raise_if_closed(self) -> None:
        with self._lock:  # after a restart in progress
            if self._final is not None:
                self.state.record_death(self._final)
        super().raise_if_closed()

    def stop_ranks(self, polite: bool = True) -> None:
        """A restart in progress stops at its next step; then the current group ends."""
        with self._lock:
            inner: Group | None = getattr(self, "_inner", None)  # None: the start failed
            if inner is not None:
                inner.shutdown()
        for thread in self._restart_threads:
            if thread is not threading.current_thread():
                thread.join()

    def rank_stacks(self, ranks: list[int], timeout: float) -> dict[int, str]:
        """The current group's stacks (read without the restart lock: a call may hold it)."""
        return self._inner.rank_stacks(ranks, timeout)

    def signal_ranks(self, signum: int) -> None:
        self._inner.signal_ranks(signum)

    def _silent_ranks(self) -> list[int]:
        return silent_ranks(self._inner.waiting_on, self.world_size)

    @property
    def pids(self) -> list[int | None]:
        """The current group's process ids, in rank order (after a restart in progress)."""
        with self._lock:
            return list(getattr(self._inner, "pids", []))

    @property
    def nodes(self) -> list[Any]:
        """Where each rank of the current group runs (ray executor; after a restart)."""
        with self._lock:
            return list(self._inner.nodes)

    @property
    def setup_calls(self) -> list[str]:
        """The recorded setup calls, by name, in the order a restart replays them."""
        return [method_label(call[0]) for call in self._setup_calls]
