"""The executor skeleton every executor shares (uni, mp, ray), and what they compute alike.

The base class owns the plan, the declared warnings and nodes, the closed and died state, the
RPC entry point, ``check_health`` and the error vocabulary: a failure becomes
WorkerStartupError, WorkerDiedError, RpcTimeoutError or ExecutorClosedError here, the same way
for every executor. A concrete executor implements three public extension points:
``start_ranks`` (called by ``start()``, never by the constructor), ``exchange`` (one message
with every rank) and ``stop_ranks``; it reports through ``report_status``, ``timed_out``,
``worker_died`` and ``startup_timed_out``.
"""

from __future__ import annotations

import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from multiprocessing.reduction import ForkingPickler
from types import TracebackType
from typing import Any, TypedDict, TypeVar

from hwlaunch.errors import (
    ExecutorClosedError,
    RpcTimeoutError,
    WorkerDiedError,
    WorkerStartupError,
)
from hwlaunch.executor._arguments import request_of
from hwlaunch.executor._calls import Calls, decision_source
from hwlaunch.executor._encoding import encode_extension
from hwlaunch.executor._failures import raise_first_failure, startup_failure
from hwlaunch.executor._output import open_run_dir
from hwlaunch.executor._picklecheck import check_picklable
from hwlaunch.executor._ports import free_port
from hwlaunch.executor._runtime import Failure, Request
from hwlaunch.executor._signals import SignalForwarding
from hwlaunch.executor._watchdog import FAULT_STACKS
from hwlaunch.executor.state import ClosedState
from hwlaunch.plan import Plan
from hwlaunch.spec import select_env

__all__ = [
    "Executor",
    "ExecutorOptions",
    "StatusCallback",
    "bound_devices",
    "free_port",
    "gather",
    "propagated_environment",
    "raise_first_failure",
    "startup_failure",
    "worker_environment",
]

StatusCallback = Callable[[int, str], None]


class ExecutorOptions(TypedDict, total=False):
    """What every executor's constructor takes after the plan and the worker extension,
    declared once: ``Executor.__init__`` documents them; an executor of its own passes them on
    (``**options: Unpack[ExecutorOptions]``)."""

    init_distributed: bool
    startup_timeout: float | None
    on_status: StatusCallback | None


# A call made with setup=True, as a restarted group replays it: method, args, kwargs, timeout.
SetupCall = tuple[Any, tuple[Any, ...], dict[str, Any] | None, float | None]
K = TypeVar("K", bound=Hashable)
HEALTH_TIMEOUT = 30.0  # seconds check_health() waits for every worker's ping
STACKS_TIMEOUT = 5.0  # seconds dump_stacks() waits for each rank's answer, by default
# The promise: RpcTimeoutError comes within this many seconds after the timeout, whatever state
# the silent ranks are in (their stacks, FAULT_STACKS, then SIGTERM and, FAULT_KILL_AFTER
# later, SIGKILL: docs/reliability.md has the figures measured).
TIMEOUT_BOUND = 0.5
_RAISE_SLACK = 0.05  # of the bound, kept for the way from the stop to the caller
STOP_THREAD = "hwlaunch-stop"  # listed in planning.threads.OWN_THREADS


# A plan from resolve() is plain data; one built or changed by hand may hold anything.
_PLAN_FIX = "give the plan plain values (str, int, tuples): a plan from resolve() always pickles"


