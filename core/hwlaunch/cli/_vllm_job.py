"""``hwlaunch run --engine vllm``: the main job through vLLM, its workers on hwlaunch's executor.

Why a job of its own beside ``_job``: vLLM owns the workers' loop (its engine calls its own
worker class through ``HwlaunchExecutor``), so the job reaches the workers through vLLM's
``LLM.collective_rpc`` instead of hwlaunch's worker extension. The checks and the JSON are the
default engine's: the all-reduce of rank ids over vLLM's process group, what each rank holds,
greedy tokens against the same model run whole in a single process (transformers, on rank 0,
at that worker's thread budget, after a warm-up, as the parallel run), tokens/s of both.

The engine runs in float32, eager (no torch.compile): the job checks that the tokens are the
single process's, and a compile would cost a minute of CPU per start. The hwlaunch settings
given as flags reach the executor's own plan as the ``HWLAUNCH_*`` variables they stand for,
while the engine is built (the executor resolves its plan in this process).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from hwlaunch.cli._job import WARM_UP_TOKENS, Generated, token_report
from hwlaunch.cli._progress import Progress
from hwlaunch.plan import Plan
from hwlaunch.planning.settings import ENV_CONFIG, SETTINGS

ENGINE_SETTINGS = {"dtype": "float32", "enforce_eager": True, "seed": 0}


def run_vllm_job(
    plan: Plan,
    *,
    model: str,
    flags: Mapping[str, str | None],
    config_file: str | None,
    prompts: list[str],
    max_new_tokens: int,
    progress_style: str,
) -> dict[str, Any]:
    """Start vLLM at TP = the plan's world size on hwlaunch's executor, check it, generate."""
    from vllm import SamplingParams

    from hwlaunch.integrations.vllm import LLM

    progress = Progress(plan.world_size, progress_style)
    timings: dict[str, float | None] = {}
    started = time.perf_counter()
    progress.phase(f"starting vLLM on {plan.world_size} hwlaunch workers (loading {model})")
    with progress.shown():
        with _settings_as_environment(flags, config_file):
            llm = LLM(model, tensor_parallel_size=plan.world_size, **ENGINE_SETTINGS)
        try:
            timings["time_to_ready_s"] = time.perf_counter() - started
            timings["load_model_s"] = None  # inside the start: vLLM loads as it starts
            timings["rpc_latency_ms_median"] = _ping_median_ms(llm)
            t0 = time.perf_counter()
            sums = [int(s) for s in llm.collective_rpc(all_reduce_rank)]
            timings["allreduce_s"] = time.perf_counter() - t0
            loads = list(llm.collective_rpc(held_parameters))
            progress.phase(f"generating {len(prompts)} prompts x {max_new_tokens} tokens")
            for count in (WARM_UP_TOKENS, max_new_tokens):  # a warm-up, then the timed run
                greedy = SamplingParams(temperature=0.0, max_tokens=count, ignore_eos=True)
                t0 = time.perf_counter()
                outputs = llm.generate(prompts, greedy, use_tqdm=False)
            timings["generate_s"] = time.perf_counter() - t0
            progress.phase("single-process reference run")
            ids = [list(out.prompt_token_ids) for out in outputs]
            reference = _reference(llm, model, ids, max_new_tokens)
        finally:
            llm.llm_engine.engine_core.shutdown()
    timings["total_s"] = time.perf_counter() - started
    progress.phase(f"done in {timings['total_s']:.1f}s")
    return _report(llm.plan, model, sums, loads, _generated(prompts, outputs), reference, timings)


def _settings_as_environment(
    flags: Mapping[str, str | None], config_file: str | None
) -> AbstractContextManager[None]:
    """Each flag given as its ``HWLAUNCH_*`` variable (the world size is vLLM's TP, passed
    as such), ``--config`` as ``HWLAUNCH_CONFIG``; the environment as it was afterwards."""
    from hwlaunch.integrations.vllm._environ import environment

    given = {s.env_var: str(flags[s.name]) for s in SETTINGS if flags.get(s.name) is not None}
    given.pop("HWLAUNCH_WORLD_SIZE", None)
    if config_file is not None:
        given[ENV_CONFIG] = config_file
    return environment(given)


def _ping_median_ms(llm: Any, times: int = 5) -> float:
    """The median round trip of a no-op ``collective_rpc`` through vLLM, in milliseconds."""
    latencies = []
    for _ in range(times):
        t0 = time.perf_counter()
        llm.collective_rpc(no_op)
        latencies.append(time.perf_counter() - t0)
    return statistics.median(latencies) * 1000


# The functions below run in vLLM's workers (sent by value), given vLLM's worker.


def no_op(worker: Any) -> None:
    return None


def all_reduce_rank(worker: Any) -> int:
    """The sum of the ranks over vLLM's world group (its CPU process group: the world group
    has no device communicator, its tensor-parallel groups do): n(n-1)/2 on every rank."""
    import torch
    import torch.distributed as dist
    from vllm.distributed import get_world_group

    group = get_world_group()
    total = torch.tensor([group.rank], dtype=torch.int64)
    dist.all_reduce(total, group=group.cpu_group)
    return int(total.item())


def held_parameters(worker: Any) -> dict[str, Any]:
    """The parameter elements this rank holds, and where. vLLM's CPU backend packs a linear
    layer's weight into its own format and leaves the parameter empty: that layer counts its
    shard's size (input x output elements per partition)."""
    model = worker.model_runner.get_model()
    held = 0
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            count = parameter.numel()
            if count == 0 and name == "weight" and hasattr(module, "input_size_per_partition"):
                count = module.input_size_per_partition * module.output_size_per_partition
            held += count
    device = next(model.parameters()).device
    return {"params": held, "device": str(device)}


