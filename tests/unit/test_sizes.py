"""Every function of core/hwlaunch reads at once and every class can be held in mind: no
function (or method) over 60 lines, no class over 300, counted from its ``def`` or ``class``
line to its last line, docstring and comments included.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "core" / "hwlaunch"
LIMITS = {ast.FunctionDef: 60, ast.AsyncFunctionDef: 60, ast.ClassDef: 300}


def oversized(source: str, filename: str = "<source>") -> list[str]:
    """``name (kind, N lines, line L)`` for each definition in ``source`` over its limit."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        limit = LIMITS.get(type(node))
        if limit is None:
            continue
        assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        size = (node.end_lineno or node.lineno) - node.lineno + 1
        if size > limit:
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            found.append(f"{node.name} ({kind}, {size} lines > {limit}, line {node.lineno})")
    return found


def test_no_function_over_60_lines_and_no_class_over_300() -> None:
    found = [
        f"{path.relative_to(ROOT)}: {entry}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for entry in oversized(path.read_text(), str(path))
    ]
    assert not found, "split these:\n" + "\n".join(found)


def test_the_check_finds_an_oversized_function_and_class() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    function = f"def long():\n{body}\n"
    methods = "\n".join(f"    def m{i}(self):\n        return {i}\n" for i in range(101))
    cls = f"class Big:\n{methods}"
    assert oversized(function) == ["long (function, 61 lines > 60, line 1)"]
    assert oversized(cls) == ["Big (class, 303 lines > 300, line 1)"]
    assert oversized("def short():\n    return 1\n") == []
