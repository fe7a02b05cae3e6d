"""A plan is decided once: the rules and the plugins' proposals write a draft
(``planning.drafting.Draft``) and ``Draft.freeze`` makes the Plan. No planning code makes a
Plan elsewhere or rewrites one with ``dataclasses.replace``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLANNING = ROOT / "core" / "hwlaunch" / "planning"
FREEZER = PLANNING / "drafting.py"


def plan_rewrites(source: str) -> list[int]:
    """Lines that make a Plan, or call ``replace`` on something named ``plan``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        first = node.args[0] if node.args else None
        target = getattr(first, "id", None) or getattr(first, "attr", None)
        if name == "Plan" or (name == "replace" and target == "plan"):
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize(
    ("snippet", "found"),
    [
        ("p = Plan(backend='cpu')", True),
        ("p = replace(plan, preload=())", True),
        ("p = dataclasses.replace(self.plan, env={})", True),
        ("f = replace(facts, devices={})", False),
    ],
)
def test_the_check_finds_a_plan_made_again(snippet: str, found: bool) -> None:
    assert bool(plan_rewrites(snippet)) is found


def test_planning_makes_a_plan_only_by_freezing_its_draft() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted(PLANNING.rglob("*.py"))
        if path != FREEZER
        for line in plan_rewrites(path.read_text(encoding="utf-8"))
    ]
    assert found == [], f"a Plan made or rewritten outside Draft.freeze: {found}"
