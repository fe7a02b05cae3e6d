"""`hwlaunch run`, the main job, end to end in real subprocesses."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from plugin_sites import hwlaunch_cli, site_environ

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def hwlaunch(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return hwlaunch_cli(None, *args, cwd=cwd, timeout=280, **(env or {}))


def run_json(*args: str, cwd: Path) -> dict[str, Any]:
    proc = hwlaunch("run", "--json", "--max-new-tokens", "4", *args, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


# `hwlaunch run` in a driver that says, as it exits, which of the model's libraries it imported.
DRIVER = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('DRIVER IMPORTED', sorted("
    "m for m in ('transformers', 'accelerate') if m in sys.modules), file=sys.stderr))\n"
    "from hwlaunch.cli import main\n"
    "sys.exit(main())\n"
)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_run_each_start_method(method: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            DRIVER,
            "run",
            "--json",
            "--max-new-tokens",
            "4",
            "--start-method",
            method,
        ],
        env=site_environ(None),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    # The ranks load the model and run the single-process check (rank 0, alone): the driver
    # never pays for importing transformers.
    assert "DRIVER IMPORTED []" in proc.stderr.splitlines(), proc.stderr
    result = json.loads(proc.stdout)
    plan = result["plan"]
    assert (plan["backend"], plan["executor"], plan["start_method"]) == ("cpu", "mp", method)
    assert plan["world_size"] == 2
    size = next(d for d in plan["decisions"] if d["setting"] == "world_size")
    assert size["source"] == "hwlaunch run default"
    assert result["allreduce_ok"] is True
    assert result["allreduce"]["got"] == [1, 1]
    assert result["matches_single_process"] is True
    # By default the built-in model (4 heads) is sharded over the two ranks, which generate
    # every prompt together.
    assert result["parallelism"] == "tensor" and result["ranks_agree"] is True
    assert all(len(o["token_ids"]) == 4 and "rank" not in o for o in result["outputs"])
    assert set(result["timings"]) >= {"time_to_ready_s", "rpc_latency_ms_median", "generate_s"}


def test_run_uni_executor_and_custom_prompts(tmp_path: Path) -> None:
    result = run_json(
        "--executor",
        "uni",
        "-n",
        "1",
        "--prompt",
        "a",
        "--prompt",
        "bc",
        "--prompt",
        "def",
        cwd=tmp_path,
    )
    assert result["plan"]["executor"] == "uni"
    assert result["allreduce"]["got"] == [0]
    assert result["parallelism"] == "data"  # one worker: nothing to shard
    assert result["parallelism_note"] == "data parallel: one worker, nothing to shard"
    assert [o["prompt"] for o in result["outputs"]] == ["a", "bc", "def"]
    assert result["matches_single_process"] is True


def test_run_world_size_from_env_beats_the_run_default(tmp_path: Path) -> None:
    proc = hwlaunch(
        "run",
        "--json",
        "--max-new-tokens",
        "2",
        "--prompt",
        "x",
        cwd=tmp_path,
        env={"HWLAUNCH_WORLD_SIZE": "3"},
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["plan"]["world_size"] == 3
    assert result["allreduce"]["got"] == [3, 3, 3]
    # 4 heads do not divide by 3 workers: data parallel, and the note says why.
    assert result["parallelism"] == "data"
    assert "has 4 attention heads, which do not divide by 3 workers" in result["parallelism_note"]
    assert "note: data parallel: " in proc.stderr
    assert [r["params"] for r in result["ranks"]] == [result["params_single_process"]] * 3


def test_run_with_a_local_model_directory_and_tokenizer(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    subprocess.run([sys.executable, "-c", MAKE_MODEL, str(model_dir)], check=True, timeout=200)
    result = run_json(
        "--model", str(model_dir), "--prompt", "hello world", "--prompt", "the cat", cwd=tmp_path
    )
    assert result["model"] == str(model_dir)
    assert result["parallelism"] == "tensor"  # 2 heads over 2 ranks
    assert result["matches_single_process"] is True and result["ranks_agree"] is True
    assert all(isinstance(o["text"], str) for o in result["outputs"])


def test_run_human_output(tmp_path: Path) -> None:
    proc = hwlaunch("run", "--max-new-tokens", "2", "--prompt", "hi", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "tokens match a single-process run: yes" in proc.stdout
    assert "every rank generated the same tokens: yes" in proc.stdout
    assert "all-reduce of rank ids: [1, 1]" in proc.stdout
    assert "parallelism: tensor; whole model 115,520 parameters; rank 0 holds" in proc.stdout
    assert "tokens/s: tensor parallel " in proc.stdout
    assert "start_method" in proc.stdout  # the plan with its reasons comes first


def vllm_installed() -> bool:
    """vLLM's package, not the tests' own ``tests/vllm`` directory (a namespace package)."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


@pytest.mark.skipif(vllm_installed(), reason="vLLM is installed")
@pytest.mark.parametrize("command", [("run", "--engine", "vllm"), ("serve-vllm", "MODEL")])
def test_vllm_commands_without_vllm_name_the_install(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    proc = hwlaunch(*command, "--model", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "needs vLLM, which is not installed. Fix: pip install vllm" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_run_bad_flag_is_a_user_error(tmp_path: Path) -> None:
    proc = hwlaunch("run", "--start-method", "spwan", cwd=tmp_path)
    assert proc.returncode == 2
    assert "did you mean 'spawn'" in proc.stderr
    assert "Traceback" not in proc.stderr


MAKE_MODEL = r"""
import sys
import tokenizers, transformers, torch
out = sys.argv[1]
tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(
    {w: i for i, w in enumerate(["[UNK]", "hello", "world", "the", "cat", "sat"])}, unk_token="[UNK]"))
tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
fast.save_pretrained(out)
torch.manual_seed(1)
config = transformers.LlamaConfig(vocab_size=6, hidden_size=32, intermediate_size=64,
    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, pad_token_id=0,
    bos_token_id=0, eos_token_id=0)
transformers.LlamaForCausalLM(config).save_pretrained(out)
"""


@pytest.mark.ray
def test_run_on_ray_reports_each_rank_node_on_loopback(tmp_path: Path) -> None:
    # No RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER here: hwlaunch's own local instance must still bind
    # to 127.0.0.1, and hwlaunch must shut it down when the job ends.
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("HWLAUNCH_") and k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hwlaunch.cli",
            "run",
            "--executor",
            "ray",
            "--json",
            "--max-new-tokens",
            "2",
            "--prompt",
            "hi",
        ],
        cwd=tmp_path,
        env=base,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["plan"]["executor"] == "ray"
    assert result["allreduce_ok"] and result["matches_single_process"]
    assert [n["rank"] for n in result["nodes"]] == [0, 1]
    assert {n["node_ip"] for n in result["nodes"]} == {"127.0.0.1"}
