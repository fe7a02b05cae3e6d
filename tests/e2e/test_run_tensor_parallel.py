"""`hwlaunch run` shards the model over its workers: transformers' tensor parallelism over gloo.

Real worker processes, a real process group and transformers' own tensor-parallel plan; the
torchrun run is in test_external.py, the two-node Ray run in test_executor_ray.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_run import hwlaunch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def builtin_parameters() -> int:
    """The built-in model's parameter elements, from its config (vocabulary 260, hidden 64,
    MLP 128, 2 layers of 4 heads, separate lm_head), counted by hand."""
    vocab, hidden, mlp, layers = 260, 64, 128, 2
    per_layer = 4 * hidden * hidden + 3 * hidden * mlp + 2 * hidden  # q k v o, gate up down, norms
    return 2 * vocab * hidden + layers * per_layer + hidden  # embeddings, lm_head, final norm


def run_piped(*args: str, cwd: Path) -> tuple[dict[str, Any], str]:
    proc = hwlaunch("run", "--json", "--max-new-tokens", "4", *args, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result, proc.stderr


@pytest.fixture(scope="module")
def tensor_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    return run_piped(cwd=tmp_path_factory.mktemp("tp"))


def test_each_rank_holds_its_shard(tensor_run: tuple[dict[str, Any], str]) -> None:
    result, _ = tensor_run
    assert result["parallelism"] == "tensor" and result["parallelism_note"] is None
    whole = result["params_single_process"]
    assert whole == builtin_parameters()
    assert [(r["rank"], r["device"]) for r in result["ranks"]] == [(0, "cpu"), (1, "cpu")]
    held = [r["params"] for r in result["ranks"]]
    assert all(h <= 0.75 * whole for h in held), held
    assert sum(held) >= whole  # every element is somewhere (norms are held whole by both)


def test_ranks_generate_the_tokens_of_one_process(tensor_run: tuple[dict[str, Any], str]) -> None:
    result, _ = tensor_run
    assert result["ranks_agree"] is True and result["matches_single_process"] is True
    assert result["outputs"][0]["prompt"] == "The quick brown fox"
    assert result["outputs"][0]["token_ids"] == [176, 236, 163, 115]  # as docs/cli.md shows
    rates = result["tokens_per_s"]
    assert set(rates) == {"tensor_parallel", "single_process"}
    assert all(rate > 0 for rate in rates.values())


def test_the_single_process_run_has_a_workers_thread_budget(
    tensor_run: tuple[dict[str, Any], str],
) -> None:
    result, _ = tensor_run
    assert result["single_process_threads"] == result["plan"]["cpu_threads"]


def test_a_pipe_sees_one_line_per_phase(tensor_run: tuple[dict[str, Any], str]) -> None:
    _, stderr = tensor_run
    phases = [line for line in stderr.splitlines() if line.startswith("hwlaunch run [")]
    expected = ["starting 2 workers (mp, ", "loading shards (tensor parallel over 2 ranks)"]
    expected += ["generating 4 prompts x 4 tokens", "single-process reference run", "done in "]
    assert len(phases) == len(expected), stderr
    for line, text in zip(phases, expected, strict=True):
        assert text in line.split("] ", 1)[1], line


def test_parallel_data_gives_every_rank_a_whole_copy(
    tensor_run: tuple[dict[str, Any], str], tmp_path: Path
) -> None:
    result, _ = run_piped("--parallel", "data", cwd=tmp_path)
    assert result["parallelism"] == "data"
    whole = result["params_single_process"]
    assert [r["params"] for r in result["ranks"]] == [whole, whole]
    assert [o["rank"] for o in result["outputs"]] == [0, 1, 0, 1]
    assert result["ranks_agree"] is None and result["matches_single_process"] is True
    assert set(result["tokens_per_s"]) == {"data_parallel", "single_process"}
    tensor_tokens = [o["token_ids"] for o in tensor_run[0]["outputs"]]
    assert [o["token_ids"] for o in result["outputs"]] == tensor_tokens


def test_a_model_without_a_tensor_parallel_plan_runs_data_parallel(tmp_path: Path) -> None:
    model_dir = tmp_path / "opt"
    subprocess.run([sys.executable, "-c", MAKE_OPT, str(model_dir)], check=True, timeout=200)
    result, _ = run_piped("--model", str(model_dir), "--prompt", "ab", cwd=tmp_path)
    assert result["parallelism"] == "data"
    assert result["parallelism_note"] == (
        f"data parallel: transformers has no tensor-parallel plan for {model_dir}"
    )
    assert result["matches_single_process"] is True
    assert [len(o["token_ids"]) for o in result["outputs"]] == [4]  # bytes in, 4 tokens out
    assert [r["params"] for r in result["ranks"]] == [result["params_single_process"]] * 2


MAKE_OPT = r"""
import sys, torch, transformers
torch.manual_seed(2)
config = transformers.OPTConfig(vocab_size=300, max_position_embeddings=64, hidden_size=32,
    ffn_dim=64, num_hidden_layers=1, num_attention_heads=2, word_embed_proj_dim=32,
    bos_token_id=0, eos_token_id=1, pad_token_id=2)
