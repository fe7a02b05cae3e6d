"""The layering the design promises, checked on the code itself: worker-side code loads no
planning or CLI module, and no function in core/hwlaunch/, plugins/, benchmarks/, examples/
or tests/ is longer than 60 lines."""

from __future__ import annotations

import ast
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import hwlaunch

ROOT = Path(__file__).resolve().parents[2]
MAX_FUNCTION_LINES = 60

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


def long_functions() -> list[str]:
    found = []
    package = ROOT / "core" / "hwlaunch"
    core = [p for p in package.rglob("*.py") if not p.is_relative_to(package / "plugins")]
    others = [
        p
        for folder in ("plugins", "benchmarks", "examples", "tests")
        for p in ROOT.glob(f"{folder}/**/*.py")
    ]
    for path in sorted([*core, *others]):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    found.append(f"{where} {node.name} ({length} lines)")
    return found


def test_no_function_is_longer_than_60_lines() -> None:
    assert long_functions() == []
