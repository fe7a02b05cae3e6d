"""The unguarded script: its tokens where fork is safe; else MissingMainGuardError, no process.

vLLM on its own runs its engine core, and on its CPU platform its workers, by spawn: a script
with ``LLM(...)`` at module level dies in CPython's "bootstrapping phase" error. On hwlaunch
the engine core runs in the script's process and the workers start as the plan says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm_engines import token_ids
from vllm_scripts import Finished, left_behind, run_script

BOOTSTRAP_ERROR = "An attempt has been made to start a new process before"


@pytest.fixture(scope="module")
def script_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The unguarded script's temporary directory, where vLLM's ranks meet (its file store)
    and bind their broadcast queues' ipc sockets (``VLLM_RPC_BASE_PATH``)."""
    return tmp_path_factory.mktemp("script-tmp")


@pytest.fixture(scope="module")
def unguarded_fork(tiny_model: Path, script_tmp: Path) -> Finished:
    """The script on fork, with a CPU binding the user set (each rank the other's CPU)."""
    return run_script(
        "unguarded.py",
        str(tiny_model),
        VLLM_CPU_OMP_THREADS_BIND="1|0",
        TMPDIR=str(script_tmp),
        VLLM_RPC_BASE_PATH=str(script_tmp),
    )


def test_unguarded_script_runs_to_its_tokens_on_fork(
    unguarded_fork: Finished, engine_tp2: Any, prompts: list[str]
) -> None:
    result = unguarded_fork.json
    assert result["start_method"] == "fork"
    assert result["tokens"] == token_ids(engine_tp2, prompts)
    assert BOOTSTRAP_ERROR not in unguarded_fork.stderr
    # the workers ended with the script (hwlaunch's exit handler) and took vLLM's segments along
    assert result["ident"] and left_behind(result["ident"]) == []


def test_the_script_leaves_nothing_in_its_temporary_directory(
    unguarded_fork: Finished, script_tmp: Path
) -> None:
    """The file store's file and the broadcast queues' socket files are gone with the job
    (vLLM's own executor leaves the socket files); torch's compile cache stays, as caches do."""
    assert unguarded_fork.json["tokens"]
    left = sorted(p.name for p in script_tmp.iterdir() if not p.name.startswith("torchinductor"))
    assert left == []


def test_a_binding_the_user_set_is_honoured(unguarded_fork: Finished) -> None:
    assert unguarded_fork.json["cpus"] == [[1], [0]]


def test_unguarded_script_needing_spawn_stops_before_any_process(tiny_model: Path) -> None:
    finished = run_script(
        "unguarded.py", str(tiny_model), timeout=120, HWLAUNCH_START_METHOD="spawn"
    )
    assert finished.returncode == 1, finished.stderr[-3000:]
    assert "MissingMainGuardError" in finished.stderr
    script = Path(__file__).parent / "scripts" / "unguarded.py"
    line = next(
        number
        for number, text in enumerate(script.read_text().splitlines(), 1)
        if text.startswith("llm = LLM(")
    )
    assert f"{script}:{line}" in finished.stderr, finished.stderr[-3000:]
    assert BOOTSTRAP_ERROR not in finished.stderr
    assert "Engine core initialization failed" not in finished.stderr
    assert "[rank" not in finished.stderr  # no worker ever printed: none started
