"""vLLM on hwlaunch's executor against vLLM's own ``mp`` executor, side by side, alternating.

    VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/vllm_executors.py --reps 3 --json vllm.json
    VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/vllm_executors.py --quick      # one rep, fewer steps

(run with the Python of an environment that has vLLM, e.g. ``.venv-vllm/bin/python``; the
file is not named ``vllm.py``: run as a script, that name would shadow the ``vllm`` package.)

Contenders, each engine in a fresh ``python`` of its own, at TP 1 and TP 2, in alternating order
(rep 1: hwlaunch first, rep 2: vLLM first, ...):

- ``hwlaunch``: ``hwlaunch.integrations.vllm.LLM(model, tensor_parallel_size=TP, ...)``: vLLM's
  workers are hwlaunch's (start method by hwlaunch's plan; the plan is reported);
- ``vllm-mp``: ``vllm.LLM(..., distributed_executor_backend="mp")``: vLLM's own executor (its
  CPU platform starts the workers with spawn); at TP 2 with ``VLLM_CPU_OMP_THREADS_BIND=0|1``,
  which it needs on one NUMA node (hwlaunch's executor binds each rank's CPUs itself).

Both run the engine core in the benchmark's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
which hwlaunch's ``LLM`` sets for itself), so the workers are the only other processes and the
executors are what differs. Same model (a random Llama, hidden 256, 2 layers: small enough
that the executor's per-step cost shows), float32, eager, greedy, 4 prompts.

Measured, per engine: ``ready_s``, the time from ``LLM(...)`` to its return (vLLM is imported
before the clock starts, in both); ``tokens_per_s``, the median over ``--steady`` later
``generate`` calls (4 prompts x ``--tokens`` new tokens, after one warm-up call); ``rpc_us``,
the median round trip of a no-op ``collective_rpc`` through the engine (``--rpcs`` calls), the
executor's per-step overhead. Reported: the medians over the reps per contender and TP, and the
ratios hwlaunch / vLLM (targets: tokens/s >= 1.0x, ready <= 0.75x). The tokens of both
contenders are compared (they must be equal).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONTENDERS = ("hwlaunch", "vllm-mp")
ENGINE = {"dtype": "float32", "max_model_len": 256, "seed": 0, "enforce_eager": True}
# The model and prompts of tests/vllm (one builder for both): a random Llama, hidden 256 (a
# head size of 64, the smallest vLLM's CPU attention takes), a word-level tokenizer, seed 0.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "vllm"))
from tiny_llama import PROMPTS, build  # noqa: E402  (tests/vllm on sys.path)


def no_op(worker: Any) -> None:
    return None


def measure(contender: str, model: str, tp: int, args: argparse.Namespace) -> dict[str, Any]:
    """One engine, in this process: ready time, steady tokens/s, no-op RPC round trip."""
    import vllm

    t0 = time.perf_counter()
    if contender == "hwlaunch":
        from hwlaunch.integrations.vllm import LLM

        llm = LLM(model, tensor_parallel_size=tp, **ENGINE)
        plan = f"{llm.plan.executor}, {llm.plan.start_method}"
    else:
        llm = vllm.LLM(model, tensor_parallel_size=tp, distributed_executor_backend="mp", **ENGINE)
        plan = f"mp, {os.environ.get('VLLM_WORKER_MULTIPROC_METHOD', 'spawn')}"
    ready = time.perf_counter() - t0
    greedy = vllm.SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    outputs = llm.generate(PROMPTS, greedy, use_tqdm=False)  # the warm-up
    rates = []
    for _ in range(args.steady):
        t0 = time.perf_counter()
        outputs = llm.generate(PROMPTS, greedy, use_tqdm=False)
        rates.append(len(PROMPTS) * args.tokens / (time.perf_counter() - t0))
    trips = []
    for _ in range(args.rpcs):
        t0 = time.perf_counter()
        llm.collective_rpc(no_op)
        trips.append(time.perf_counter() - t0)
    tokens = [list(out.outputs[0].token_ids) for out in outputs]
    llm.llm_engine.engine_core.shutdown()
    return {
        "contender": contender,
        "tp": tp,
        "plan": plan,
        "ready_s": ready,
        "tokens_per_s": statistics.median(rates),
        "rpc_us": statistics.median(trips) * 1e6,
        "tokens": tokens,
    }


def run_child(contender: str, model: str, tp: int, args: argparse.Namespace) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core here, for both
    if contender == "vllm-mp" and tp > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(rank) for rank in range(tp))
    command = [sys.executable, __file__, "--child", contender, "--model", model, "--tp", str(tp)]
    command += ["--tokens", str(args.tokens), "--steady", str(args.steady)]
    command += ["--rpcs", str(args.rpcs)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"{contender} TP={tp} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def summarize(runs: list[dict[str, Any]], tps: list[int]) -> dict[str, Any]:
    """Medians per contender and TP, and the ratios hwlaunch / vLLM's own."""
    summary: dict[str, Any] = {}
    for tp in tps:
        row: dict[str, Any] = {}
        for contender in CONTENDERS:
            mine = [r for r in runs if r["contender"] == contender and r["tp"] == tp]
            row[contender] = {
                key: statistics.median(r[key] for r in mine)
                for key in ("ready_s", "tokens_per_s", "rpc_us")
            } | {"plan": mine[0]["plan"], "reps": len(mine)}
        ours, theirs = row["hwlaunch"], row["vllm-mp"]
        row["ratio"] = {
            key: ours[key] / theirs[key] for key in ("ready_s", "tokens_per_s", "rpc_us")
        }
        row["targets_met"] = {
            "tokens_per_s >= 1.0x": row["ratio"]["tokens_per_s"] >= 1.0,
            "ready_s <= 0.75x": row["ratio"]["ready_s"] <= 0.75,
        }
        first = {r["contender"]: r["tokens"] for r in runs if r["tp"] == tp}
        row["same_tokens"] = first["hwlaunch"] == first["vllm-mp"]
        summary[f"tp{tp}"] = row
    return summary


