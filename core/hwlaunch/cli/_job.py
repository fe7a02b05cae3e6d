"""``hwlaunch run``: the main job, end to end.

Resolve a plan, start the workers with progress, check the process group with an all-reduce,
load a causal LM over the workers and generate greedily: tensor parallel (every rank holds its
shard of the weights and all ranks generate together, in lockstep) or data parallel (every rank
a whole copy, the prompts split between them). The tokens are checked against the same model
run in a single process.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hwlaunch.cli._model_check import Parallelism
from hwlaunch.cli._progress import Progress
from hwlaunch.errors import HwlaunchError
from hwlaunch.plan import Plan

WARM_UP_TOKENS = 2  # a generate this long runs first, untimed, in both runs that are compared
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
    world_size: int
    device: Any
    device_index: int

    def load_model(self, path: str | None, parallelism: str) -> dict[str, Any]:
        """Load the model in ``parallelism`` mode ("tensor": this rank's shards; "data": a whole
        copy) and say what this rank holds. A model transformers cannot shard here (no
        tensor-parallel plan, or another device than this worker's) is loaded whole, with the
        reason."""
        from hwlaunch.cli import _demo_model as demo_model
        from hwlaunch.cli import _tensor_parallel as tensor_parallel

        note = None
        if parallelism == "tensor":
            reason = tensor_parallel.cannot_load_sharded(path, self.device)
            if reason is not None:
                parallelism, note = "data", f"data parallel: {reason}"
        if parallelism == "tensor":
            self._model = tensor_parallel.load_sharded(path, self.world_size, self.device_index)
        else:
            self._model = demo_model.load(path, self.device)
        self._path, self._parallelism = path, parallelism
        held, whole = tensor_parallel.parameter_elements(self._model.model)
        device = next(self._model.model.parameters()).device
        return {
            "name": self._model.name,
            "parallelism": parallelism,
            "note": note,
            "params": held,
            "params_whole": whole,
            "device": str(device),
        }

    def generate(self, prompts: list[str], max_new_tokens: int) -> list[dict[str, Any]]:
        from hwlaunch.cli import _demo_model as demo_model

        return demo_model.generate(self._model, prompts, max_new_tokens)

    def generate_reference(
        self, prompts: list[str], max_new_tokens: int
    ) -> tuple[list[dict[str, Any]], float, int]:
        """All prompts through a whole copy of the model on this rank's device, alone (the other
        ranks wait for the call): the single-process run, with torch's threads. It runs with this
        worker's thread budget and after a warm-up, as the parallel run does, so the two tokens/s
        compare like with like."""
        import torch

        from hwlaunch.cli import _demo_model as demo_model

        whole = (
            self._model if self._parallelism == "data" else demo_model.load(self._path, self.device)
        )
        demo_model.generate(whole, prompts, WARM_UP_TOKENS)
        outputs, seconds = demo_model.timed_generate(whole, prompts, max_new_tokens)
        return outputs, seconds, torch.get_num_threads()


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


# The outputs, the seconds they took and the torch threads they ran with.
Reference = tuple[list[dict[str, Any]], float, int]


def reference_on_rank0(executor: Any, prompts: list[str], max_new_tokens: int) -> Reference:
    """All prompts through a whole copy on rank 0's device, alone. Rank 0 has the model's
    libraries imported already; the driver need not import them (transformers and torch cost
    some 5 s of CPU in a fresh process) and may have no device of the backend's."""

    def rank0_all(worker: Any, prompts: list[str], k: int) -> Any:
        return worker.generate_reference(prompts, k) if worker.rank == 0 else None

    outputs, seconds, threads = every_rank(executor, rank0_all, (prompts, max_new_tokens))[0]
    return list(outputs), float(seconds), int(threads)


def _ping_median_ms(executor: Any, times: int = 5) -> float:
    """The median round trip of a no-op collective_rpc, in milliseconds."""
    latencies = []
    for _ in range(times):
        t0 = time.perf_counter()
        executor.collective_rpc("ping")
        latencies.append(time.perf_counter() - t0)
    return statistics.median(latencies) * 1000


@dataclass
class Generated:
    """What the ranks generated: the outputs in prompt order and whether the ranks agree."""

    outputs: list[dict[str, Any]]
    ranks_agree: bool | None  # tensor parallel: every rank's tokens equal rank 0's


