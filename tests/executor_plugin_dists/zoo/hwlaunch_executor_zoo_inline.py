"""A minimal third-party executor: one worker, run on the calling thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hwlaunch import Plan, WorkerStartupError
from hwlaunch.executor import (
    Executor,
    Failure,
    StatusCallback,
    answer,
    dumps,
    encode_extension,
    encode_method,
    free_port,
    loads,
    raise_first_failure,
    start_worker,
)


class InlineExecutor(Executor):
    def __init__(
        self,
        plan: Plan,
        worker_extension: type | str | None = None,
        *,
        init_distributed: bool = True,
        startup_timeout: float | None = None,
        on_status: StatusCallback | None = None,
    ) -> None:
        self.plan = plan
        self.warnings: list[str] = []
        self.closed = False
        try:
            self.worker = start_worker(
                plan,
                encode_extension(worker_extension),
                rank=0,
                local_rank=0,
                master_addr="127.0.0.1",
                master_port=free_port(),
                init_distributed=init_distributed,
            )
        except Exception as exc:
            failure = Failure.current(exc)
            raise WorkerStartupError(0, f"{failure.exc_type}: {failure.message}") from None

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        if self.closed:
            raise RuntimeError("this executor was shut down; launch a new one")
        ok, value = loads(answer(self.worker, dumps((encode_method(method), args, kwargs or {}))))
        if not ok:
            raise_first_failure({0: value})
        return [value]

    def check_health(self) -> None:
        self.collective_rpc("ping")

    def shutdown(self) -> None:
        if not self.closed:
            self.closed = True
            self.worker.shutdown()
