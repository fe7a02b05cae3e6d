"""Third-party executor plugins, installed with pip into a target directory.

``tests/plugins/executor_plugin_dists/zoo`` is one distribution with six entry points: ``inline``
and ``zoo-procs``, working executors, and four broken ones (its class cannot be imported, its
class is no Executor, its spec is invalid, its spec promises a process per rank that it does not
start: tests/plugins/test_conformance_by_capability.py). Each check runs ``python -m hwlaunch.cli`` in a subprocess with
the target directory on PYTHONPATH, as after ``pip install``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from plugin_sites import EXECUTOR_DISTS, hwlaunch_cli, install

from hwlaunch import CONTRACT_VERSION

ZOO = EXECUTOR_DISTS / "zoo"
DISTRIBUTION = "hwlaunch-executor-zoo"

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install([ZOO], tmp_path_factory.mktemp("executor_plugins") / "site")


def hwlaunch(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return hwlaunch_cli(site, *args, cwd=site.parent)


def json_of(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_listed_with_their_plugins_and_the_broken_spec_as_a_failure(site: Path) -> None:
    payload = json_of(hwlaunch(site, "backends", "--verbose", "--json"))
    executors = {e["name"]: e for e in payload["executors"]}
    assert list(executors) == [
        "uni",
        "mp",
        "ray",
        "external",
        "broken-import",
        "inline",
        "zoo-liar",
        "not-executor",
        "zoo-procs",
    ]
    assert (executors["inline"]["plugin"], executors["inline"]["distribution"]) == (
        "inline",
        DISTRIBUTION,
    )
    assert executors["inline"]["max_world_size"] == 1
    plugins = {p["name"]: p for p in payload["plugins"]}
    assert plugins["inline"]["executors"] == ["inline"]
    assert plugins["inline"]["hooks"] == ["hwlaunch_register_executors"]
    assert plugins["badspec"]["executors"] == []
    assert "invalid ExecutorSpec field 'executor'" in plugins["badspec"]["error"]
    table = hwlaunch(site, "backends", "--verbose")
    assert table.returncode == 0, table.stderr
    assert "hwlaunch executors" in table.stdout  # the table, then one line per plugin:
    contract = CONTRACT_VERSION  # the zoo declares none: it is written to the current one
    line = f"hwlaunch-executor-zoo 0.3.0, contract {contract}, hooks: hwlaunch_register_executors, "
    assert line + "backends: -, " in table.stdout
    assert "executors: inline" in table.stdout
    assert "FAILED: hwlaunch_register_executors raised" in table.stdout


def test_chosen_with_executor_and_runs(site: Path) -> None:
    plan = json_of(hwlaunch(site, "resolve", "--executor", "inline", "--json"))
    assert plan["executor"] == "inline"
    executor = next(d for d in plan["decisions"] if d["setting"] == "executor")
    assert executor["source"] == "--executor"
    assert plan["start_method"] is None
    result = json_of(
        hwlaunch(site, "run", "--executor", "inline", "-n", "1", "--json", "--max-new-tokens", "2")
    )
    assert result["plan"]["executor"] == "inline"
    assert result["allreduce"]["got"] == [0]
    assert result["matches_single_process"] is True


def test_its_limits_are_checked_before_anything_starts(site: Path) -> None:
    done = hwlaunch(site, "resolve", "--executor", "inline", "-n", "2")
    assert done.returncode == 2
    assert "executor 'inline' from --executor runs at most 1 worker" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_misspelt_name_suggests_the_registered_one(site: Path) -> None:
    done = hwlaunch(site, "resolve", "--executor", "inlne")
    assert done.returncode == 2
    assert "invalid executor 'inlne' from --executor; did you mean 'inline'?" in done.stderr
    assert "inline" in done.stderr.split("allowed:")[1]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "broken-import",
            "executor 'broken-import' of plugin 'brokenimport' (hwlaunch-executor-zoo 0.3.0) "
            "(hwlaunch_zoo_gone:GoneExecutor) cannot be imported: ModuleNotFoundError",
        ),
        ("not-executor", "is not a subclass of hwlaunch.Executor"),
    ],
)
def test_a_broken_executor_fails_cleanly_at_launch(site: Path, name: str, message: str) -> None:
    done = hwlaunch(site, "run", "--executor", name, "-n", "1", "--max-new-tokens", "1")
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_the_broken_spec_cannot_be_chosen(site: Path) -> None:
    done = hwlaunch(site, "resolve", "--executor", "badspec")
    assert done.returncode == 2
    assert "invalid executor 'badspec' from --executor" in done.stderr


RESTART_SCRIPT = """
import json, os, signal, time
import hwlaunch

if __name__ == "__main__":
    with hwlaunch.launch(backend="cpu", world_size=2, executor="zoo-procs", max_restarts=1) as ex:
        before = ex.pids
        os.kill(before[0], signal.SIGKILL)
        deadline = time.monotonic() + 120
        while ex.restarts < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        pings = ex.collective_rpc("ping")
        print(json.dumps({"restarts": ex.restarts, "before": before, "after": ex.pids,
                          "pings": pings, "start_method": ex.plan.start_method}))
"""


def test_a_plugin_executor_that_declares_restarts_restarts_its_group(site: Path) -> None:
    plan = json_of(
        hwlaunch(
            site, "resolve", "--executor", "zoo-procs", "--max-restarts", "1", "-n", "2", "--json"
        )
    )
    assert plan["max_restarts"] == 1
    decided = {d["setting"] for d in plan["decisions"]}
    assert {"start_method", "rpc_channel", "max_restarts"} <= decided
    assert plan["start_method"] is not None
    script = site.parent / "restart_zoo.py"
    script.write_text(RESTART_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLAUNCH_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        cwd=site.parent,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["restarts"] == 1
    assert set(result["after"]).isdisjoint(result["before"])
    assert result["pings"] == result["after"]


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("inline", "runs the worker in this process, which a restart cannot replace"),
        ("zoo-liar", "does not restart worker groups"),  # declares neither restarts nor in_process
    ],
)
def test_a_plugin_executor_without_restarts_is_told_max_restarts_is_not_used(
    site: Path, name: str, why: str
) -> None:
    plan = json_of(hwlaunch(site, "resolve", "--executor", name, "--max-restarts", "2", "--json"))
    assert plan["max_restarts"] == 0
    assert (
        f"max_restarts 2 (from --max-restarts) is not used: the {name} executor {why}"
        in plan["warnings"]
    )
