"""``hwlaunch run --engine vllm``: the main job through vLLM, its workers on hwlaunch's executor.

The same checks and JSON as the default engine: the all-reduce of rank ids over vLLM's group,
each rank's shard, greedy tokens equal to the model run whole in one process (transformers, at
a worker's thread budget), tokens/s of both. One engine per run (a run is a program of its
own: ``hwlaunch run``), so two runs here: the JSON one, and a text one whose ``--start-method``
must reach the executor's plan.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from vllm_scripts import script_env

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

HWLAUNCH = str(Path(sys.executable).with_name("hwlaunch"))  # the console script, as users run it


def hwlaunch(
    *args: str, cwd: Path, timeout: float = 500, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HWLAUNCH, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=script_env(**env),
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def json_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    proc = hwlaunch(
        "run",
        "--engine",
        "vllm",
        "--model",
        str(tiny_model),
        "--json",
        "--max-new-tokens",
        "8",
        cwd=tmp_path_factory.mktemp("run"),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    result: dict[str, Any] = json.loads(
        proc.stdout
    )  # stdout is the report alone: vLLM logs on stderr
    return result


def test_the_job_runs_on_vllm_over_hwlaunchs_workers(json_run: dict[str, Any]) -> None:
    assert json_run["engine"] == "vllm" and json_run["parallelism"] == "tensor"
    plan = json_run["plan"]
    assert plan["world_size"] == 2 and plan["executor"] == "mp"
    assert json_run["allreduce_ok"] is True and json_run["allreduce"]["got"] == [1, 1]


def test_each_rank_holds_its_shard(json_run: dict[str, Any]) -> None:
    whole = json_run["params_single_process"]
    held = [r["params"] for r in json_run["ranks"]]
    assert [r["device"] for r in json_run["ranks"]] == ["cpu", "cpu"]
    assert all(h <= 0.75 * whole for h in held), (held, whole)


def test_tokens_match_one_process_and_rates_compare_like_with_like(
    json_run: dict[str, Any],
) -> None:
    assert json_run["matches_single_process"] is True
    outputs = json_run["outputs"]
    assert outputs[0]["prompt"] == "The quick brown fox"
    assert all(len(o["token_ids"]) == 8 for o in outputs)
    rates = json_run["tokens_per_s"]
    assert set(rates) == {"tensor_parallel", "single_process"} and min(rates.values()) > 0
    assert json_run["single_process_threads"] == json_run["plan"]["cpu_threads"]
    timings = json_run["timings"]
    assert timings["time_to_ready_s"] > 0 and timings["rpc_latency_ms_median"] > 0


def test_a_start_method_flag_reaches_the_executors_plan(tiny_model: Path, tmp_path: Path) -> None:
    proc = hwlaunch(
        "run",
        "--engine",
        "vllm",
        "--model",
        str(tiny_model),
        "--start-method",
        "spawn",
        "--max-new-tokens",
        "4",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "engine: vLLM on hwlaunch's workers (mp, spawn" in proc.stdout, proc.stdout
    assert "tokens match a single-process run: yes" in proc.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "--engine vllm needs --model PATH"),
        (("--model", "MODEL", "--parallel", "data"), "--engine vllm --parallel data"),
        (("--model", "MODEL", "-n", "3"), "which do not divide by 3 workers"),
    ],
)
def test_bad_settings_are_user_errors(
    args: tuple[str, ...], message: str, tiny_model: Path, tmp_path: Path
) -> None:
    args = tuple(str(tiny_model) if a == "MODEL" else a for a in args)
    proc = hwlaunch("run", "--engine", "vllm", *args, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Fix:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_under_a_launcher_it_is_a_user_error(tiny_model: Path, tmp_path: Path) -> None:
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    torchrun |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511", "TORCHELASTIC_RUN_ID": "t"}
    proc = hwlaunch(
        "run", "--engine", "vllm", "--model", str(tiny_model), cwd=tmp_path, timeout=120, **torchrun
    )
    assert proc.returncode == 2, proc.stderr
    assert "every rank would start an engine" in proc.stderr and "Traceback" not in proc.stderr
