"""The example vendor plugin (examples/vendor-plugin), installed with pip as a vendor's user would.

The distribution is copied to a temporary directory (so no build/ or *.egg-info lands in the
repository) and installed once per session into a ``pip --target`` directory; every check runs
``python -m hwlaunch.cli`` (or pytest) in a subprocess with that directory on PYTHONPATH. A broken
copy, whose module raises on import, is generated and installed the same way into another one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import plugin_sites
import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vendor-plugin"
DISTRIBUTION, VERSION = "hwlaunch-acme-npu", "0.1.0"
BUILTINS = ("cpu", "cuda", "hpu", "xpu")
BROKEN_REASON = "ImportError: libacme.so.1: cannot open shared object file"
BLOCK, ALLOW, STRICT = "HWLAUNCH_DISABLE_PLUGINS", "HWLAUNCH_PLUGINS", "HWLAUNCH_STRICT_PLUGINS"


def install(source: Path, root: Path, name: str) -> Path:
    """pip-install (a copy of) ``source`` into ``root/<name>-site``."""
    return plugin_sites.install([source], root / f"{name}-site")


@pytest.fixture(scope="session")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vendor_plugin")


@pytest.fixture(scope="session")
def acme_site(root: Path) -> Path:
    return install(EXAMPLE, root, "acme")


@pytest.fixture(scope="session")
def broken_site(root: Path) -> Path:
    """The same distribution, whose module raises on import (a missing vendor library)."""
    source = shutil.copytree(EXAMPLE, root / "broken-source")
    init = source / "hwlaunch_acme" / "__init__.py"
    future = "from __future__ import annotations\n"
    reason = BROKEN_REASON.removeprefix("ImportError: ")
    init.write_text(init.read_text().replace(future, f"{future}\nraise ImportError({reason!r})\n"))
    return install(source, root, "broken")


def environment(site: Path | None, **env: str) -> dict[str, str]:
    """This environment without HWLAUNCH_*/ACME_* variables, plus ``site`` and ``env``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HWLAUNCH_", "ACME_"))}
    paths = [str(site)] if site is not None else []
    environ["PYTHONPATH"] = os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).strip(
        os.pathsep
    )
    environ["PYTHONDONTWRITEBYTECODE"] = "1"
    environ.update(env)
    return environ


