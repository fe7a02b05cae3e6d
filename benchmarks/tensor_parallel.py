"""Tokens/s of ``hwlaunch run``: tensor parallel against one process and against data parallel.

    python benchmarks/tensor_parallel.py [--workers 2] [--max-new-tokens 32]

Two models, side by side in one run: the built-in tiny Llama (2 layers, hidden size 64) and a
larger Llama built from a config (8 layers, hidden size 512, 8 heads, random weights saved to a
temporary directory). For each, ``hwlaunch run --json`` runs twice in fresh processes:
``--parallel tensor`` (every worker holds its shard; all generate every prompt together) and
``--parallel data`` (a whole copy in each worker; the prompts split between them). Each run also
times the same prompts through a whole model in the driver, alone: the single-process figure
(the median of the two runs is shown). Tokens/s counts new tokens over ``generate`` alone,
loading excluded. The CPU thread budget each worker ran with is read from the plan.

Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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


def thread_budget(result: dict[str, Any]) -> str:
    """The plan's CPU threads per worker, where the plan has that setting."""
    for decision in result["plan"]["decisions"]:
        if decision["setting"] == "cpu_threads":
            return f"{decision['value']} ({decision['source']})"
    return "torch's default"


def row(name: str, tensor: dict[str, Any], data: dict[str, Any]) -> str:
    single = statistics.median(
        [tensor["tokens_per_s"]["single_process"], data["tokens_per_s"]["single_process"]]
    )
    tp = tensor["tokens_per_s"]["tensor_parallel"]
    dp = data["tokens_per_s"]["data_parallel"]
    whole = tensor["params_single_process"]
    held = max(r["params"] for r in tensor["ranks"]) / whole
    return (
        f"| {name} | {whole / 1e6:.2f} M | {held:.0%} | {single:.1f} | {tp:.1f} ({tp / single:.2f}x)"
        f" | {dp:.1f} ({dp / single:.2f}x) | {thread_budget(tensor)} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    print(
        f"{os.cpu_count()} CPUs, {args.workers} workers, 4 prompts x {args.max_new_tokens} tokens"
    )
    print()
    print(
        "| model | parameters | held per TP rank | single process tok/s "
        f"| tensor parallel x{args.workers} tok/s | data parallel x{args.workers} tok/s "
        "| threads per worker |"
    )
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        larger = Path(tmp) / "llama-512x8"
        build_larger(larger)
        for name, model in (("built-in (64 x 2 layers)", None), ("512 x 8 layers", str(larger))):
            runs = [
                hwlaunch_run(model, m, args.workers, args.max_new_tokens)
                for m in ("tensor", "data")
            ]
            print(row(name, *runs), flush=True)


if __name__ == "__main__":
    main()
