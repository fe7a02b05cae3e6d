"""The ``launcher`` fact: torchrun, SLURM and MPI detected from their variables (no cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hwlaunch import resolve
from hwlaunch.errors import ConfigError
from hwlaunch.planning.launchers import LAUNCHERS, Found, detect_launcher, expand_hostlist
from hwlaunch.worker import Worker

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "job1",
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.1.2.3",
    "MASTER_PORT": "29400",
}
SRUN = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "1",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_NTASKS": "8",
    "SLURM_STEP_NUM_NODES": "4",
    "SLURM_STEP_NODELIST": "gpu[07-09,11]",
    "SLURM_JOB_NODELIST": "gpu[01-11]",
}
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "2",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}
HYDRA = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}


@pytest.fixture
def no_launcher(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No launcher variable from the environment the tests run in."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_", "MPI_LOCAL")) or name in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "GROUP_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
        ):
            monkeypatch.delenv(name)
    return clean_env


def with_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def sources(plan: Any) -> dict[str, tuple[Any, str]]:
    return {d.setting: (d.value, d.source) for d in plan.decisions}


def test_no_launcher_leaves_the_plan_alone(no_launcher: Path) -> None:
    assert detect_launcher().launcher == "none"
    plan = resolve(world_size=2)
    assert plan.executor == "mp"
    assert "launcher" not in sources(plan)


def test_torchrun_gives_sizes_rank_and_rendezvous(
    no_launcher: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_env(monkeypatch, TORCHRUN)
    plan = resolve()
    got = sources(plan)
    assert (plan.executor, plan.world_size, plan.nnodes) == ("external", 4, 2)
    assert got["launcher"] == ("torchrun", "env: TORCHELASTIC_RUN_ID (torchrun)")
    assert got["world_size"] == (4, "env: WORLD_SIZE (torchrun)")
    assert got["nnodes"] == (2, "env: GROUP_WORLD_SIZE (torchrun)")
    assert got["rank"] == (3, "env: RANK (torchrun)")
    assert got["local_rank"] == (1, "env: LOCAL_RANK (torchrun)")
    assert got["master_addr"] == ("10.1.2.3", "env: MASTER_ADDR (torchrun)")
    assert got["master_port"] == (29400, "env: MASTER_PORT (torchrun)")
    assert plan.start_method is None
    assert plan.facts is not None and plan.facts.to_dict()["launcher"]["launcher"] == "torchrun"


def test_torchrun_needs_its_rank_variables(no_launcher: Path) -> None:
    """TORCHELASTIC_RUN_ID alone (an agent's own environment) is not a rank."""
    assert detect_launcher({"TORCHELASTIC_RUN_ID": "x"}).launcher == "none"


def test_srun_task_derives_master_addr_and_port(no_launcher: Path) -> None:
    info = detect_launcher(SRUN)
    assert info.launcher == "slurm"
    assert info.rank == Found(5, "env: SLURM_PROCID (slurm)")
    assert info.world_size == Found(8, "env: SLURM_STEP_NUM_TASKS (slurm)")
    assert info.nnodes == Found(4, "env: SLURM_STEP_NUM_NODES (slurm)")
    assert info.master_addr is not None and info.master_port is not None
    assert info.master_addr.value == "gpu07"  # the step's first host, not the job's
    assert info.master_addr.source == "derived: first host of SLURM_STEP_NODELIST (slurm)"
    assert info.master_port.value == 10000 + (4242 * 64 + 1) % 20000
    assert info.master_port.source == "derived: from SLURM_JOB_ID, SLURM_STEP_ID (slurm)"
    # the same on every rank of the step: nothing in it depends on the rank
    other = detect_launcher({**SRUN, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})
    assert other.master_addr == info.master_addr and other.master_port == info.master_port


def test_srun_on_one_node_uses_loopback_and_env_wins(no_launcher: Path) -> None:
    one = {**SRUN, "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NODELIST": "gpu07"}
    info = detect_launcher(one)
    assert info.master_addr is not None and info.master_addr.value == "127.0.0.1"
    given = detect_launcher({**SRUN, "MASTER_ADDR": "head", "MASTER_PORT": "1234"})
    assert given.master_addr is not None and given.master_port is not None
    assert (given.master_addr.value, given.master_addr.source) == (
        "head",
        "env: MASTER_ADDR (slurm)",
    )
    assert given.master_port.value == 1234


def test_batch_shell_is_not_a_rank(no_launcher: Path) -> None:
    """sbatch's own shell has SLURM_PROCID=0 but no step task count: not one rank of many."""
    batch = {k: v for k, v in SRUN.items() if not k.startswith("SLURM_STEP")}
    assert detect_launcher(batch).launcher == "none"


def test_slurm_resolve_through_the_cli(no_launcher: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}
    proc = subprocess.run(
        [sys.executable, "-m", "hwlaunch.cli", "resolve", "--json"],
        env={**env, **SRUN},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    got = {d["setting"]: (d["value"], d["source"]) for d in plan["decisions"]}
    assert (plan["executor"], plan["world_size"], plan["nnodes"]) == ("external", 8, 4)
    assert got["world_size"] == (8, "env: SLURM_STEP_NUM_TASKS (slurm)")
    assert got["rank"] == (5, "env: SLURM_PROCID (slurm)")
    assert plan["facts"]["launcher"]["master_addr"]["value"] == "gpu07"


@pytest.mark.parametrize(
    ("env", "rank_source", "nodes"),
    [
        (OPENMPI, "env: OMPI_COMM_WORLD_RANK (mpi)", 2),
        (HYDRA, "env: PMI_RANK (mpi)", 1),
    ],
)
def test_mpi_detection(
    no_launcher: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    rank_source: str,
    nodes: int,
) -> None:
    with_env(monkeypatch, env)
    plan = resolve()
    got = sources(plan)
    assert plan.executor == "external"
    assert got["launcher"][0] == "mpi"
    assert got["rank"][1] == rank_source
    assert plan.nnodes == nodes
    assert "derived:" in got["nnodes"][1]


def test_mpi_across_nodes_without_master_is_a_warning_naming_the_fix(
    no_launcher: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_env(monkeypatch, OPENMPI)
    plan = resolve()
    assert any("MASTER_ADDR and MASTER_PORT not set" in w for w in plan.warnings)
    assert sources(plan)["master_port"] == (None, "not set")


def test_mpi_on_one_node_still_needs_a_port(no_launcher: Path) -> None:
    info = detect_launcher(HYDRA)
    assert info.master_addr is not None and info.master_addr.value == "127.0.0.1"
    assert info.missing == ("MASTER_PORT",)


def test_open_mpi_wins_over_the_slurm_allocation_around_it(no_launcher: Path) -> None:
    batch_shell = {k: v for k, v in SRUN.items() if not k.startswith("SLURM_STEP")}
    assert detect_launcher({**batch_shell, **SRUN, **OPENMPI}).launcher == "mpi"
    # srun with PMI sets PMI_RANK too: SLURM says more (the node list), so it wins
    assert detect_launcher({**SRUN, **HYDRA}).launcher == "slurm"


def test_user_world_size_that_disagrees_names_both_values(
    no_launcher: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_env(monkeypatch, TORCHRUN)
    with pytest.raises(ConfigError) as info:
        resolve(world_size=8)
    assert str(info.value).startswith(
        "world_size 8 (from resolve(world_size=)) disagrees with the torchrun launcher's "
        "world_size 4 (from env: WORLD_SIZE (torchrun))"
    )
    assert resolve(world_size=4).world_size == 4  # agreeing is fine
    assert resolve(executor="mp", world_size=2).executor == "mp"  # another executor, chosen


def test_cli_disagreement_exits_2_without_traceback(no_launcher: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}
    proc = subprocess.run(
        [sys.executable, "-m", "hwlaunch.cli", "resolve", "-n", "3"],
        env={**env, **HYDRA},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "world_size 3 (from --world-size)" in proc.stderr
    assert "world_size 2 (from env: PMI_SIZE (mpi))" in proc.stderr


def test_assumed_launcher_is_marked(no_launcher: Path) -> None:
    plan = resolve(assume=["launcher=slurm"])
    got = sources(plan)
    assert plan.executor == "external"
    assert got["launcher"] == ("slurm", "resolve(assume=) launcher=slurm (assumed)")
    assert plan.facts is not None and "launcher" in plan.facts.assumed
    with pytest.raises(
        ConfigError, match=r"invalid value 'slrum' for launcher .*did you mean 'slurm'"
    ):
        resolve(assume=["launcher=slrum"])
    assert set(LAUNCHERS) == {"torchrun", "slurm", "mpi", "none"}


def test_external_without_launcher_is_an_error(no_launcher: Path) -> None:
    with pytest.raises(ConfigError, match="executor 'external' from resolve\\(executor=\\)"):
        resolve(executor="external")


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("a1,b[2-3],c", ["a1", "b2", "b3", "c"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("gpu-a[3]-ib", ["gpu-a3-ib"]),
    ],
)
def test_expand_hostlist(hostlist: str, hosts: list[str]) -> None:
    assert list(expand_hostlist(hostlist)) == hosts


@pytest.mark.parametrize("bad", ["n[01-", "n[a-b]"])
def test_bad_hostlist_names_the_value(bad: str) -> None:
    with pytest.raises(ConfigError, match="invalid SLURM host list"):
        list(expand_hostlist(bad))


def test_bad_launcher_variable_names_it(no_launcher: Path) -> None:
    with pytest.raises(ConfigError, match="invalid value 'four' of WORLD_SIZE set by torchrun"):
        detect_launcher({**TORCHRUN, "WORLD_SIZE": "four"})


@pytest.mark.parametrize(
    ("local_rank", "visible", "index"),
    [
        (3, None, 3),  # torchrun: every GPU of the node is visible, the rank takes its own
        (3, "0,1,2,3,4,5,6,7", 3),  # srun without GPU binding
        (3, "5", 0),  # srun --gpus-per-task=1: the task's one GPU
        (3, "6,7", 0),  # srun --gpus-per-task=2: the first of the task's two
        (0, "4", 0),
        (1, "0,1", 1),  # a job-wide list shorter than the node: still the local rank
    ],
)
def test_a_launched_rank_binds_the_device_the_launcher_left_it(
    no_launcher: Path,
    monkeypatch: pytest.MonkeyPatch,
    local_rank: int,
    visible: str | None,
    index: int,
) -> None:
    """Under a launcher hwlaunch sets no visibility: a CUDA rank binds its local rank among
    the GPUs it sees, or GPU 0 when the launcher gave it GPUs of its own (not device 0 for
    every rank, which is what the per_worker binding of hwlaunch's own workers means)."""
    plan = resolve(
        backend="cuda",
        world_size=8,
        assume=["launcher=torchrun", "cuda.available=true", "cuda.device_count=8"],
    )
    assert plan.executor == "external" and plan.device_binding == "per_worker"
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    worker = Worker(
        rank=local_rank, local_rank=local_rank, world_size=8, plan=plan,
        master_addr="127.0.0.1", master_port=29500,
    )  # fmt: skip
    assert worker.device_index == index
    mp_plan = resolve(
        backend="cuda",
        world_size=8,
        executor="mp",
        assume=["cuda.available=true", "cuda.device_count=8", "cuda.initialized=false"],
    )
    started_by_us = Worker(
        rank=local_rank, local_rank=local_rank, world_size=8, plan=mp_plan,
        master_addr="127.0.0.1", master_port=29500,
    )  # fmt: skip
    assert started_by_us.device_index == 0  # per_worker: it sees only its own GPU
