"""The external executor under a real ``torchrun --standalone --nproc-per-node 2``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from processes import private_temp

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
TORCHRUN = Path(sys.executable).with_name("torchrun")


def torchrun(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """torchrun from torch, next to this interpreter, with a clean hwlaunch environment and
    ``cwd/temp`` as TMPDIR (torchrun leaves its log folder there)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HWLAUNCH_", "SLURM_"))}
    base = private_temp(base, cwd / "temp")
    return subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", *args],
        cwd=cwd,
        env={**base, "OMP_NUM_THREADS": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=200,
    )


def decision(plan: dict[str, Any], setting: str) -> dict[str, Any]:
    found: dict[str, Any] = next(d for d in plan["decisions"] if d["setting"] == setting)
    return found


def test_launch_without_arguments_adopts_torchrun_ranks(tmp_path: Path) -> None:
    proc = torchrun(str(SCRIPTS / "external_rank.py"), cwd=tmp_path, env={"HWL_OUT": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    pids = sorted(r["pid"] for r in ranks)
    for rank, seen in enumerate(ranks):
        plan = seen["plan"]
        assert seen["rank"] == rank
        assert (plan["executor"], plan["world_size"], plan["nnodes"]) == ("external", 2, 1)
        assert decision(plan, "launcher")["value"] == "torchrun"
        assert decision(plan, "world_size")["source"] == "env: WORLD_SIZE (torchrun)"
        assert decision(plan, "rank") == {
            "setting": "rank",
            "value": rank,
            "source": "env: RANK (torchrun)",
            "reason": "this process is this rank of the job",
        }
        assert decision(plan, "executor")["source"] == "fact: launcher torchrun"
        assert plan["start_method"] is None
        # the all-reduce of rank ids over gloo: 0 + 1 on both ranks, one result per rank
        assert seen["sums"] == [1]
        # no process started: the agent's children are exactly the two ranks, and they have none
        assert seen["agent_children"] == pids
        assert seen["own_children"] == []
        # an exception in the call: WorkerError with this rank and the traceback
        assert seen["error"]["rank"] == rank
        assert seen["error"]["type"] == "ZeroDivisionError"
        assert "in <lambda>" in seen["error"]["traceback"]
        # unique_reply_rank=R: rank R's own result there, None on the other ranks
        assert seen["only_rank_1"] == (11 if rank == 1 else None)
        assert seen["non_block"] == [rank]


def test_user_world_size_that_disagrees_with_torchrun_is_an_error(tmp_path: Path) -> None:
    script = tmp_path / "three.py"
    script.write_text("import hwlaunch\nhwlaunch.launch(world_size=3)\n")
    proc = torchrun(str(script), cwd=tmp_path)
    assert proc.returncode != 0
    assert (
        "world_size 3 (from resolve(world_size=)) disagrees with the torchrun launcher's "
        "world_size 2 (from env: WORLD_SIZE (torchrun))"
    ) in proc.stderr


def test_hwlaunch_run_under_torchrun(tmp_path: Path) -> None:
    """The model sharded across the launcher's ranks; rank 0 alone reports, with the
    all-reduce, the sharding and the token check."""
    proc = torchrun("-m", "hwlaunch.cli", "run", "--json", "--max-new-tokens", "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # one JSON object: rank 1 prints nothing
    assert result["rank"] == 0
    plan = result["plan"]
    assert (plan["executor"], plan["world_size"]) == ("external", 2)
    assert decision(plan, "world_size")["source"] == "env: WORLD_SIZE (torchrun)"
    assert result["allreduce_ok"] is True
    assert result["allreduce"]["got"] == [1, 1]  # gathered from both ranks
    assert result["parallelism"] == "tensor"
    whole = result["params_single_process"]
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    assert all(r["params"] <= 0.75 * whole for r in result["ranks"])
    assert result["ranks_agree"] is True and result["matches_single_process"] is True


def test_hwlaunch_console_script_under_torchrun(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("hwlaunch")
    proc = torchrun(
        "--no-python", str(script), "run", "--max-new-tokens", "2", "--prompt", "hi", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("tokens match a single-process run: yes") == 1
    assert "all-reduce of rank ids: [1, 1]" in proc.stdout
