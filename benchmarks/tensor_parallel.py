"""Tokens/s of ``hwlaunch run``: tensor parallel against one process and against data parallel.

    python benchmarks/tensor_parallel.py [--workers 2] [--max-new-tokens 32]

Two models, side by side in one run: the built-in tiny Llama (2 layers, hidden size 64) and a
larger Llama built from a config (8 layers, hidden size 512, 8 heads, random weights saved to a
temporary directory). For each, in fresh processes:

- ``hwlaunch run --json --parallel tensor``: every worker holds its shard, all generate every
  prompt together; ``--parallel data``: a whole copy in each worker, the prompts split between
  them. The workers run with the plan's CPU thread budget (read from the plan and shown).
- one process alone with the whole model, at 1 thread and at every CPU's thread (the same
  ``generate`` calls as ``hwlaunch run``'s single-process check, in a process of its own).

Tokens/s counts new tokens over the first ``generate`` of the prompts, loading excluded, as
``hwlaunch run`` reports them. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

LARGER = {
    "vocab_size": 260,
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "max_position_embeddings": 512,
    "bos_token_id": 256,
    "eos_token_id": 257,
    "pad_token_id": 258,
    "tie_word_embeddings": False,
}


def build_larger(directory: Path) -> None:
    """The larger model, random weights from seed 0, saved where ``--model`` can load it."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**LARGER)).save_pretrained(directory)


def hwlaunch_run(model: str | None, mode: str, workers: int, tokens: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "hwlaunch.cli", "run", "--json", "--parallel", mode]
    command += ["-n", str(workers), "--max-new-tokens", str(tokens)]
    command += ["--model", model] if model else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


SINGLE = """
import sys, torch
from hwlaunch.cli import _demo_model as demo_model
from hwlaunch.cli._job import DEFAULT_PROMPTS
torch.set_num_threads(int(sys.argv[1]))
loaded = demo_model.load(sys.argv[3] if len(sys.argv) > 3 else None)
outputs, seconds = demo_model.timed_generate(loaded, list(DEFAULT_PROMPTS), int(sys.argv[2]))
print(sum(len(o["token_ids"]) for o in outputs) / seconds)
"""


def single_process(model: str | None, threads: int, tokens: int) -> float:
    """Tokens/s of the whole model alone in a fresh process with ``threads`` threads."""
    command = [sys.executable, "-c", SINGLE, str(threads), str(tokens), *([model] if model else [])]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"single process failed:\n{proc.stderr[-3000:]}")
    return float(proc.stdout.split()[-1])


def thread_budget(result: dict[str, Any]) -> str:
    """The plan's CPU threads per worker, where the plan has that setting."""
    for decision in result["plan"]["decisions"]:
        if decision["setting"] == "cpu_threads":
            return f"{decision['value']} ({decision['source']})"
    return "torch's default"


def row(name: str, tensor: dict[str, Any], data: dict[str, Any], alone: list[float]) -> str:
    one, every = alone
    tp = tensor["tokens_per_s"]["tensor_parallel"]
    dp = data["tokens_per_s"]["data_parallel"]
    whole = tensor["params_single_process"]
    held = max(r["params"] for r in tensor["ranks"]) / whole
    return (
        f"| {name} | {whole / 1e6:.2f} M | {held:.0%} | {one:.1f} | {every:.1f} "
        f"| {tp:.1f} ({tp / one:.2f}x) | {dp:.1f} ({dp / one:.2f}x) | {thread_budget(tensor)} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    cpus = os.cpu_count() or 1
    print(f"{cpus} CPUs, {args.workers} workers, 4 prompts x {args.max_new_tokens} tokens")
    print()
    print(
        "| model | parameters | held per TP rank | one process, 1 thread, tok/s "
        f"| one process, {cpus} threads | tensor parallel x{args.workers} (ratio to 1 thread) "
        f"| data parallel x{args.workers} | threads per worker |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        larger = Path(tmp) / "llama-512x8"
        build_larger(larger)
        for name, model in (("built-in (64 x 2 layers)", None), ("512 x 8 layers", str(larger))):
            runs = [
                hwlaunch_run(model, m, args.workers, args.max_new_tokens)
                for m in ("tensor", "data")
            ]
            alone = [single_process(model, n, args.max_new_tokens) for n in (1, cpus)]
            print(row(name, *runs, alone), flush=True)


if __name__ == "__main__":
    main()
