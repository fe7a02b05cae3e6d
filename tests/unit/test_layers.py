"""The layering the design promises, checked on the code itself: worker-side code loads no
planning or CLI module, every executor module sits on a side of the driver/worker wall that
import-linter holds, no function in core/hwlaunch/, plugins/, benchmarks/, examples/ or tests/
is longer than 60 lines, and no class in core/hwlaunch/ longer than 300."""

from __future__ import annotations

import ast
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import hwlaunch

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 300

WORKER_SIDE = """
import json, pickle, sys
plan = pickle.loads(sys.stdin.buffer.read())
import hwlaunch.executor._runtime, hwlaunch.executor.mp._child, hwlaunch.executor.ray._actor
import hwlaunch.worker
print(json.dumps({
    "backend": plan.backend,
    "guard": plan.facts.main_guard.status,
    "loaded": sorted(m for m in sys.modules
                     if m.startswith(("hwlaunch.planning", "hwlaunch.cli", "click", "pluggy"))),
}))
"""


@pytest.mark.usefixtures("clean_env")
def test_a_pickled_plan_loads_no_planning_in_the_worker() -> None:
    plan = hwlaunch.resolve(backend="cpu", world_size=2, assume={"main_guard": "unguarded"})
    done = subprocess.run(
        [sys.executable, "-c", WORKER_SIDE],
        input=pickle.dumps(plan),
        capture_output=True,
        timeout=120,
        check=True,
    )
    found = json.loads(done.stdout)
    assert found["backend"] == "cpu" and found["guard"] == "unguarded"
    assert found["loaded"] == [], "worker-side code imported planning or CLI modules"


def long_definitions(paths: list[Path], kinds: type | tuple[type, ...], limit: int) -> list[str]:
    """``file:line name (N lines)`` for each definition of ``kinds`` over ``limit`` lines."""
    found = []
    for path in sorted(paths):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, kinds):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    found.append(f"{where} {node.name} ({length} lines)")
    return found


def long_functions() -> list[str]:
    package = ROOT / "core" / "hwlaunch"
    core = [p for p in package.rglob("*.py") if not p.is_relative_to(package / "plugins")]
    others = [
        p
        for folder in ("plugins", "benchmarks", "examples", "tests")
        for p in ROOT.glob(f"{folder}/**/*.py")
    ]
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    return long_definitions([*core, *others], functions, MAX_FUNCTION_LINES)


def test_no_function_is_longer_than_60_lines() -> None:
    assert long_functions() == []


def test_no_class_is_longer_than_300_lines() -> None:
    paths = list((ROOT / "core" / "hwlaunch").rglob("*.py"))
    assert long_definitions(paths, ast.ClassDef, MAX_CLASS_LINES) == []


# Executor modules on neither side of the wall: both sides use them (the transport and the mp
# channels, __main__'s handling, the process tree, Ray's import and lifeline), or the module
# hosts a worker in the driver's process.
SHARED = {
    "hwlaunch.executor",
    "hwlaunch.executor.mp",
    "hwlaunch.executor.ray",
    "hwlaunch.executor._main_refs",
    "hwlaunch.executor._mainprep",
    "hwlaunch.executor._ports",
    "hwlaunch.executor.mp._pipe_channel",
    "hwlaunch.executor.mp._process_tree",
    "hwlaunch.executor.mp._shm_channel",
    "hwlaunch.executor.mp._shm_wait",
    "hwlaunch.executor.ray._cluster",
    "hwlaunch.executor.ray._lifeline",
}


def test_every_executor_module_has_its_side_of_the_wall() -> None:
    """A new module under executor/ is put on the worker side or the driver side of the
    import-linter contract (or named shared here), so the wall keeps covering all of them."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (wall,) = [c for c in config["tool"]["importlinter"]["contracts"] if "driver side" in c["name"]]
    sides = [*wall["source_modules"], *wall["forbidden_modules"]]
    folder = ROOT / "core" / "hwlaunch" / "executor"
    modules = {
        ".".join(("hwlaunch", *path.relative_to(folder.parent).with_suffix("").parts)).removesuffix(
            ".__init__"
        )
        for path in folder.rglob("*.py")
    }
    placed = {m for m in modules if any(m == s or m.startswith(s + ".") for s in sides)}
    assert sorted(modules - placed - SHARED) == []
    assert sorted(SHARED - modules) == [], "SHARED names modules that no longer exist"
