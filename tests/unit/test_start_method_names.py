"""No code branches on a start method's name: outside ``hwlaunch._start_methods``, core/hwlaunch
asks the start method objects (``copies_parent``, ``reimports_main``, ``fork_server``) and never
compares ``"fork"``, ``"spawn"`` or ``"forkserver"`` (``==``, ``!=``, ``in``, ``match``/``case``,
a dict keyed by them, or ``== FORK.name``). Names stay strings only as data: rules, settings, JSON.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hwlaunch._start_methods import START_METHODS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "core" / "hwlaunch"
OWNER = PACKAGE / "_start_methods.py"
KIND_NAMES = {"FORK", "SPAWN", "FORKSERVER"}


def _is_name(node: ast.AST) -> bool:
    """A start method's name as a literal, or a literal tuple, list or set holding one."""
    if isinstance(node, ast.Constant):
        return node.value in START_METHODS
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_name(item) for item in node.elts)
    return False


def _is_kind_name(node: ast.AST) -> bool:
    """``FORK.name`` and the like: the object's name, compared as a string."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "name"
        and isinstance(node.value, ast.Name)
        and node.value.id in KIND_NAMES
    )


def _pattern_names(pattern: ast.pattern) -> bool:
    if isinstance(pattern, ast.MatchValue):
        return _is_name(pattern.value)
    if isinstance(pattern, ast.MatchOr):
        return any(_pattern_names(p) for p in pattern.patterns)
    return False


def name_comparisons(source: str, filename: str = "<source>") -> list[int]:
    """The lines of ``source`` that compare or look up a start method by its name."""
    lines = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            equality = all(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops)
            if any(_is_name(o) for o in operands) or (
                equality and any(_is_kind_name(o) for o in operands)
            ):
                lines.append(node.lineno)
        elif isinstance(node, ast.match_case) and _pattern_names(node.pattern):
            lines.append(node.pattern.lineno)
        elif isinstance(node, ast.Dict) and any(k is not None and _is_name(k) for k in node.keys):
            lines.append(node.lineno)
    return sorted(lines)


@pytest.mark.parametrize(
    "snippet",
    [
        'if plan.start_method == "fork": pass',
        'if method != "spawn": pass',
        'ok = method in ("spawn", "forkserver")',
        'ok = "fork" not in rule.allowed',
        'match method:\n    case "forkserver":\n        pass',
        'match method:\n    case "fork" | "spawn":\n        pass',
        'how = {"fork": 1, "spawn": 2}[method]',
        "same = plan.start_method == FORK.name",
    ],
)
def test_the_check_finds_each_form(snippet: str) -> None:
    assert name_comparisons(snippet) != [], snippet


@pytest.mark.parametrize(
    "snippet",
    [
        "if kind.copies_parent: pass",
        "print(f\"start method 'fork' cannot work\")",
        "ok = FORK.name in rule.allowed",
        "ok = method in START_METHODS",
        'run("mp", FORK.name)',
    ],
)
def test_the_check_leaves_data_and_questions_alone(snippet: str) -> None:
    assert name_comparisons(snippet) == [], snippet


def test_no_start_method_name_is_compared_outside_its_objects() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != OWNER
        for line in name_comparisons(path.read_text(encoding="utf-8"), str(path))
    ]
    assert found == [], (
        "start-method names compared outside hwlaunch._start_methods (ask the object: "
        f"plan.start_kind.copies_parent, .reimports_main, .fork_server): {found}"
    )