def hwlaunch(
    site: Path | None, cwd: Path, *args: str, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m hwlaunch.cli ARGS`` in ``cwd`` (no config file there)."""
    return subprocess.run(
        [sys.executable, "-m", "hwlaunch.cli", *args],
        env=environment(site, **env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def json_of(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return json.loads(done.stdout)


def json_of_error(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The ``{"error": {...}}`` object a failed ``--json`` command prints."""
    error: dict[str, Any] = json.loads(done.stdout)["error"]
    assert error["exit_code"] == done.returncode
    return error


def by_name(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in rows if row["name"] is not None}


@pytest.fixture(scope="session")
def verbose(acme_site: Path, root: Path) -> dict[str, Any]:
    """``hwlaunch backends --verbose --json`` with the example installed."""
    payload: dict[str, Any] = json_of(hwlaunch(acme_site, root, "backends", "--verbose", "--json"))
    return payload


# --- the installed example -------------------------------------------------------------------


def test_backends_lists_acme_with_its_distribution_and_version(verbose: dict[str, Any]) -> None:
    rows = verbose["backends"]
    assert sorted(by_name(rows)) == sorted([*BUILTINS, "acme"])
    assert [row for row in rows if row["name"] is None] == []  # no plugin failed
    assert by_name(rows)["acme"] == {
        "name": "acme",
        "plugin": "acme",
        "distribution": DISTRIBUTION,
        "version": VERSION,
        "available": True,
        "device_count": 2,  # the emulation's default
        "initialized": False,
        "start_methods": {"allowed": ["spawn", "forkserver"], "default": "forkserver"},
        "dist_backend": "gloo",
        "device_control_env_var": "ACME_VISIBLE_DEVICES",
        "ray_resource": "ACME",
        "worker": "hwlaunch_acme.worker:AcmeWorker",
        "device_binding": "job_wide",
        "propagate_env": ["ACME_RT_*"],
        "ray_noset_visibility_var": "RAY_EXPERIMENTAL_NOSET_ACME_VISIBLE_DEVICES",
        "contract": "1.0",
        "error": None,
    }
    plugin = next(p for p in verbose["plugins"] if p["name"] == "acme")
    assert plugin == {
        "name": "acme",
        "module": "hwlaunch_acme",
        "distribution": DISTRIBUTION,
        "version": VERSION,
        "hooks": [
            "hwlaunch_adjust_plan",
            "hwlaunch_register_backends",
            "hwlaunch_register_executors",
            "hwlaunch_worker_setup",
        ],
        "backends": ["acme"],
        "executors": ["acme-sub"],
        "contract": "1.0",
        "warnings": [],
        "error": None,
    }
    assert verbose["hook_order"]["hwlaunch_adjust_plan"] == ["acme"]
    assert verbose["hook_order"]["hwlaunch_worker_setup"] == ["acme"]
    acme_sub = next(e for e in verbose["executors"] if e["name"] == "acme-sub")
    assert (acme_sub["plugin"], acme_sub["distribution"], acme_sub["executor"]) == (
        "acme",
        DISTRIBUTION,
        "hwlaunch_acme.executor:AcmeSubprocessExecutor",
    )


def test_acme_devices_follow_the_emulation_variables(acme_site: Path, root: Path) -> None:
    none = by_name(json_of(hwlaunch(acme_site, root, "backends", "--json", ACME_NPU_DEVICES="0")))
    assert (none["acme"]["available"], none["acme"]["device_count"]) == (False, 0)
    narrowed = by_name(
        json_of(
            hwlaunch(
                acme_site,
                root,
                "backends",
                "--json",
                ACME_NPU_DEVICES="8",
                ACME_VISIBLE_DEVICES="3,5,6",
            )
        )
    )
    assert narrowed["acme"]["device_count"] == 3


def test_run_on_acme_succeeds(acme_site: Path, root: Path) -> None:
    done = hwlaunch(acme_site, root, "run", "--backend", "acme", "--json", timeout=300)
    result = json_of(done)
    assert result["allreduce_ok"] is True
    assert result["matches_single_process"] is True
    plan = result["plan"]
    assert (plan["backend"], plan["executor"], plan["start_method"]) == ("acme", "mp", "forkserver")
    assert plan["env"]["ACME_LOG_LEVEL"] == "warning"


def test_disabling_the_plugin_hides_it(acme_site: Path, root: Path) -> None:
    payload = json_of(
        hwlaunch(acme_site, root, "backends", "--verbose", "--json", **{BLOCK: "acme"})
    )
    assert sorted(by_name(payload["backends"])) == sorted(BUILTINS)
    assert "acme" not in [p["name"] for p in payload["plugins"]]
    done = hwlaunch(acme_site, root, "resolve", "--backend", "acme", **{BLOCK: "acme"})
    assert done.returncode == 2
    assert f"backend 'acme' from --backend is installed but excluded by {BLOCK}" in done.stderr


def test_allowlist_selects_third_party_plugins(acme_site: Path, root: Path) -> None:
    assert "acme" not in by_name(
        json_of(hwlaunch(acme_site, root, "backends", "--json", **{ALLOW: ""}))
    )
    assert "acme" in by_name(
        json_of(hwlaunch(acme_site, root, "backends", "--json", **{ALLOW: "acme"}))
    )


def test_without_the_package_acme_is_not_listed(root: Path) -> None:
    rows = json_of(hwlaunch(None, root, "backends", "--json"))
    assert "acme" not in by_name(rows)
    assert "acme" not in [row["plugin"] for row in rows]


# --- the broken copy -------------------------------------------------------------------------


def test_broken_copy_is_listed_as_failed_with_the_reason(broken_site: Path, root: Path) -> None:
    rows = json_of(hwlaunch(broken_site, root, "backends", "--json"))
    failed = [row for row in rows if row["name"] is None]
    assert len(failed) == 1
    assert {k: failed[0][k] for k in ("plugin", "distribution", "version")} == {
        "plugin": "acme",
        "distribution": DISTRIBUTION,
        "version": VERSION,
    }
    assert "cannot load 'hwlaunch_acme'" in failed[0]["error"]
    assert BROKEN_REASON in failed[0]["error"]
    backends = by_name(rows)
    assert sorted(backends) == sorted(BUILTINS)
    assert all(backends[name]["error"] is None for name in BUILTINS)
    table = hwlaunch(broken_site, root, "backends")
    assert table.returncode == 0
    assert "libacme.so.1" in table.stdout


def test_other_backends_still_work_beside_the_broken_copy(broken_site: Path, root: Path) -> None:
    plan = json_of(hwlaunch(broken_site, root, "resolve", "--backend", "cpu", "--json"))
    assert plan["backend"] == "cpu"
    assert any("plugin 'acme'" in w and "libacme.so.1" in w for w in plan["warnings"])


def test_strict_mode_fails_with_the_reason(broken_site: Path, root: Path) -> None:
    for args in (("backends", "--json"), ("resolve", "--backend", "cpu")):
        done = hwlaunch(broken_site, root, *args, **{STRICT: "1"})
        assert done.returncode == 2, done.stdout
        if "--json" in args:  # the error as one JSON object
            assert json_of_error(done)["type"] == "PluginError"
        else:
            assert done.stdout == ""
        assert "Traceback" not in done.stderr
        assert done.stderr.startswith("hwlaunch: error: ")
        assert f"plugin 'acme' ({DISTRIBUTION} {VERSION}) failed to load" in done.stderr
        assert BROKEN_REASON in done.stderr


# --- the example's own tests -------------------------------------------------------------------


def test_the_example_passes_its_conformance_suite(acme_site: Path, root: Path) -> None:
    """``pytest tests`` in the example, against the installed plugin (the vendor's workflow)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "tests"],
        env=environment(acme_site),
        cwd=root / "acme-site-src" / EXAMPLE.name,  # the copy that was installed
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    assert " passed" in report and " failed" not in report, report
    assert "does not allow start method 'fork'" in report  # the one skip, with its reason
    assert " 1 skipped" in report, report  # the rest ran: the two-node Ray check included
