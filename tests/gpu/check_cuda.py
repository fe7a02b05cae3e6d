"""CUDA check, for a machine with an NVIDIA GPU: ``python tests/gpu/check_cuda.py [-n N]``.

With CUDA initialized in this (the parent) process, it shows that

1. ``resolve()`` on cuda falls back from fork to forkserver (the rule's fallback), and says why
   in a warning;
2. the workers use the GPU: each reports ``torch.cuda.current_device()`` and a tensor's device;
3. ``all_reduce_rank`` over nccl equals N*(N-1)/2;
4. an explicit ``start_method="fork"`` gets hwlaunch's StartMethodError from ``resolve()`` and
   from ``launch()``, before any process starts, instead of the workers failing with CUDA's
   "Cannot re-initialize CUDA in forked subprocess";
5. with two GPUs or more, ``hwlaunch run --backend cuda -n 2 --parallel tensor`` (a fresh
   process) shards the built-in model over two GPUs with NCCL: each rank holds at most 0.75 of the
   parameters on its GPU, every rank generates the same tokens, and they equal a whole copy's
   on rank 0's GPU.

It prints one JSON object (``ok``, ``checks``, ``workers``, ...) and exits 0 when every check
passes, 1 when one fails, 2 when there is no NVIDIA GPU or no CUDA build of torch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any


class GpuProbe:
    """Worker extension: what a worker sees of its GPU."""

    rank: int
    local_rank: int
    device: Any

    def report(self) -> dict[str, Any]:
        import torch

        tensor = torch.ones(4, device=self.device) * self.rank
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "current_device": torch.cuda.current_device(),
            "tensor_device": str(tensor.device),
            "tensor_sum": float(tensor.sum().item()),
            "device_name": torch.cuda.get_device_name(),
        }


def refused(attempt: Callable[[], Any], error: type[Exception]) -> str | None:
    """The text of ``error`` if ``attempt()`` raises it; None if it goes through."""
    try:
        outcome = attempt()
    except error as exc:
        return f"{type(exc).__name__}: {exc}"
    if hasattr(outcome, "shutdown"):
        outcome.shutdown()
    return None


def run(world_size: int) -> dict[str, Any]:
    import torch

    import hwlaunch
    from hwlaunch import StartMethodError

    checks: dict[str, bool] = {}
    result: dict[str, Any] = {"world_size": world_size, "checks": checks}

    # CUDA initialized in the parent: from here on a forked child could not use it.
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    checks["parent_cuda_initialized"] = torch.cuda.is_initialized()

    plan = hwlaunch.resolve(backend="cuda", world_size=world_size, executor="mp")
    decision = plan.decision("start_method")
    result["plan"] = {
        "start_method": plan.start_method,
        "source": decision.source,
        "reason": decision.reason,
        "warnings": list(plan.warnings),
        "dist_backend": plan.dist_backend,
    }
    checks["falls_back_to_forkserver"] = plan.start_method == "forkserver"
    checks["fallback_is_explained"] = "cuda.initialized" in decision.source and any(
        "instead of fork" in w for w in plan.warnings
    )

    start = time.monotonic()
    with hwlaunch.launch(plan, worker_extension=GpuProbe) as executor:
        result["seconds_to_ready"] = round(time.monotonic() - start, 2)
        workers = executor.collective_rpc("report", timeout=120)
        result["workers"] = workers
        checks["workers_use_their_gpu"] = all(
            w["rank"] == r
            and w["pid"] != os.getpid()
            and w["current_device"] == r
            and w["tensor_device"] == f"cuda:{r}"
            and w["tensor_sum"] == 4.0 * r
            for r, w in enumerate(workers)
        )
        sums = executor.collective_rpc("all_reduce_rank", timeout=120)
        result["all_reduce_rank"] = sums
        checks["nccl_all_reduce"] = sums == [world_size * (world_size - 1) // 2] * world_size

    fork = dict(backend="cuda", world_size=world_size, executor="mp", start_method="fork")
    for name, attempt in (("resolve", hwlaunch.resolve), ("launch", hwlaunch.launch)):
        error = refused(lambda attempt=attempt: attempt(**fork), StartMethodError)
        result[f"fork_{name}_error"] = error
        checks[f"fork_after_init_refused_by_{name}"] = error is not None
    return result


def run_tensor_parallel(world_size: int) -> dict[str, Any]:
    """``hwlaunch run`` sharding the built-in model over ``world_size`` GPUs, in a fresh
    process (CUDA not initialized there, so the workers fork)."""
    command = [sys.executable, "-m", "hwlaunch.cli", "run", "--backend", "cuda", "--json"]
    command += ["-n", str(world_size), "--parallel", "tensor", "--max-new-tokens", "8"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return {"ok": False, "exit_code": proc.returncode, "stderr": proc.stderr[-4000:]}
    job = json.loads(proc.stdout)
    whole = job["params_single_process"]
    return {
        "ok": job["parallelism"] == "tensor"
        and all(
            r["params"] <= 0.75 * whole and r["device"].startswith("cuda") for r in job["ranks"]
        )
        and job["ranks_agree"] is True
        and job["matches_single_process"] is True,
        "ranks": job["ranks"],
        "params_single_process": whole,
        "tokens_per_s": job["tokens_per_s"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--world-size", type=int, default=None, help="default: min(2, GPUs)")
    args = parser.parse_args()

    from hwlaunch.probes import nvml_device_count

    gpus = nvml_device_count()
    if gpus == 0:
        print(json.dumps({"ok": False, "error": "no NVIDIA GPU found through NVML"}))
        return 2
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"ok": False, "error": f"torch {torch.__version__} has no CUDA"}))
        return 2
    world_size = args.world_size or min(2, gpus)
    try:
        result = run(world_size)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"ok": False, "error": error, "traceback": traceback.format_exc()}))
        return 1
    if world_size >= 2:
        result["tensor_parallel"] = run_tensor_parallel(2)  # the built-in model has 4 heads
        result["checks"]["tensor_parallel_run"] = result["tensor_parallel"]["ok"]
    result["ok"] = all(result["checks"].values())
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
