"""The CPU thread budget as the plan decides it: each worker's share of the usable CPUs, who
wins over it (a cpu_threads setting, then OMP_NUM_THREADS as the user set it), and where it is
not applied. Pure: resolve() with assumed facts, no process started (the workers' side is in
tests/integration/test_worker_env.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hwlaunch
from hwlaunch.errors import ConfigError

GUARDED = {"main_guard": "guarded", "in_ray_actor": False, "daemonic": False}
TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "job1",
    "RANK": "1",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29400",
}


@pytest.fixture(autouse=True)
def no_thread_env(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No thread variable, no launcher and no config file from the environment of the tests."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", *TORCHRUN):
        monkeypatch.delenv(name, raising=False)
    return clean_env


def cpu_plan(cpus: int, world: int = 2, **settings: object) -> hwlaunch.Plan:
    return hwlaunch.resolve(
        backend="cpu",
        world_size=world,
        assume={**GUARDED, "usable_cpus": cpus},
        **settings,  # type: ignore[arg-type]
    )


def threads(plan: hwlaunch.Plan) -> tuple[int | None, str | None, str | None]:
    return plan.cpu_threads, plan.env.get("OMP_NUM_THREADS"), plan.env.get("MKL_NUM_THREADS")


# -- the share ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cpus", "world", "share"),
    [(2, 2, 1), (16, 3, 5), (8, 2, 4), (1, 4, 1), (3, 4, 1)],
)
def test_each_worker_gets_its_share_of_the_usable_cpus(cpus: int, world: int, share: int) -> None:
    plan = cpu_plan(cpus, world)
    assert threads(plan) == (share, str(share), str(share))
    decision = plan.decision("cpu_threads")
    cpu_count = f"{cpus} CPU{'s' if cpus > 1 else ''}"
    assert decision.source == f"fact: {cpu_count} (assumed) / {world} workers"
    assert "its affinity" in decision.reason
    assert "OMP_NUM_THREADS, MKL_NUM_THREADS and torch.set_num_threads" in decision.reason
    assert plan.decision("env").source == "cpu_threads"
    assert plan.to_dict()["cpu_threads"] == share


def test_accelerator_workers_get_the_same_share() -> None:
    """Host threads oversubscribe the CPUs whatever the device: a cuda worker gets its share,
    not torchrun's and vLLM's blanket 1 (which starves its CPU-side work)."""
    plan = hwlaunch.resolve(
        world_size=2, assume={**GUARDED, "cuda.device_count": 2, "usable_cpus": 16}
    )
    assert plan.backend == "cuda"
    assert threads(plan) == (8, "8", "8")


def test_ray_divides_by_the_workers_per_node() -> None:
    plan = cpu_plan(8, world=4, nnodes=2, executor="ray")
    assert threads(plan) == (4, "4", "4")
    source = plan.decision("cpu_threads").source
    assert (
        source == "fact: 8 CPUs (assumed) / 2 workers per node, each node taken to be like this one"
    )


def test_uni_leaves_the_programs_threads_alone() -> None:
    plan = cpu_plan(8, world=1)
    assert plan.executor == "uni"
    assert threads(plan) == (None, None, None)
    assert plan.decision("cpu_threads").reason.startswith("not applied: the uni executor")
    assert plan.warnings == ()
    requested = cpu_plan(8, world=1, cpu_threads=2)
    assert requested.cpu_threads is None
    assert any(
        "cpu_threads 2 (from resolve(cpu_threads=)) is not used" in w for w in requested.warnings
    )


# -- who wins ---------------------------------------------------------------------------------
def test_a_cpu_threads_setting_wins_and_sets_both_variables() -> None:
    plan = cpu_plan(16, cpu_threads=3)
    assert threads(plan) == (3, "3", "3")
    decision = plan.decision("cpu_threads")
    assert decision.source == "resolve(cpu_threads=)"
    assert "requested (the share would be 8: 16 CPUs (assumed) / 2 workers)" in decision.reason


def test_the_setting_from_env_and_config_with_its_source(
    no_thread_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (no_thread_env / "hwlaunch.toml").write_text("[backends.cpu]\ncpu_threads = 2\n")
    assert cpu_plan(16).decision("cpu_threads").source == "hwlaunch.toml:2 [backends.cpu]"
    monkeypatch.setenv("HWLAUNCH_CPU_THREADS", "5")
    plan = cpu_plan(16)
    assert (plan.cpu_threads, plan.decision("cpu_threads").source) == (
        5,
        "env HWLAUNCH_CPU_THREADS",
    )


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5"])
def test_a_bad_setting_names_its_source(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWLAUNCH_CPU_THREADS", bad)
    with pytest.raises(
        ConfigError, match=f"invalid cpu_threads '{bad}' from env HWLAUNCH_CPU_THREADS"
    ):
        cpu_plan(4)


def test_omp_num_threads_in_the_plans_env_wins_over_the_share(no_thread_env: Path) -> None:
    (no_thread_env / "hwlaunch.toml").write_text('env = { OMP_NUM_THREADS = "4" }\n')
    plan = cpu_plan(2)
    assert threads(plan) == (4, "4", "4")  # MKL follows the user's count
    decision = plan.decision("cpu_threads")
    assert decision.source == "hwlaunch.toml:1"
    assert "OMP_NUM_THREADS=4 as the user set it wins over the budget" in decision.reason
    assert "(2 CPUs (assumed) / 2 workers: 1)" in decision.reason


def test_omp_num_threads_of_the_driver_wins_and_travels_with_the_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    monkeypatch.setenv("MKL_NUM_THREADS", "2")
    plan = cpu_plan(16)
    assert threads(plan) == (6, "6", "2")  # each as the user set it: Ray actors get them too
    assert plan.decision("cpu_threads").source == "env OMP_NUM_THREADS (driver)"
    assert plan.facts is not None
    assert plan.facts.thread_env == {"OMP_NUM_THREADS": "6", "MKL_NUM_THREADS": "2"}


def test_an_openmp_list_is_kept_and_torch_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")
    plan = cpu_plan(16)
    assert threads(plan) == (None, "4,2", None)
    assert "not a thread count, so torch.set_num_threads is left alone" in (
        plan.decision("cpu_threads").reason
    )


def test_a_setting_that_replaces_the_users_variable_says_so(
    no_thread_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (no_thread_env / "hwlaunch.toml").write_text('env = { OMP_NUM_THREADS = "4" }\n')
    monkeypatch.setenv("MKL_NUM_THREADS", "8")
    plan = cpu_plan(16, cpu_threads=2)
    assert threads(plan) == (2, "2", "2")
    assert any(
        "OMP_NUM_THREADS=4 from hwlaunch.toml:1 is replaced by cpu_threads 2" in w
        for w in plan.warnings
    )
    assert any(
        "MKL_NUM_THREADS=8 from the driver's environment is replaced" in w for w in plan.warnings
    )


# -- under torchrun ---------------------------------------------------------------------------
def test_under_torchrun_its_default_of_one_gives_way_to_the_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torchrun sets OMP_NUM_THREADS=1 for ranks nobody gave a count: the plan shows the
    right number (CPUs / torchrun's local world size), applied with torch.set_num_threads."""
    for key, value in {**TORCHRUN, "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(key, value)
    plan = hwlaunch.resolve(backend="cpu", assume={"usable_cpus": 8})
    assert plan.executor == "external"
    assert threads(plan) == (4, None, None)  # the environment is the launcher's: not touched
    decision = plan.decision("cpu_threads")
    assert decision.source == "fact: 8 CPUs (assumed) / 2 workers"
    assert "applied with torch.set_num_threads when this rank's worker starts" in decision.reason


def test_under_torchrun_a_users_count_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {**TORCHRUN, "OMP_NUM_THREADS": "3"}.items():
        monkeypatch.setenv(key, value)
    plan = hwlaunch.resolve(backend="cpu", assume={"usable_cpus": 8})
    assert (plan.cpu_threads, plan.decision("cpu_threads").source) == (
        3,
        "env OMP_NUM_THREADS (driver)",
    )


# -- the fact ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["0", "-2", "many"])
def test_assumed_usable_cpus_must_be_a_count(bad: str) -> None:
    with pytest.raises(ConfigError, match=f"invalid value '{bad}' for usable_cpus from"):
        hwlaunch.resolve(backend="cpu", world_size=2, assume={"usable_cpus": bad})


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_usable_cpus_is_the_affinity_not_the_machine(tmp_path: Path) -> None:
    """A process pinned to one CPU (taskset, a container's cpuset) has one CPU to share,
    whatever os.cpu_count() says: `hwlaunch resolve --json` in such a process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HWLAUNCH_", "OMP_", "MKL_"))}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from hwlaunch.cli import main; "
            "main(['resolve', '--backend', 'cpu', '-n', '2', '--assume', 'main_guard=guarded', "
            "'--json'])",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["facts"]["usable_cpus"] == 1
    assert data["cpu_threads"] == 1
    cpu_threads = next(d for d in data["decisions"] if d["setting"] == "cpu_threads")
    assert cpu_threads["source"] == "fact: 1 CPU / 2 workers"


def test_the_cli_flag(no_thread_env: Path) -> None:
    def resolve(*flags: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "hwlaunch.cli", "resolve", "--backend", "cpu", "-n", "2"]
        return subprocess.run(
            [*command, *flags], capture_output=True, text=True, cwd=no_thread_env, timeout=60
        )

    result = resolve("--cpu-threads", "3", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["cpu_threads"], data["env"]["OMP_NUM_THREADS"]) == (3, "3")
    bad = resolve("--cpu-threads", "0")
    assert bad.returncode == 2
    assert "invalid cpu_threads '0' from --cpu-threads" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_plugins_thread_variable_gives_way_to_the_budget() -> None:
    """A plugin's env proposal may not override OMP_NUM_THREADS behind the budget's back (the
    workers would then run one count in the variable and another in torch)."""
    from hwlaunch.planning.policy import Proposal, apply_proposals
    from hwlaunch.planning.registry import default_registry
    from hwlaunch.planning.settings import Overrides

    plan = cpu_plan(8)
    proposal = Proposal("site", "env", {"OMP_NUM_THREADS": "16", "SITE": "on"}, "site defaults")
    spec = default_registry().specs["cpu"]
    adjusted, dropped = apply_proposals(plan, spec, Overrides(), [proposal])
    assert threads(adjusted) == (4, "4", "4") and adjusted.env["SITE"] == "on"
    assert dropped == [
        "plugin site: proposal env={'OMP_NUM_THREADS': '16'} dropped: OMP_NUM_THREADS is the "
        "thread budget's (set cpu_threads instead)"
    ]