def table(summary: dict[str, Any]) -> str:
    lines = [
        "| TP | contender | plan | ready s | tokens/s | no-op rpc us |",
        "|---|---|---|---:|---:|---:|",
    ]
    for name, row in summary.items():
        for contender in (*CONTENDERS, "ratio"):
            r = row[contender]
            plan = r.get("plan", "hwlaunch / vLLM")
            lines.append(
                f"| {name[2:]} | {contender} | {plan} | {r['ready_s']:.2f} | "
                f"{r['tokens_per_s']:.1f} | {r['rpc_us']:.0f} |"
                if contender != "ratio"
                else f"| {name[2:]} | ratio | {plan} | {r['ready_s']:.2f}x | "
                f"{r['tokens_per_s']:.2f}x | {r['rpc_us']:.2f}x |"
            )
        lines.append(f"same tokens at TP {name[2:]}: {row['same_tokens']}; {row['targets_met']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="Engines per contender and TP.")
    parser.add_argument("--quick", action="store_true", help="One rep, fewer steps and calls.")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tokens", type=int, default=32, help="New tokens per prompt.")
    parser.add_argument("--steady", type=int, default=5, help="Timed generate calls per engine.")
    parser.add_argument("--rpcs", type=int, default=200, help="Timed no-op RPCs per engine.")
    parser.add_argument("--json", metavar="FILE", help="Also write the results as JSON here.")
    parser.add_argument("--model", help="A model directory (default: the random Llama, built).")
    parser.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(measure(args.child, args.model, args.tp[0], args)))
        return
    if args.quick:
        args.reps, args.steady, args.rpcs = 1, 3, 50
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(Path(tmp) / "model")
        if not args.model:
            build(Path(model))
        runs = []
        for rep in range(args.reps):
            order = CONTENDERS if rep % 2 == 0 else CONTENDERS[::-1]
            for tp in args.tp:
                for contender in order:
                    runs.append(run_child(contender, model, tp, args))
                    r = runs[-1]
                    print(
                        f"rep {rep + 1} TP {tp} {contender:8} ({r['plan']}): ready "
                        f"{r['ready_s']:.2f} s, {r['tokens_per_s']:.1f} tok/s, rpc "
                        f"{r['rpc_us']:.0f} us",
                        file=sys.stderr,
                        flush=True,
                    )
    summary = summarize(runs, args.tp)
    print(table(summary))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
