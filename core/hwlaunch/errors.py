"""The error vocabulary of hwlaunch.

User errors (bad configuration, an impossible start method, a missing main guard, an absent
backend) carry ``exit_code = 2``: the CLI prints their message alone, without a traceback.
Worker errors describe what happened inside worker processes and keep the remote traceback.
"""

from __future__ import annotations


class HwlaunchError(Exception):
    """Base class of every error hwlaunch raises on purpose."""

    exit_code: int = 1


class ConfigError(HwlaunchError):
    """A setting has a bad value or an unknown key; the message names its source."""

    exit_code = 2


class NotPicklableError(ConfigError):
    """What a worker starts with (the worker extension, the plan) cannot be pickled; the
    message names the object and the attribute path that fails, before any process starts."""


class PluginError(HwlaunchError):
    """A backend plugin failed to load or registered an invalid BackendSpec."""

    exit_code = 2


class StartMethodError(HwlaunchError):
    """The requested or required start method cannot work here; the message says why."""

    exit_code = 2


class MissingMainGuardError(StartMethodError):
    """spawn/forkserver would re-import a ``__main__`` whose launch is not main-guarded."""


class BackendUnavailableError(HwlaunchError):
    """The chosen backend is unknown or its device is not present."""

    exit_code = 2


class WorkerError(HwlaunchError):
    """An exception raised inside a worker; the executor stays usable."""

    def __init__(self, rank: int, exc_type: str, message: str, remote_traceback: str) -> None:
        self.rank = rank
        self.exc_type = exc_type
        self.message = message
        self.remote_traceback = remote_traceback
        super().__init__(
            f"rank {rank} raised {exc_type}: {message}\n"
            f"--- remote traceback (rank {rank}) ---\n{remote_traceback.rstrip()}"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.rank, self.exc_type, self.message, self.remote_traceback))


class ReplyDecodeError(WorkerError):
    """The driver could not decode (unpickle) a rank's reply: the worker raised nothing, its
    result holds an object the driver cannot rebuild (a class only the workers can import).
    ``remote_traceback`` is the driver's own, of the decoding. The executor stays usable."""

    def __init__(
        self,
        rank: int,
        exc_type: str,
        message: str,
        remote_traceback: str,
        label: str = "",
        others: str = "",
    ) -> None:
        self.rank = rank
        self.exc_type = exc_type
        self.message = message
        self.remote_traceback = remote_traceback
        self.label = label
        self.others = others
        call = f" to collective_rpc {label!r}" if label else ""
        HwlaunchError.__init__(
            self,
            f"the driver could not decode rank {rank}'s reply{call}: {exc_type}: {message}"
            f"{others}. The result was pickled in the worker and cannot be unpickled here; "
            "return plain data (numbers, strings, lists, dicts, tensors), or make its class "
            "importable in the driver too\n"
            f"--- the driver's traceback (decoding rank {rank}'s reply) ---\n"
            f"{remote_traceback.rstrip()}",
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (
            type(self),
            (
                self.rank,
                self.exc_type,
                self.message,
                self.remote_traceback,
                self.label,
                self.others,
            ),
        )


class WorkerDiedError(HwlaunchError):
    """A worker process (or Ray actor) ended while it was expected to be alive.

    With ``max_restarts``, ``restarted`` says that the executor has since replaced the whole
    group (the call that failed was not retried: the caller decides); ``restarts`` notes every
    restart that happened before, so the final error tells the whole story.
    """

    def __init__(
        self,
        rank: int,
        pid: int | None,
        exitcode: int | None,
        where: str | None = None,
        *,
        restarted: bool = False,
        restarts: tuple[str, ...] = (),
        cause: str | None = None,
    ) -> None:
        self.rank = rank
        self.pid = pid
        self.exitcode = exitcode
        self.where = where
        self.restarted = restarted
        self.restarts = restarts
        self.cause = cause
        how = cause or describe_exitcode(exitcode)
        text = f"worker rank {rank} (pid {pid}{', ' + where if where else ''}) died: {how}; "
        if restarted:
            text += f"the group was restarted (restart {len(restarts)}); the call was not retried"
        else:
            text += "the remaining workers were shut down"
        if restarts and not restarted:
            text += "; restarts before: " + "; ".join(restarts)
        super().__init__(text)

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild_died,
            (
                self.rank,
                self.pid,
                self.exitcode,
                self.where,
                self.restarted,
                self.restarts,
                self.cause,
            ),
        )


def _rebuild_died(
    rank: int,
    pid: int | None,
    exitcode: int | None,
    where: str | None,
    restarted: bool,
    restarts: tuple[str, ...],
    cause: str | None,
) -> WorkerDiedError:
    return WorkerDiedError(
        rank, pid, exitcode, where, restarted=restarted, restarts=restarts, cause=cause
    )


class ExecutorClosedError(HwlaunchError):
    """The executor was shut down (by ``shutdown()``, a timeout or an interrupt); launch a new
    one. A worker's death closes it too, and then raises that WorkerDiedError instead."""


class RpcTimeoutError(HwlaunchError):
    """Some ranks did not answer a collective RPC within its timeout.

    ``stacks`` holds, for each rank that did not answer, its Python stack (every thread) as
    it was when the timeout struck, so the error says where each one was stuck.
    ``restarted``: with ``max_restarts``, the executor has replaced the hung group since.
    """

    restarted = False

    def __init__(
        self,
        method: str,
        ranks: list[int],
        timeout: float,
        stacks: dict[int, str] | None = None,
    ) -> None:
        self.method = method
        self.ranks = ranks
        self.timeout = timeout
        self.stacks = dict(stacks or {})
        text = (
            f"collective_rpc {method!r} timed out after {timeout:g}s; "
            f"ranks that did not answer: {ranks}"
        )
        super().__init__(text + format_stacks(self.stacks))

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.method, self.ranks, self.timeout, self.stacks))


def format_stacks(stacks: dict[int, str]) -> str:
    """The ranks' stacks as message text, one titled block per rank (empty without any)."""
    return "".join(
        f"\n--- stack of rank {rank} ---\n{text.rstrip()}" for rank, text in sorted(stacks.items())
    )


class WorkerStartupError(HwlaunchError):
    """A worker failed while starting (importing its class, initializing the device)."""

    def __init__(self, rank: int, reason: str, remote_traceback: str = "") -> None:
        self.rank = rank
        self.reason = reason
        self.remote_traceback = remote_traceback
        text = f"worker rank {rank} failed to start: {reason}"
        if remote_traceback:
            text += f"\n--- remote traceback (rank {rank}) ---\n{remote_traceback.rstrip()}"
        super().__init__(text)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.rank, self.reason, self.remote_traceback))


def describe_exitcode(exitcode: int | None) -> str:
    """Render a multiprocessing exit code: negative values are signals."""
    import signal

    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"