class Executor(ABC):
    """Starts ``plan.world_size`` workers and runs collective RPCs on them.

    Every executor is a context manager; ``shutdown()`` is idempotent and also runs at
    interpreter exit, so no worker outlives the program. After shutdown (or after a timeout or a
    worker's death closed it) every call raises ExecutorClosedError, or the WorkerDiedError that
    closed it. ``startup_timeout`` (seconds) overrides the plan's.
    """

    restarts: int = 0  # groups replaced after a failure (max_restarts); 0 when fail-stop

    def __init__(
        self,
        plan: Plan,
        worker_extension: type | str | None = None,
        *,
        init_distributed: bool = True,
        startup_timeout: float | None = None,
        on_status: StatusCallback | None = None,
    ) -> None:
        # A plan with log_dir gets this run's directory under it now, or the ConfigError of a
        # directory that cannot be made, before anything starts (hwlaunch.executor._output).
        self.plan = open_run_dir(plan) if plan.log_dir and not plan.log_run_dir else plan
        self.warnings: list[str] = []
        self.startup_timeout = float(
            plan.startup_timeout if startup_timeout is None else startup_timeout
        )
        self._on_status = on_status
        self._calls = Calls(self)  # the RPC lock, the order of calls, the stall watchdog
        self.state = ClosedState()  # closed, why, and the first death
        self._extension = encode_extension(worker_extension)
        if plan.start_kind is not None and plan.start_kind.pickles_arguments:
            why = f"{plan.start_method} pickles the plan for each worker"
            check_picklable(plan, "plan", ForkingPickler.dumps, why, _PLAN_FIX)
        self._init_distributed = init_distributed
        self._start_called = False
        # The ranks the call in progress still waits for, kept current by an exchange that
        # can tell (the watchdog names them); None: every rank.
        self.waiting_on: Collection[int] | None = None
        self._forwarding: SignalForwarding | None = None  # forward_signals' handlers
        self._stopper: threading.Thread | None = None  # a stop after a timeout (``_stop_by``)

    def start(self) -> Executor:
        """Start every rank (``start_ranks``) and return this executor, ready for calls.

        Kept out of the constructor, so that a subclass sets its own state in ``__init__``
        before anything starts. A start that fails closes the executor and stops every rank
        already started (``stop_ranks(polite=False)``) before the error propagates.
        """
        if self._start_called:
            raise RuntimeError(f"{type(self).__name__}.start() was called twice")
        self._start_called = True
        forwards = self._forwards_signals()
        if forwards:
            SignalForwarding.check_thread(self.plan.forward_signals)
        try:
            self.start_ranks(self._extension, self._init_distributed)
        except BaseException:
            self.state.close("the workers failed to start")
            self.stop_ranks(polite=False)
            raise
        if forwards:
            self._forwarding = SignalForwarding(self.plan.forward_signals, self.signal_ranks)
            self._forwarding.install()
        return self

    def _forwards_signals(self) -> bool:
        """Whether the plan's ``forward_signals`` apply: an executor that cannot signal its
        workers (uni, whose worker is this process) says so in ``warnings``."""
        if not self.plan.forward_signals:
            return False
        if type(self).signal_ranks is Executor.signal_ranks:
            self.warnings.append(
                f"forward_signals {', '.join(self.plan.forward_signals)} is not used: the "
                f"{self.plan.executor} executor does not signal its workers (uni's worker is "
                "this process)"
            )
            return False
        return True

    # -- what a concrete executor implements ---------------------------------------------
    @abstractmethod
    def start_ranks(self, extension: bytes | str | None, init_distributed: bool) -> None:
        """Start every rank and return once all are ready; raise WorkerStartupError otherwise.
        ``self.startup_timeout`` bounds the wait (raise ``self.startup_timed_out(ranks)``);
        ``self.report_status(rank, text)`` reports progress. Called once, by ``start()``."""

    @abstractmethod
    def exchange(
        self, request: Request, label: str, timeout: float | None, reply_rank: int | None
    ) -> tuple[list[Any], dict[int, Failure]]:
        """Run one call ``(method, args, kwargs)`` on every rank; return (results, failures by
        rank). A process-based executor sends ``dumps(request)``. With ``reply_rank``, the
        other ranks' results may be None (they need not travel).

        Raise ``self.timed_out(label, ranks, timeout)`` when ranks do not answer in time and
        ``self.worker_died(...)`` when one ends."""

    def send_request(
        self, request: Request, label: str, timeout: float | None, reply_rank: int | None
    ) -> Callable[[], tuple[list[Any], dict[int, Failure]]] | None:
        """Optional: ``exchange`` in two halves. Send the call to every rank now and return
        the function that reads the replies (what ``exchange`` returns, with its errors; the
        timeout counts from now); it is called once, from any thread, with nothing sent in
        between. None (the default): this executor cannot split an exchange, and its
        non-blocking calls run whole on a background thread."""
        del request, label, timeout, reply_rank
        return None

    @abstractmethod
    def stop_ranks(self, polite: bool = True) -> None:
        """Stop every worker; never hangs; safe to call more than once and from any thread."""

    # -- the shared interface ------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @property
    def nodes(self) -> list[Any]:
        """Where each rank runs, in rank order (the ray executor's RankNode); empty on one node."""
        return []

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
        *,
        non_block: bool = False,
        unique_reply_rank: int | None = None,
        setup: bool = False,
    ) -> Any:
        """Run ``method`` on every rank; results come back in rank order.

        ``method`` is a worker method name, or a callable called as ``fn(worker, *args,
        **kwargs)`` that travels by value (cloudpickle). An exception on a rank raises
        WorkerError (the executor stays usable); a dead worker raises WorkerDiedError; no
        answer within ``timeout`` seconds raises RpcTimeoutError and shuts the executor down,
        since a collective that hung leaves the process group unusable.

        ``unique_reply_rank=R`` returns rank R's result alone: every rank still runs the call
        (and a failure on any rank still raises), but only R's result travels back.
        ``non_block=True`` returns at once a ``concurrent.futures.Future`` of what the call
        would have returned (or raised), so the caller can overlap its own work; calls run
        one after another in the order they were made, blocking or not.

        ``setup=True`` marks a call that prepares the workers (loading a model): with
        ``max_restarts``, a restarted group replays every such call, in order, before it takes
        other calls. Without restarts it changes nothing.
        """
        request, label, checked = request_of(
            method, args, kwargs, timeout, unique_reply_rank, self.world_size
        )
        if non_block:
            result: Any = self._calls.submit(request, label, checked, unique_reply_rank)
        else:
            result = self._calls.run(request, label, checked, unique_reply_rank)
        if setup:
            self._setup_made((method, tuple(args), kwargs, timeout), result, non_block)
        return result

    def _setup_made(self, call: SetupCall, result: Any, non_block: bool) -> None:
        """A ``setup=True`` call was made (and, blocking, succeeded): the restart controller
        (``executor.restart``) records it to replay; without restarts nothing is kept."""
        del call, result, non_block

    def _reply_of(self, results: list[Any], rank: int) -> Any:
        """Rank ``rank``'s result among ``results`` (every rank's, in rank order)."""
        return results[rank]

    def check_health(self) -> None:
        """Raise WorkerDiedError (or RpcTimeoutError) unless every worker answers."""
        self.raise_if_closed()
        self.collective_rpc("ping", timeout=HEALTH_TIMEOUT)

    def shutdown(self) -> None:
        """Stop every worker; never hangs; safe to call more than once."""
        self.state.close("shutdown() was called")
        self._calls.stop()
        if self._forwarding is not None:
            self._forwarding.restore()
        self.stop_ranks()
        if self._stopper is not None and self._stopper is not threading.current_thread():
            self._stopper.join()  # a stop after a timeout that outlasted its error

    def dump_stacks(
        self, ranks: Iterable[int] | None = None, timeout: float = STACKS_TIMEOUT
    ) -> dict[int, str]:
        """Each rank's current Python stack (every thread of it), read without stopping it:
        ``{rank: text}``, for ``ranks`` (default: all). Works during a call, from another
        thread; a rank that does not answer within ``timeout`` seconds gets a line saying so.
        """
        self.raise_if_closed()
        wanted = list(range(self.world_size)) if ranks is None else sorted(set(ranks))
        strangers = [r for r in wanted if isinstance(r, bool) or r not in range(self.world_size)]
        if strangers:
            raise ValueError(
                f"dump_stacks(ranks={strangers!r}): not ranks of this executor "
                f"(ranks 0 to {self.world_size - 1}), or None for every rank"
            )
        return self.rank_stacks(wanted, timeout)

    def rank_stacks(self, ranks: list[int], timeout: float) -> dict[int, str]:
        """Extension point: the ranks' stacks (see ``dump_stacks``); within ``timeout``
        seconds, never raising. An executor that cannot read them returns what it can ({})."""
        del ranks, timeout
        return {}

    def signal_ranks(self, signum: int) -> None:
        """Extension point: send ``signum`` to every worker (``forward_signals``). An executor
        that does not implement it gets no handlers installed."""
        del signum

    def _silent_ranks(self) -> list[int]:
        """The ranks the call in progress still waits for (the stall watchdog names them)."""
        return silent_ranks(self.waiting_on, self.world_size)

    def watch_deaths(self, callback: Callable[[WorkerDiedError], None]) -> None:
        """Have ``callback(error)`` called, from a monitor thread, when a worker dies between
        or during calls. Used by the restart controller; uni has no monitor and never calls it."""
        del callback

    def stop_group(self) -> None:
        """Stop every worker before a restart; resources the next group reuses may stay
        (the ray executor's connection). ``shutdown()`` still follows."""
        self.state.close("the group is being restarted")
        self.stop_ranks(polite=False)

    def __enter__(self) -> Executor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    # -- state and errors, for the concrete executors ------------------------------------
    @property
    def closed(self) -> bool:
        return self.state.closed

    def raise_if_closed(self) -> None:
        """Raise what a call meets now: the first death, or ExecutorClosedError."""
        self.state.raise_if_closed()

    def closed_during(self, label: str) -> ExecutorClosedError:
        return self.state.closed_during(label)

    def worker_died(self, died: WorkerDiedError) -> WorkerDiedError:
        """Record the first death, close, and stop the other workers; returns the first death."""
        first = self.state.record_death(died)
        self.state.close(f"worker rank {died.rank} died")
        self.stop_ranks(polite=False)
        return first

    def timed_out(self, label: str, ranks: list[int], timeout: float | None) -> RpcTimeoutError:
        """A collective that hung leaves the process group unusable: read where the silent
        ranks are stuck (within ``FAULT_STACKS``), then close, stop, report: all within
        ``TIMEOUT_BOUND`` of the timeout."""
        ends_by = time.monotonic() + TIMEOUT_BOUND - _RAISE_SLACK
        stacks = self.rank_stacks(ranks, FAULT_STACKS)
        self.state.close(f"collective_rpc {label!r} timed out")
        self._stop_by(ends_by)
        return RpcTimeoutError(label, ranks, timeout or 0.0, stacks)

    def _stop_by(self, deadline: float) -> None:
        """``stop_ranks(polite=False)``, waited for until ``deadline``. On a machine too busy
        to end the workers by then, the error is not held back: the stop goes on in a thread of
        its own (not a daemon: the program's exit waits for it), which ``shutdown()`` joins, so
        nothing is left running either way."""
        stopper = threading.Thread(
            target=self.stop_ranks, kwargs={"polite": False}, name=STOP_THREAD
        )
        stopper.start()
        stopper.join(max(0.0, deadline - time.monotonic()))
        self._stopper = stopper

    def startup_timed_out(self, ranks: Iterable[int]) -> WorkerStartupError:
        pending = sorted(ranks)
        source = decision_source(self.plan, "startup_timeout")
        return WorkerStartupError(
            pending[0],
            f"not ready within {self.startup_timeout:g}s (startup_timeout from {source}); "
            f"ranks still starting: {pending}",
        )

    def report_status(self, rank: int, text: str) -> None:
        if self._on_status is not None:
            self._on_status(rank, text)


