"""A minimal third-party executor: one worker, run on the calling thread."""

from __future__ import annotations

from typing import Any

from hwlaunch import WorkerStartupError
from hwlaunch.executor import (
    Executor,
    Failure,
    answer,
    dumps,
    free_port,
    loads,
    start_worker,
)


class InlineExecutor(Executor):
    """The three methods of the executor skeleton; the base class does the rest."""

    worker: Any = None

    def start_ranks(self, extension: bytes | str | None, init_distributed: bool) -> None:
        try:
            self.worker = start_worker(
                self.plan,
                extension,
                rank=0,
                local_rank=0,
                master_addr="127.0.0.1",
                master_port=free_port(),
                init_distributed=init_distributed,
            )
        except Exception as exc:
            failure = Failure.current(exc)
            raise WorkerStartupError(0, f"{failure.exc_type}: {failure.message}") from None

    def exchange(
        self, request: Any, label: str, timeout: float | None, reply_rank: int | None
    ) -> tuple[list[Any], dict[int, Failure]]:
        ok, value = loads(answer(self.worker, dumps(request)))
        return ([value], {}) if ok else ([None], {0: value})

    def stop_ranks(self, polite: bool = True) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.shutdown()
