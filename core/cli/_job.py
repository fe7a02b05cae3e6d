"""``hwlaunch run``: the main job, end to end.

Resolve a plan, start the workers with live progress, check the process group with an
all-reduce, load a causal LM in every worker, split the prompts across ranks, generate greedily,
and verify the tokens against the same model run in a single process.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hwlaunch.errors import HwlaunchError
from hwlaunch.plan import Plan

DEFAULT_PROMPTS = (
    "The quick brown fox",
    "hwlaunch starts workers",
    "Hello, world",
    "Once upon a time",
)


class RunCheckFailed(HwlaunchError):
    """A check of the main job failed (wrong all-reduce sum, tokens that differ); ``result``
    is the job's report, for ``--json`` to print with the error."""

    def __init__(self, message: str, result: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.result = result


def result_of(error: BaseException) -> dict[str, Any] | None:
    """The job's report that came with a failed check, if any."""
    return error.result if isinstance(error, RunCheckFailed) else None


class GenerationWorker:
    """Worker extension: the model lives in the worker between RPCs."""

    rank: int
    device: Any

    def load_model(self, path: str | None) -> str:
        from hwlaunch.cli import _demo_model as demo_model

        self._model = demo_model.load(path, self.device)
        return self._model.name

    def generate(self, prompts: list[str], max_new_tokens: int) -> list[dict[str, Any]]:
        from hwlaunch.cli import _demo_model as demo_model

        return demo_model.generate(self._model, prompts, max_new_tokens)


@dataclass
class Progress:
    """Per-rank status, shown live on a terminal and as plain lines otherwise."""

    world_size: int
    quiet: bool
    status: dict[int, str] = field(default_factory=dict)
    _live: Any = None

    def __call__(self, rank: int, status: str) -> None:
        self.status[rank] = status
        self._refresh()

    def all(self, status: str) -> None:
        for rank in range(self.world_size):
            self.status[rank] = status
        self._refresh()

    def _table(self) -> Any:
        from rich.table import Table

        table = Table(title="workers", title_justify="left")
        table.add_column("rank")
        table.add_column("status")
        for rank in range(self.world_size):
            table.add_row(str(rank), self.status.get(rank, "starting"))
        return table

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._table())

    @contextmanager
    def shown(self) -> Iterator[Progress]:
        if self.quiet:
            yield self
            return
        from rich.console import Console
        from rich.live import Live

        console = Console(stderr=True)
        with Live(self._table(), console=console, refresh_per_second=8, transient=False) as live:
            self._live = live
            try:
                yield self
            finally:
                self._live = None
        console.print()


def split(prompts: list[str], world_size: int) -> list[list[str]]:
    """Round-robin: rank r gets prompts r, r + n, r + 2n, ..."""
    return [prompts[rank::world_size] for rank in range(world_size)]