def gather(
    pending: dict[K, int],
    wait: Callable[[list[K], float | None], Iterable[K]],
    take: Callable[[K, int], bool],
    deadline: float | None,
    on_timeout: Callable[[list[int]], BaseException],
) -> None:
    """Wait for every pending key (a pipe, a Ray reference) until ``deadline`` (a
    ``time.monotonic()`` value; None: no limit).

    ``wait(keys, remaining)`` returns the keys that are ready (it may raise, e.g. on a death, and
    it may consume replies itself and remove their keys): ``remaining`` is the deadline as the
    relative timeout its system call takes. ``take(key, rank)`` consumes one and returns
    whether that rank is done. When the deadline passes with ranks pending,
    ``on_timeout(ranks)`` is raised.
    """
    while pending:
        remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        ready = list(wait(list(pending), remaining))
        if not ready and pending and deadline is not None and time.monotonic() >= deadline:
            raise on_timeout(sorted(pending.values()))
        for key in ready:
            if key in pending and take(key, pending[key]):
                del pending[key]


def silent_ranks(waiting: Collection[int] | None, world_size: int) -> list[int]:
    """The ranks a call still waits for, read from another thread (None: every rank)."""
    if waiting is not None:
        try:
            return sorted(waiting)
        except RuntimeError:  # changed while read (a reply came): every rank, this once
            pass
    return list(range(world_size))


