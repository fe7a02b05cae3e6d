"""The ``hwlaunch`` command line, run as real subprocesses: JSON output, exit codes, messages
without tracebacks (unless --debug), and no torch import for ``import hwlaunch`` or
``hwlaunch backends``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import hwlaunch

pytestmark = pytest.mark.usefixtures("clean_env")

HWLAUNCH = str(Path(sys.executable).with_name("hwlaunch"))
CPU_ONLY = [
    "--assume=cuda.available=false",
    "--assume=hpu.available=false",
    "--assume=xpu.available=false",
    "--assume=main_guard=guarded",
]
BACKEND_KEYS = {
    "name",
    "plugin",
    "distribution",
    "version",
    "available",
    "device_count",
    "initialized",
    "start_methods",
    "dist_backend",
    "device_control_env_var",
    "ray_resource",
    "worker",
    "device_binding",
    "propagate_env",
    "ray_noset_visibility_var",
    "contract",
    "error",
}


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed ``hwlaunch`` script (falling back to ``python -m hwlaunch.cli``)."""
    command = [HWLAUNCH] if os.path.exists(HWLAUNCH) else [sys.executable, "-m", "hwlaunch.cli"]
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=os.environ.copy(),
        timeout=60,
    )


def test_resolve_json(clean_env: Path) -> None:
    result = run(
        "resolve", "--json", "-n", "4", "--assume", "cuda.device_count=2", "--assume",
        "main_guard=guarded",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert (plan["backend"], plan["world_size"], plan["executor"]) == ("cuda", 4, "ray")
    decisions = {d["setting"]: d for d in plan["decisions"]}
    assert decisions["world_size"]["source"] == "--world-size"
    assert decisions["executor"]["source"] == "fact: cuda.device_count (assumed)"
    assert "exceeds the 2 local cuda devices" in decisions["executor"]["reason"]
    assert {"cuda.available", "cuda.device_count", "main_guard"} <= set(plan["facts"]["assumed"])


def test_resolve_flags_and_config_sources(clean_env: Path) -> None:
    (clean_env / "site.toml").write_text('[backends.cpu]\nstart_method = "forkserver"\n')
    result = run("resolve", "--json", "--world-size=2", "--config", "site.toml", *CPU_ONLY)
    assert result.returncode == 0, result.stderr
    decisions = {d["setting"]: d for d in json.loads(result.stdout)["decisions"]}
    assert decisions["start_method"]["value"] == "forkserver"
    assert decisions["start_method"]["source"] == "site.toml:2 [backends.cpu]"
    result = run("resolve", "--json", "-n", "2", "--start-method", "spawn", *CPU_ONLY)
    decisions = {d["setting"]: d for d in json.loads(result.stdout)["decisions"]}
    assert decisions["start_method"]["source"] == "--start-method"


def test_resolve_table_for_people(clean_env: Path) -> None:
    result = run("resolve", "-n", "2", "--assume", "cuda.initialized=true", "--assume",
                 "cuda.device_count=2", "--assume", "main_guard=guarded")  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for word in ("backend", "executor", "start_method", "forkserver", "fact: cuda.initialized"):
        assert word in out
    assert "warning: using start method 'forkserver' instead of fork" in out
    assert "(assumed)" in out


@pytest.mark.parametrize(
    ("args", "files", "message"),
    [
        (["resolve", "--executor", "foo"], {}, "invalid executor 'foo' from --executor"),
        (["resolve", "--world-size", "0"], {}, "from --world-size: must be >= 1"),
        (["resolve", "--nnodes", "3", "-n", "2"], {}, "nnodes 3 (from --nnodes) exceeds"),
        (["resolve", "--assume", "bad"], {}, "invalid --assume 'bad': expected KEY=VALUE"),
        (["resolve", "--assume", "cdua.available=1"], {}, "did you mean 'cuda.available'"),
        (["resolve", "--assume", "cuda.available=maybe"], {}, "from --assume cuda.available"),
        (["resolve", "--config", "missing.toml"], {}, "'missing.toml' from --config does not"),
        (["resolve", "--backend", "cdua"], {}, "did you mean 'cuda'?"),
        (
            [
                "resolve",
                "--backend",
                "xpu",
                "-n",
                "2",
                "--start-method",
                "fork",
                "--assume",
                "xpu.device_count=2",
            ],
            {},
            "rule of backend xpu, which allows only spawn",
        ),
        (
            [
                "resolve",
                "-n",
                "2",
                "--start-method",
                "spawn",
                "--assume",
                "main_guard=unguarded",
                *CPU_ONLY[:3],
            ],
            {},
            "(from --start-method)",
        ),
        (["resolve"], {"hwlaunch.toml": "world_size = 'x'\n"}, "from hwlaunch.toml:1"),
        (["resolve"], {"hwlaunch.toml": "[backends.cdua]\n"}, "did you mean 'cuda'?"),
        (["resolve"], {"hwlaunch.toml": "world_size = \n"}, "hwlaunch.toml:1:14: not valid TOML"),
    ],
)
def test_user_errors_exit_2_with_one_message(
    clean_env: Path, args: list[str], files: dict[str, str], message: str
) -> None:
    for name, text in files.items():
        (clean_env / name).write_text(text)
    result = run(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("hwlaunch: error: ")
    assert result.stderr.count("hwlaunch: error:") == 1
    assert message in result.stderr


def test_debug_shows_the_traceback(clean_env: Path) -> None:
    result = run("--debug", "resolve", "--executor", "foo")
    assert result.returncode == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert "hwlaunch.errors.ConfigError" in result.stderr
    assert "hwlaunch: error: invalid executor 'foo' from --executor" in result.stderr


def test_usage_error_exits_2_without_traceback(clean_env: Path) -> None:
    result = run("resolve", "--no-such-flag")
    assert result.returncode == 2
    assert "No such option" in result.stderr
    assert "Traceback" not in result.stderr


def test_backends_json(clean_env: Path) -> None:
    result = run("backends", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    by_name = {row["name"]: row for row in rows}
    assert {"cpu", "cuda", "hpu", "xpu"} <= set(by_name)
    for row in rows:
        assert set(row) == BACKEND_KEYS
    cpu = by_name["cpu"]
    assert cpu["available"] is True
    assert cpu["distribution"] == "hwlaunch"
    assert cpu["error"] is None
    assert cpu["dist_backend"] == "gloo"
    assert cpu["ray_resource"] == "CPU"
    assert by_name["cuda"]["start_methods"] == {
        "allowed": ["fork", "spawn", "forkserver"],
        "default": "fork",
    }
    assert by_name["cuda"]["device_control_env_var"] == "CUDA_VISIBLE_DEVICES"
    assert by_name["xpu"]["start_methods"] == {"allowed": ["spawn"], "default": "spawn"}
    assert by_name["hpu"]["start_methods"]["default"] == "spawn"
    assert by_name["hpu"]["ray_resource"] == "HPU"
    # The built-in rules' device binding (docs/rules.md's table), and each plugin's contract.
    bindings = {name: by_name[name]["device_binding"] for name in ("cpu", "cuda", "hpu", "xpu")}
    assert bindings == {"cpu": "none", "cuda": "per_worker", "hpu": "per_worker", "xpu": "job_wide"}
    noset = by_name["cuda"]["ray_noset_visibility_var"]
    assert noset == "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
    assert {row["contract"] for row in rows} == {hwlaunch.CONTRACT_VERSION}


def test_backends_table(clean_env: Path) -> None:
    result = run("backends")
    assert result.returncode == 0, result.stderr
    for name in ("cpu", "cuda", "hpu", "xpu", "CUDA_VISIBLE_DEVICES", "[spawn]"):
        assert name in result.stdout


def test_module_entry_point(clean_env: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hwlaunch.cli", "resolve", "--json", *CPU_ONLY],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["executor"] == "uni"


# -- no torch on the import path -------------------------------------------------------------
PROBE = textwrap.dedent(
    """
    import json, sys
    {body}
    heavy = sorted(m for m in ("torch", "ray", "numpy", "habana_frameworks",
                               "intel_extension_for_pytorch") if m in sys.modules)
    print("RESULT " + json.dumps(heavy))
    """
)


def probe(body: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(body=textwrap.dedent(body))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    line = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")][-1]
    heavy: list[str] = json.loads(line.removeprefix("RESULT "))
    return heavy


def test_import_hwlaunch_imports_no_torch() -> None:
    assert probe("import hwlaunch") == []


def test_import_hwlaunch_importtime_lists_no_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import hwlaunch"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    modules = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()]
    assert "hwlaunch" in modules
    assert not [m for m in modules if m == "torch" or m.startswith("torch.")]


@pytest.mark.parametrize(
    "argv",
    [["backends"], ["backends", "--json"], ["resolve", "--json"], ["resolve", "-n", "2"]],
    ids=" ".join,
)
def test_cli_commands_import_no_torch(argv: list[str]) -> None:
    body = f"""
    import contextlib, io
    from hwlaunch.cli import main
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main({argv!r})
    assert rc == 0, rc
    """
    assert probe(body) == []


def test_main_returns_exit_codes_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    from hwlaunch.cli import main

    assert main(["resolve", "--json", *CPU_ONLY]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert data["backend"] == "cpu"
    assert main(["resolve", "--start-method", "vfork"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("hwlaunch: error: invalid start_method 'vfork'")
    assert "did you mean 'fork'" in captured.err