def merge(parts: list[list[Any]], world_size: int) -> list[Any]:
    total = sum(len(p) for p in parts)
    return [parts[i % world_size][i // world_size] for i in range(total)]


def this_rank(plan: Plan) -> int:
    """The rank this process is: 0 (the driver) unless a launcher started it as one rank."""
    return int(plan.decision("rank").value) if plan.ranks_from_launcher else 0


def every_rank(executor: Any, fn: Callable[..., Any], args: tuple[Any, ...] = ()) -> list[Any]:
    """``fn(worker, *args)`` on every rank, results in rank order, in every process.

    Under the external executor each process is one rank and ``collective_rpc`` returns its
    own result only: the ranks exchange theirs over the process group.
    """
    if not executor.plan.ranks_from_launcher:
        return list(executor.collective_rpc(fn, args=args))
    return list(executor.collective_rpc(_all_gathered, args=(fn, args))[0])


def _all_gathered(worker: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> list[Any]:
    import torch.distributed as dist

    gathered: list[Any] = [None] * worker.world_size
    dist.all_gather_object(gathered, fn(worker, *args))
    return gathered


def reference_outputs(
    executor: Any, plan: Plan, model: str | None, prompts: list[str], max_new_tokens: int
) -> list[dict[str, Any]]:
    """All prompts through one model in one process: this one on CPU, else rank 0 alone."""
    if plan.backend == "cpu":
        from hwlaunch.cli import _demo_model as demo_model

        return demo_model.generate(demo_model.load(model), prompts, max_new_tokens)

    def rank0_all(worker: Any, prompts: list[str], k: int) -> Any:
        return worker.generate(prompts, k) if worker.rank == 0 else None

    return list(every_rank(executor, rank0_all, (prompts, max_new_tokens))[0])


def _ping_median_ms(executor: Any, times: int = 5) -> float:
    """The median round trip of a no-op collective_rpc, in milliseconds."""
    latencies = []
    for _ in range(times):
        t0 = time.perf_counter()
        executor.collective_rpc("ping")
        latencies.append(time.perf_counter() - t0)
    return statistics.median(latencies) * 1000


def run_job(
    plan: Plan, *, model: str | None, prompts: list[str], max_new_tokens: int, quiet: bool
) -> dict[str, Any]:
    from hwlaunch.executor.launcher import launch

    timings: dict[str, float] = {}
    rank = this_rank(plan)  # under a launcher, every rank runs this; rank 0 reports
    progress = Progress(plan.world_size, quiet or rank != 0)
    started = time.perf_counter()
    with (
        progress.shown(),
        launch(plan, worker_extension=GenerationWorker, on_status=progress) as executor,
    ):
        timings["time_to_ready_s"] = time.perf_counter() - started
        timings["rpc_latency_ms_median"] = _ping_median_ms(executor)
        t0 = time.perf_counter()
        sums = every_rank(executor, lambda w: w.all_reduce_rank())
        timings["allreduce_s"] = time.perf_counter() - t0
        expected = plan.world_size * (plan.world_size - 1) // 2
        allreduce_ok = all(s == expected for s in sums)
        progress.all(f"ready, all-reduce {'ok' if allreduce_ok else 'WRONG'}")
        t0 = time.perf_counter()
        names = executor.collective_rpc("load_model", args=(model,))
        timings["load_model_s"] = time.perf_counter() - t0
        progress.all("model loaded")
        t0 = time.perf_counter()
        parts = every_rank(
            executor,
            lambda w, shares, k: w.generate(shares[w.rank], k),
            (split(prompts, plan.world_size), max_new_tokens),
        )
        timings["generate_s"] = time.perf_counter() - t0
        progress.all("generated")
        outputs = merge(parts, plan.world_size)
        for index, output in enumerate(outputs):
            output["rank"] = index % plan.world_size
        t0 = time.perf_counter()
        # Rank 0 checks the tokens; the other ranks of an external job do their share only.
        reference = (
            reference_outputs(executor, plan, model, prompts, max_new_tokens)
            if rank == 0 or plan.backend != "cpu"
            else None
        )
        timings["reference_s"] = time.perf_counter() - t0
        nodes = [dataclasses.asdict(n) for n in getattr(executor, "nodes", [])] or None
    timings["total_s"] = time.perf_counter() - started
    matches = reference is None or [o["token_ids"] for o in outputs] == [
        r["token_ids"] for r in reference
    ]
    return {
        "rank": rank,
        "plan": plan.to_dict(),
        "model": names[0],
        "allreduce_ok": allreduce_ok,
        "allreduce": {"expected": expected, "got": sums},
        "outputs": outputs,
        "matches_single_process": matches,
        "nodes": nodes,
        "timings": timings,
    }


def render(result: dict[str, Any]) -> str:
    lines = [f"model: {result['model']}"]
    got = result["allreduce"]["got"]
    lines.append(
        f"all-reduce of rank ids: {got} (expected {result['allreduce']['expected']} on every "
        f"rank) -> {'ok' if result['allreduce_ok'] else 'MISMATCH'}"
    )
    for output in result["outputs"]:
        shown = output["text"] if output["text"] is not None else f"token ids {output['token_ids']}"
        lines.append(f"[rank {output['rank']}] {output['prompt']!r} -> {shown}")
    lines.append(
        "tokens match a single-process run: "
        + ("yes" if result["matches_single_process"] else "NO")
    )
    for node in result.get("nodes") or []:
        lines.append(
            f"rank {node['rank']}: node {node['node_id'][:12]} ({node['node_ip']}), "
            f"local rank {node['local_rank']}, pid {node['pid']}"
        )
    t = result["timings"]
    lines.append(
        f"time to ready {t['time_to_ready_s']:.2f}s, rpc latency {t['rpc_latency_ms_median']:.2f}"
        f" ms (median of 5), all-reduce {t['allreduce_s'] * 1000:.1f} ms, model load "
        f"{t['load_model_s']:.2f}s, generate {t['generate_s']:.2f}s, total {t['total_s']:.2f}s"
    )
    return "\n".join(lines)


def check(result: dict[str, Any]) -> None:
    """Exit non-zero (through RunCheckFailed) when a check failed."""
    if not result["allreduce_ok"]:
        raise RunCheckFailed(
            f"all-reduce check failed: expected {result['allreduce']['expected']} on every rank, "
            f"got {result['allreduce']['got']}",
            result,
        )
    if not result["matches_single_process"]:
        raise RunCheckFailed(
            "generated tokens differ from the single-process reference run", result
        )


def print_err(text: str) -> None:
    print(text, file=sys.stderr)