transformers.OPTForCausalLM(config).save_pretrained(sys.argv[1])
"""


def test_parallel_tensor_that_cannot_shard_is_a_user_error(tmp_path: Path) -> None:
    proc = hwlaunch("run", "-n", "3", "--parallel", "tensor", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "hwlaunch: error: --parallel tensor: built-in tiny llama (seed 0) has 4 attention heads, "
        "which do not divide by 3 workers. Fix: use a world size that divides them (2, 4), or "
        "--parallel data"
    ]


def _missing(tmp: Path) -> Path:
    return tmp / "absent"


def _no_config(tmp: Path) -> Path:
    (tmp / "weights").mkdir()
    (tmp / "weights" / "model.safetensors").write_bytes(b"")
    return tmp / "weights"


def _unknown_type(tmp: Path) -> Path:
    (tmp / "odd").mkdir()
    (tmp / "odd" / "config.json").write_text('{"model_type": "no-such-architecture"}')
    return tmp / "odd"


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (_missing, "no such directory"),
        (_no_config, "config.json is missing"),
        (_unknown_type, "model_type 'no-such-architecture'"),
    ],
)
def test_bad_model_exits_2_before_any_worker_starts(make: Any, says: str, tmp_path: Path) -> None:
    path = make(tmp_path)
    proc = hwlaunch("run", "--model", str(path), cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hwlaunch: error: --model {path}: "), lines
    assert says in lines[0] and "Fix: " in lines[0]
    as_json = hwlaunch("run", "--json", "--model", str(path), cwd=tmp_path)
    assert as_json.returncode == 2
    assert "starting" not in as_json.stderr  # no phase began: no worker was started
    error = json.loads(as_json.stdout)["error"]
    assert (error["type"], error["exit_code"]) == ("ConfigError", 2)
    assert error["message"] == lines[0].removeprefix("hwlaunch: error: ")


def test_key_value_heads_that_do_not_divide_mean_data_parallel() -> None:
    from hwlaunch.cli._model_check import ModelFacts, choose_parallelism
    from hwlaunch.errors import ConfigError

    grouped = ModelFacts("m", "llama", attention_heads=8, key_value_heads=1)
    chosen = choose_parallelism(None, grouped, 2)
    assert (chosen.mode, chosen.note) == (
        "data",
        "data parallel: m has 1 key/value heads, which do not divide by 2 workers",
    )
    with pytest.raises(ConfigError, match=r"Fix: its heads cannot be split, or --parallel data"):
        choose_parallelism("tensor", grouped, 2)
    assert choose_parallelism(None, ModelFacts("m", "llama", 8, 2), 2).mode == "tensor"
    assert choose_parallelism("data", ModelFacts("m", "llama", 8, 2), 2).mode == "data"


@pytest.mark.parametrize(
    ("absent", "flags", "says"),
    [
        (
            "accelerate",
            (),
            "needs accelerate, which is not installed. Fix: pip install "
            "'hwlaunch[run]', or --parallel data",
        ),
        (
            "transformers",
            ("--parallel", "data"),
            "needs transformers, which is not installed. Fix: pip install 'hwlaunch[run]'",
        ),
    ],
)
def test_a_missing_package_is_named_before_any_worker_starts(
    absent: str, flags: tuple[str, ...], says: str, tmp_path: Path
) -> None:
    # sys.modules[name] = None: importlib finds no such package, as where it is not installed.
    main = f"import sys; sys.modules[{absent!r}] = None; from hwlaunch.cli import main; sys.exit(main())"
    proc = subprocess.run(
        [sys.executable, "-c", main, "run", *flags],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"hwlaunch: error: hwlaunch run {says}"]