def generate_on(executor: Any, mode: str, prompts: list[str], max_new_tokens: int) -> Generated:
    """Tensor parallel: every rank runs ``generate`` on every prompt, in lockstep (the sharded
    layers' collectives run inside it). Data parallel: the prompts round-robin over the ranks."""
    world_size = executor.plan.world_size
    if mode == "tensor":
        per_rank = every_rank(executor, lambda w, p, k: w.generate(p, k), (prompts, max_new_tokens))
        tokens = [[o["token_ids"] for o in outputs] for outputs in per_rank]
        return Generated(list(per_rank[0]), all(t == tokens[0] for t in tokens))
    parts = every_rank(
        executor,
        lambda w, shares, k: w.generate(shares[w.rank], k),
        (split(prompts, world_size), max_new_tokens),
    )
    outputs = merge(parts, world_size)
    for index, output in enumerate(outputs):
        output["rank"] = index % world_size
    return Generated(outputs, None)


def _phase_texts(plan: Plan, mode: str, prompts: list[str], max_new_tokens: int) -> list[str]:
    loading = (
        f"loading shards (tensor parallel over {plan.world_size} ranks)"
        if mode == "tensor"
        else "loading the model in every rank"
    )
    how = plan.executor + (f", {plan.start_method}" if plan.start_method else "")
    return [
        f"starting {plan.world_size} workers ({how})",
        loading,
        f"generating {len(prompts)} prompts x {max_new_tokens} tokens",
        "single-process reference run",
    ]


def run_job(
    plan: Plan,
    *,
    model: str | None,
    parallelism: Parallelism,
    prompts: list[str],
    max_new_tokens: int,
    progress_style: str,
) -> dict[str, Any]:
    from hwlaunch.executor.launcher import launch

    timings: dict[str, float] = {}
    rank = this_rank(plan)  # under a launcher, every rank runs this; rank 0 reports
    progress = Progress(plan.world_size, progress_style)
    phases = _phase_texts(plan, parallelism.mode, prompts, max_new_tokens)
    started = time.perf_counter()
    progress.phase(phases[0])
    with (
        progress.shown(),
        launch(plan, worker_extension=GenerationWorker, on_status=progress) as executor,
    ):
        timings["time_to_ready_s"] = time.perf_counter() - started
        ran = _in_workers(executor, model, parallelism.mode, prompts, max_new_tokens, progress)
        timings.update(ran.timings)
        progress.phase(phases[3])
        reference = reference_on_rank0(executor, prompts, max_new_tokens)
        nodes = [dataclasses.asdict(n) for n in getattr(executor, "nodes", [])] or None
    timings["total_s"] = time.perf_counter() - started
    progress.phase(f"done in {timings['total_s']:.1f}s")
    expected = plan.world_size * (plan.world_size - 1) // 2
    return {
        "rank": rank,
        "engine": "transformers",
        "plan": plan.to_dict(),
        **_model_report(ran.loads, parallelism.note),
        "allreduce_ok": all(s == expected for s in ran.sums),
        "allreduce": {"expected": expected, "got": ran.sums},
        **token_report(ran.generated, reference, timings["generate_s"], ran.mode),
        "nodes": nodes,
        "timings": timings,
    }


@dataclass
class InWorkers:
    """What the workers did: all-reduce sums, what each loaded, what they generated."""

    sums: list[int]
    loads: list[dict[str, Any]]
    mode: str
    generated: Generated
    timings: dict[str, float]


def _in_workers(
    executor: Any,
    model: str | None,
    mode: str,
    prompts: list[str],
    max_new_tokens: int,
    progress: Progress,
) -> InWorkers:
    _, loading, generating, _ = _phase_texts(executor.plan, mode, prompts, max_new_tokens)
    timings = {"rpc_latency_ms_median": _ping_median_ms(executor)}
    t0 = time.perf_counter()
    sums = every_rank(executor, lambda w: w.all_reduce_rank())
    timings["allreduce_s"] = time.perf_counter() - t0
    progress.phase(loading)
    t0 = time.perf_counter()
    loads = every_rank(executor, lambda w, p, m: w.load_model(p, m), (model, mode))
    timings["load_model_s"] = time.perf_counter() - t0
    loaded_mode = loads[0]["parallelism"]
    progress.phase(generating if loaded_mode == mode else f"{generating}, data parallel")
    generate_on(executor, loaded_mode, prompts, WARM_UP_TOKENS)  # as the reference run does
    t0 = time.perf_counter()
    generated = generate_on(executor, loaded_mode, prompts, max_new_tokens)
    timings["generate_s"] = time.perf_counter() - t0
    return InWorkers(sums, loads, loaded_mode, generated, timings)


