"""Plugin contract v1 with real plugin distributions, installed with pip into a target directory.

tests/plugins/contract_dists holds one distribution per case: a site policy plugin that provides no
backend, a plugin whose worker setup fails, one that needs a newer contract, one with a
misspelled hook, and one bound job-wide whose device is absent here (tested with assumed facts).
Every check runs ``python -m hwlaunch.cli`` or a launching script in a subprocess whose
``HWLAUNCH_PLUGINS`` picks the third-party plugins of that case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from plugin_sites import CONTRACT_DISTS as DISTS
from plugin_sites import distributions, install, site_environ

import hwlaunch

SECRET = "s3cr3t-token-value-0451"


def without_budget(env: dict[str, str]) -> dict[str, str]:
    """The env without the thread budget's variables (tests/integration/test_thread_budget.py has them)."""
    return {k: v for k, v in env.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install(distributions(DISTS), tmp_path_factory.mktemp("contract_dists") / "site")


def environment(site: Path, plugins: str, **env: str) -> dict[str, str]:
    """Only this case's third-party plugins (built-ins always load), none of the variables a
    previous case's plugin reads."""
    drop = ("HWLAUNCH_", "NCCL_", "WIDE_", "SITE_")
    return site_environ(site, drop, HWLAUNCH_PLUGINS=plugins, **env)


def cli(site: Path, plugins: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hwlaunch.cli", *args],
        env=environment(site, plugins, **env),
        cwd=site.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )


def json_of(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def script(
    site: Path, plugins: str, body: str, tmp_path: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``body`` as a main-guarded script; its last stdout line is JSON."""
    path = tmp_path / "job.py"
    indented = textwrap.indent(textwrap.dedent(body), "    ")
    path.write_text(
        f"import json, os, sys\nimport hwlaunch\n\ndef main():\n{indented}\n\n"
        'if __name__ == "__main__":\n    main()\n'
    )
    return subprocess.run(
        [sys.executable, str(path)],
        env=environment(site, plugins, **env),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


def decision(plan: dict[str, Any], setting: str) -> dict[str, Any]:
    found: dict[str, Any] = next(d for d in plan["decisions"] if d["setting"] == setting)
    return found


# --- a site policy plugin that provides no backend ----------------------------------------------


def test_site_policy_proposals_show_in_the_plan_with_the_plugin_as_source(site: Path) -> None:
    plan = json_of(cli(site, "sitepolicy", "resolve", "-n", "2", "--json"))
    assert plan["backend"] == "cpu" and plan["start_method"] == "spawn"
    method = decision(plan, "start_method")
    assert (method["source"], method["reason"]) == (
        "plugin sitepolicy",
        "on our cluster always use spawn",
    )
    assert without_budget(plan["env"]) == {"NCCL_DEBUG": "WARN", "SITE_POLICY": "on"}
    env = decision(plan, "env")
    assert "plugin sitepolicy" in env["source"] and "site defaults" in env["reason"]
    assert plan["worker_setup"] == ["sitepolicy"]
    assert plan["warnings"] == []


def test_site_policy_never_overrides_what_the_user_set(site: Path, tmp_path: Path) -> None:
    config = tmp_path / "site.toml"
    config.write_text('env = { SITE_POLICY = "off" }\n')
    plan = json_of(
        cli(
            site,
            "sitepolicy",
            *("resolve", "-n", "2", "--start-method", "fork", "--config", str(config), "--json"),
            NCCL_DEBUG="INFO",
        )
    )
    assert decision(plan, "start_method")["source"] == "--start-method"
    assert plan["start_method"] == "fork"
    assert without_budget(plan["env"]) == {
        "SITE_POLICY": "off"
    }  # the config file's; NCCL_DEBUG stays the shell's
    dropped = [w for w in plan["warnings"] if w.startswith("plugin sitepolicy: proposal")]
    assert len(dropped) == 3, plan["warnings"]
    assert any("start_method='spawn'" in w and "--start-method" in w for w in dropped)
    assert any("NCCL_DEBUG" in w and "driver's environment" in w for w in dropped)
    assert any("SITE_POLICY" in w and str(config) in w for w in dropped)


def test_site_policy_proposal_breaking_the_backend_rule_is_dropped(site: Path) -> None:
    """The policy's spawn cannot hold where the main script is unguarded: fork it is."""
    plan = json_of(
        cli(
            site,
            "sitepolicy",
            *("resolve", "-n", "2", "--assume", "main_guard=unguarded", "--json"),
        )
    )
    assert plan["start_method"] == "fork"
    assert decision(plan, "start_method")["source"] != "plugin sitepolicy"
    assert any(
        "plugin sitepolicy: proposal start_method='spawn' dropped" in w
        and "would re-import __main__" in w
        for w in plan["warnings"]
    )


def test_backends_verbose_shows_hook_order_and_contracts(site: Path) -> None:
    payload = json_of(cli(site, "sitepolicy,widenpu", "backends", "--verbose", "--json"))
    assert payload["contract"] == hwlaunch.CONTRACT_VERSION
    assert payload["hook_order"]["hwlaunch_adjust_plan"] == ["sitepolicy"]
    assert payload["hook_order"]["hwlaunch_worker_setup"] == ["sitepolicy"]
    plugins = {p["name"]: p for p in payload["plugins"]}
    assert plugins["sitepolicy"]["backends"] == [] and plugins["sitepolicy"]["error"] is None
    assert plugins["sitepolicy"]["contract"] == "1.0"
    table = cli(site, "sitepolicy", "backends", "--verbose")
    assert "hwlaunch_adjust_plan: sitepolicy" in table.stdout, table.stdout


@pytest.mark.parametrize("executor", ["mp", "uni"])
def test_site_setup_hook_runs_once_in_every_worker_before_init_device(
    site: Path, tmp_path: Path, executor: str
) -> None:
    record = tmp_path / "records"
    record.mkdir()
    world = 2 if executor == "mp" else 1
    done = script(
        site,
        "sitepolicy",
        f"""
        with hwlaunch.launch(world_size={world}, executor={executor!r}) as ex:
            pids = ex.collective_rpc(lambda w: os.getpid())
            method = ex.plan.start_method
        print(json.dumps({{"pids": pids, "method": method}}))
        """,
        tmp_path,
        SITE_POLICY_RECORD=str(record),
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    expected = sorted(f"rank{rank}-pid{pid}" for rank, pid in enumerate(out["pids"]))
    assert sorted(p.name for p in record.iterdir()) == expected
    for path in record.iterdir():
        seen = json.loads(path.read_text())
        assert seen["device_before_setup"] is None  # before init_device
        assert seen["NCCL_DEBUG"] == ("WARN" if executor == "mp" else None)
    if executor == "mp":
        assert out["method"] == "spawn" and len(set(out["pids"])) == 2
        assert os.getpid() not in out["pids"]


# --- a plugin whose worker setup fails ----------------------------------------------------------


@pytest.mark.parametrize("executor", ["mp", "uni"])
def test_failing_setup_hook_is_a_startup_error_naming_the_plugin(
    site: Path, tmp_path: Path, executor: str
) -> None:
    world = 2 if executor == "mp" else 1
    done = script(
        site,
        "setupfails",
        f"""
        try:
            hwlaunch.launch(world_size={world}, executor={executor!r})
        except hwlaunch.WorkerStartupError as exc:
            print(json.dumps({{"rank": exc.rank, "reason": exc.reason}}))
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (
        "hwlaunch_worker_setup of plugin 'setupfails' (hwlaunch-setup-fails 0.6.0)"
        in (out["reason"])
    )
    assert f"cannot register the custom allocator on rank {out['rank']}" in out["reason"]


# --- a plugin needing a newer contract; a misspelled hook ---------------------------------------


def test_plugin_needing_a_newer_contract_fails_naming_both_versions(site: Path) -> None:
    rows = json_of(cli(site, "futurenpu", "backends", "--json"))
    (row,) = [r for r in rows if r["plugin"] == "futurenpu"]
    assert row["name"] is None
    for part in (
        "needs plugin contract 1.9",
        f"provides contract {hwlaunch.CONTRACT_VERSION}",
        "Fix: upgrade hwlaunch",
    ):
        assert part in row["error"]
    strict = cli(site, "futurenpu", "resolve", HWLAUNCH_STRICT_PLUGINS="1")
    assert strict.returncode == 2 and "Traceback" not in strict.stderr
    assert "needs plugin contract 1.9" in strict.stderr


def test_misspelled_hook_is_a_plugin_error_with_did_you_mean(site: Path) -> None:
    rows = json_of(cli(site, "typohook", "backends", "--json"))
    (row,) = [r for r in rows if r["plugin"] == "typohook"]
    assert "'hwlaunch_worker_setpu' (did you mean 'hwlaunch_worker_setup'?)" in row["error"]
    assert "typonpu" not in {r["name"] for r in rows}
    strict = cli(site, "typohook", "backends", HWLAUNCH_STRICT_PLUGINS="1")
    assert strict.returncode == 2 and "Traceback" not in strict.stderr
    assert "did you mean 'hwlaunch_worker_setup'" in strict.stderr


# --- job_wide binding with assumed (or emulated) devices; propagated variables -------------------------------

ASSUME = ("--assume", "widenpu.available=true", "--assume", "widenpu.device_count=4")


def test_job_wide_binding_with_assumed_devices(site: Path, tmp_path: Path) -> None:
    plan = json_of(
        cli(
            site,
            "widenpu",
            "resolve",
            "--backend",
            "widenpu",
            "-n",
            "2",
            *ASSUME,
            "--json",
            WIDE_TOKEN=SECRET,
        )
    )
    assert plan["device_binding"] == "job_wide"
    assert decision(plan, "propagate_env")["value"] == ["WIDE_TOKEN"]
    done = script(
        site,
        "widenpu",
        """
        plan = hwlaunch.resolve(backend="widenpu", world_size=2)  # 4 emulated devices
        with hwlaunch.launch(plan) as ex:
            seen = ex.collective_rpc(
                lambda w: (os.environ.get("WIDE_VISIBLE_DEVICES"), os.environ.get("WIDE_TOKEN"))
            )
        print(json.dumps(seen))
        """,
        tmp_path,
        WIDE_TOKEN=SECRET,
        WIDENPU_EMULATED_DEVICES="4",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [["0,1", SECRET], ["0,1", SECRET]]


def test_propagated_values_never_appear_in_plan_output(site: Path) -> None:
    args = ("resolve", "--backend", "widenpu", "-n", "2", *ASSUME)
    for output in ("--json", None):
        done = cli(site, "widenpu", *args, *([output] if output else []), WIDE_TOKEN=SECRET)
        assert done.returncode == 0, done.stderr
        assert "WIDE_TOKEN" in done.stdout
        assert SECRET not in done.stdout + done.stderr
