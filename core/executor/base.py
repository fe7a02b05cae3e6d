"""The interface every executor shares (uni, mp, ray), and what they compute alike."""

from __future__ import annotations

import os
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from hwlaunch.errors import WorkerDiedError, WorkerError
from hwlaunch.plan import Plan
from hwlaunch.worker_runtime import Failure

StatusCallback = Callable[[int, str], None]


class Executor(ABC):
    """Starts ``plan.world_size`` workers and runs collective RPCs on them.

    Every executor is a context manager; ``shutdown()`` is idempotent and also runs at
    interpreter exit, so no worker outlives the program.
    """

    plan: Plan
    restarts: int = 0  # groups replaced after a failure (max_restarts); 0 when fail-stop

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @abstractmethod
    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
        *,
        setup: bool = False,
    ) -> list[Any]:
        """Run ``method`` on every rank; results come back in rank order.

        ``method`` is a worker method name, or a callable called as ``fn(worker, *args,
        **kwargs)`` that travels by value (cloudpickle). An exception on a rank raises
        WorkerError (the executor stays usable); a dead worker raises WorkerDiedError; no
        answer within ``timeout`` seconds raises RpcTimeoutError and shuts the executor down,
        since a collective that hung leaves the process group unusable.

        ``setup=True`` marks a call that prepares the workers (loading a model): with
        ``max_restarts``, a restarted group replays every such call, in order, before it takes
        other calls. Without restarts it changes nothing.
        """

    @abstractmethod
    def check_health(self) -> None:
        """Raise WorkerDiedError (or RpcTimeoutError) unless every worker answers."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop every worker; never hangs; safe to call more than once."""

    def watch_deaths(self, callback: Callable[[WorkerDiedError], None]) -> None:
        """Have ``callback(error)`` called, from a monitor thread, when a worker dies.

        Used by the restart controller; an executor without a monitor (uni) never calls it.
        """
        del callback  # no monitor: nothing to call it

    def stop_group(self) -> None:
        """Stop every worker before a restart; resources the next group reuses may stay
        (the ray executor's connection). ``shutdown()`` still follows."""
        self.shutdown()

    def __enter__(self) -> Executor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()


def raise_first_failure(failures: Mapping[int, Failure]) -> None:
    """Raise the lowest failing rank's exception as WorkerError, naming the other ranks."""
    if not failures:
        return
    rank = min(failures)
    failure = failures[rank]
    others = sorted(set(failures) - {rank})
    message = failure.message + (f" (ranks {others} failed too)" if others else "")
    raise WorkerError(rank, failure.exc_type, message, failure.traceback)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host`` (for the process group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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


def worker_environment(
    plan: Plan, rank: int, local_rank: int, master_addr: str, master_port: int
) -> dict[str, str]:
    """The variables a worker process gets on top of the parent's environment."""
    env = dict(plan.env)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(plan.world_size),
        LOCAL_WORLD_SIZE=str(plan.world_size // max(plan.nnodes, 1)),
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
    )
    visible = visible_devices(plan)
    if visible is not None and plan.device_control_env_var:
        env[plan.device_control_env_var] = visible
    return env