def _model_report(loads: list[dict[str, Any]], driver_note: str | None) -> dict[str, Any]:
    """The mode, why it is not tensor parallel where it is not, and what each rank holds."""
    return {
        "model": loads[0]["name"],
        "parallelism": loads[0]["parallelism"],
        "parallelism_note": loads[0]["note"] or driver_note,
        "params_single_process": loads[0]["params_whole"],
        "ranks": [
            {"rank": rank, "params": load["params"], "device": load["device"]}
            for rank, load in enumerate(loads)
        ],
    }


def token_report(
    generated: Generated,
    reference: Reference | None,
    generate_s: float,
    mode: str,
) -> dict[str, Any]:
    """The outputs, the checks of their tokens and the tokens/s of both runs."""
    new_tokens = sum(len(o["token_ids"]) for o in generated.outputs)
    matches = reference is None or [o["token_ids"] for o in generated.outputs] == [
        r["token_ids"] for r in reference[0]
    ]
    return {
        "outputs": generated.outputs,
        "ranks_agree": generated.ranks_agree,
        "matches_single_process": matches,
        "tokens_per_s": {
            f"{mode}_parallel": new_tokens / generate_s,
            "single_process": None if reference is None else new_tokens / reference[1],
        },
        "single_process_threads": None if reference is None else reference[2],
    }


def render(result: dict[str, Any]) -> str:
    lines = [f"model: {result['model']}", _render_parallelism(result)]
    if result["engine"] == "vllm":  # the plan vLLM's workers started by, made in the engine
        plan = result["plan"]
        how = ", ".join(str(plan[k]) for k in ("executor", "start_method") if plan[k])
        lines.insert(1, f"engine: vLLM on hwlaunch's workers ({how})")
    got = result["allreduce"]["got"]
    lines.append(
        f"all-reduce of rank ids: {got} (expected {result['allreduce']['expected']} on every "
        f"rank) -> {'ok' if result['allreduce_ok'] else 'MISMATCH'}"
    )
    for output in result["outputs"]:
        shown = output["text"] if output["text"] is not None else f"token ids {output['token_ids']}"
        who = f"rank {output['rank']}" if "rank" in output else "all ranks"
        lines.append(f"[{who}] {output['prompt']!r} -> {shown}")
    if result["ranks_agree"] is not None:
        agree = "yes" if result["ranks_agree"] else "NO"
        lines.append(f"every rank generated the same tokens: {agree}")
    lines.append(
        "tokens match a single-process run: "
        + ("yes" if result["matches_single_process"] else "NO")
    )
    for node in result.get("nodes") or []:
        lines.append(
            f"rank {node['rank']}: node {node['node_id'][:12]} ({node['node_ip']}), "
            f"local rank {node['local_rank']}, pid {node['pid']}"
        )
    lines.append(
        "tokens/s: "
        + ", ".join(
            f"{name.replace('_', ' ')} {rate:.1f}"
            for name, rate in result["tokens_per_s"].items()
            if rate is not None
        )
    )
    t = result["timings"]
    load = "" if t["load_model_s"] is None else f"model load {t['load_model_s']:.2f}s, "
    lines.append(
        f"time to ready {t['time_to_ready_s']:.2f}s, rpc latency {t['rpc_latency_ms_median']:.2f}"
        f" ms (median of 5), all-reduce {t['allreduce_s'] * 1000:.1f} ms, {load}"
        f"generate {t['generate_s']:.2f}s, total {t['total_s']:.2f}s"
    )
    return "\n".join(lines)


def _render_parallelism(result: dict[str, Any]) -> str:
    whole = result["params_single_process"]
    held = ", ".join(
        f"rank {r['rank']} holds {r['params']:,} ({r['params'] / whole:.0%}) on {r['device']}"
        for r in result["ranks"]
    )
    note = f" ({result['parallelism_note']})" if result["parallelism_note"] else ""
    return f"parallelism: {result['parallelism']}{note}; whole model {whole:,} parameters; {held}"


def check(result: dict[str, Any]) -> None:
    """Exit non-zero (through RunCheckFailed) when a check failed."""
    if not result["allreduce_ok"]:
        raise RunCheckFailed(
            f"all-reduce check failed: expected {result['allreduce']['expected']} on every rank, "
            f"got {result['allreduce']['got']}",
            result,
        )
    if result["ranks_agree"] is False:
        raise RunCheckFailed("the tensor-parallel ranks generated different tokens", result)
    if not result["matches_single_process"]:
        raise RunCheckFailed(
            "generated tokens differ from the single-process reference run", result
        )


def print_err(text: str) -> None:
    print(text, file=sys.stderr)