def reference_on_rank0(
    worker: Any, path: str, prompt_ids: list[list[int]], max_new_tokens: int
) -> dict[str, Any] | None:
    """The prompts' tokens from the model whole in transformers, on rank 0 alone, with the
    thread budget of this worker, after a warm-up: the single-process run (its outputs,
    seconds, threads and parameter elements)."""
    if worker.rank != 0:
        return None
    import torch
    import transformers

    device = next(worker.model_runner.get_model().parameters()).device
    whole = transformers.AutoModelForCausalLM.from_pretrained(
        path, local_files_only=True, dtype=torch.float32
    ).to(device)
    whole.eval()

    def generate(count: int) -> list[dict[str, Any]]:
        outputs = []
        with torch.inference_mode():
            for ids in prompt_ids:
                given = torch.tensor([ids], dtype=torch.long, device=device)
                out = whole.generate(
                    input_ids=given,
                    attention_mask=torch.ones_like(given),
                    max_new_tokens=count,
                    min_new_tokens=count,
                    do_sample=False,
                    pad_token_id=whole.config.eos_token_id,
                )
                outputs.append({"token_ids": [int(t) for t in out[0, len(ids) :].tolist()]})
        return outputs

    generate(WARM_UP_TOKENS)
    t0 = time.perf_counter()
    outputs = generate(max_new_tokens)
    seconds = time.perf_counter() - t0
    params = sum(p.numel() for p in whole.parameters())
    return {
        "outputs": outputs,
        "seconds": seconds,
        "threads": torch.get_num_threads(),
        "params": params,
    }


def _reference(llm: Any, path: str, ids: list[list[int]], max_new_tokens: int) -> dict[str, Any]:
    reply: dict[str, Any] = llm.collective_rpc(
        reference_on_rank0, args=(path, ids, max_new_tokens)
    )[0]
    return reply


def _generated(prompts: list[str], outputs: list[Any]) -> Generated:
    """vLLM returns one output per prompt (its driver rank's): no per-rank comparison."""
    return Generated(
        [
            {
                "prompt": prompt,
                "token_ids": list(out.outputs[0].token_ids),
                "text": out.outputs[0].text,
            }
            for prompt, out in zip(prompts, outputs, strict=True)
        ],
        None,
    )


def _report(
    plan: Plan,
    model: str,
    sums: list[int],
    loads: list[dict[str, Any]],
    generated: Generated,
    reference: dict[str, Any],
    timings: dict[str, float | None],
) -> dict[str, Any]:
    expected = plan.world_size * (plan.world_size - 1) // 2
    generate_s = timings["generate_s"]
    assert generate_s is not None
    return {
        "rank": 0,
        "engine": "vllm",
        "plan": plan.to_dict(),
        "model": model,
        "parallelism": "tensor",
        "parallelism_note": None,
        "params_single_process": reference["params"],
        "ranks": [
            {"rank": rank, "params": load["params"], "device": load["device"]}
            for rank, load in enumerate(loads)
        ],
        "allreduce_ok": all(s == expected for s in sums),
        "allreduce": {"expected": expected, "got": sums},
        **token_report(
            generated,
            (reference["outputs"], reference["seconds"], reference["threads"]),
            generate_s,
            "tensor",
        ),
        "nodes": None,
        "timings": timings,
    }