def visible_devices(plan: Plan, environ: Mapping[str, str] | None = None) -> str | None:
    """The device-visibility value for this job's workers on one node, or None (CPU).

    Workers see the first ``world_size`` devices of what the parent sees (its own setting of
    the variable, else every device), and bind to ``local_rank`` among them.
    """
    var = plan.device_control_env_var
    if var is None:
        return None
    env = os.environ if environ is None else environ
    if env.get(var):
        entries = [e.strip() for e in env[var].split(",") if e.strip()]
    else:
        count = plan.facts.devices[plan.backend].device_count if plan.facts else plan.world_size
        entries = [str(i) for i in range(max(count, plan.world_size))]
    return ",".join(entries[: plan.world_size])


def bound_devices(plan: Plan, local_rank: int, job_devices: str | None) -> str | None:
    """What the worker of ``local_rank`` sees under the plan's binding, given the devices of the
    job on its node (comma-separated, in local-rank order): ``job_wide`` all of them,
    ``per_worker`` its own, ``none`` (or no devices) None: the variable is left alone."""
    if job_devices is None or plan.device_binding == "none" or not plan.device_control_env_var:
        return None
    if plan.device_binding == "per_worker":
        entries = job_devices.split(",")
        return entries[local_rank] if local_rank < len(entries) else None
    return job_devices


def propagated_environment(plan: Plan, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's variables that the backend's ``propagate_env`` names, as they are now."""
    return select_env(os.environ if environ is None else environ, plan.propagate_env)


def worker_environment(
    plan: Plan,
    rank: int,
    local_rank: int,
    master_addr: str,
    master_port: int,
    local_world_size: int | None = None,
) -> dict[str, str]:
    """The variables a worker process gets on top of the parent's environment."""
    env = {**propagated_environment(plan), **plan.env}
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(plan.world_size),
        LOCAL_WORLD_SIZE=str(
            plan.world_size // max(plan.nnodes, 1) if local_world_size is None else local_world_size
        ),
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
    )
    visible = bound_devices(plan, local_rank, visible_devices(plan))
    if visible is not None and plan.device_control_env_var:
        env[plan.device_control_env_var] = visible
    return env
